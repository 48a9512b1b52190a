"""The dtypes a target is validated in, by their torch names, and what the checks need to know of each:
all read off pitcheck.formats (one dtype vocabulary for the whole package)."""
from __future__ import annotations

from ..formats import format_of_dtype, validator_dtypes

DTYPES = validator_dtypes()  # float64, float32, bfloat16, float16
# unit roundoff u = 2^-p of each dtype a target may be asked for
UNIT_ROUNDOFF = {name: format_of_dtype(name).u for name in DTYPES}
# significand bits p, the implicit bit included
WIDTH = {name: format_of_dtype(name).p for name in DTYPES}
FP32_U = UNIT_ROUNDOFF["float32"]
# the half-precision dtypes: finite differences cannot resolve a derivative in them
HALF = tuple(name for name in DTYPES if WIDTH[name] < WIDTH["float32"])


def _narrower(name: str) -> tuple[str, ...]:
    """The largest other dtypes whose values are all values of `name` (a value computed in one of them and
    cast up is exact in it); those held by another of them are implied by it."""
    wide = format_of_dtype(name)
    held = [d for d in DTYPES if d != name and wide.holds(format_of_dtype(d))]
    return tuple(d for d in held if not any(o != d and format_of_dtype(o).holds(format_of_dtype(d)) for o in held))


NARROWER = {name: _narrower(name) for name in DTYPES}
