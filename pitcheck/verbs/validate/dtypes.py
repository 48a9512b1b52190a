"""The dtypes a target is validated in, by their torch names, and what the checks need to know of each:
all read off pitcheck.numerics.formats (one dtype vocabulary for the whole package)."""
from __future__ import annotations

from ...infra.errors import PitcheckError
from ...numerics.formats import format_of_dtype, validator_dtypes

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

# the narrow element dtypes torch names beyond pitcheck.numerics.formats' (the fnuz variants: one NaN, no -0;
# E2M1 packed two to a byte); E8M0 (float8_e8m0fnu) holds scales, not values, and has no entry
_NARROW_ELEMENT_BITS = {"float8_e4m3fnuz": 4, "float8_e5m2fnuz": 3, "float4_e2m1fn_x2": 2}


def element_bits(dtype_name: str) -> int | None:
    """Significand bits p of the values a torch dtype holds, the 8- and 4-bit element types included; None
    for a dtype that holds no floating values of its own (integers, E8M0 scales)."""
    if dtype_name in _NARROW_ELEMENT_BITS:
        return _NARROW_ELEMENT_BITS[dtype_name]
    try:
        return format_of_dtype(dtype_name).p
    except PitcheckError:
        return None


def unit_roundoff(dtype_name: str) -> float:
    """u = 2^-p of any floating torch dtype a target may store a tensor in, the 8- and 4-bit ones included
    (a target asked for float32 may keep a float8 copy of its memory)."""
    if dtype_name in UNIT_ROUNDOFF:
        return UNIT_ROUNDOFF[dtype_name]
    bits = element_bits(dtype_name)
    if bits is None:
        raise PitcheckError(f"{dtype_name} holds no floating values")
    return 2.0 ** -bits


def narrow_dtype_refusal(dtype_name: str) -> str | None:
    """Why validating in an 8- or 4-bit dtype is refused (None for any other name)."""
    bits = element_bits(dtype_name)
    if bits is None or bits >= WIDTH["bfloat16"] or dtype_name in DTYPES:
        return None
    return (f"validate does not run in {dtype_name}: its u = 2^-{bits} makes every check's bound (16 u) larger than "
            "0.1, where no check can tell right from wrong; validate in the dtype of the module's masters "
            f"({', '.join(DTYPES)}): the contract check fails any tensor stored in an 8- or 4-bit format, "
            "block-scaled wrappers included")
