"""Floating-point formats: significand bits, unit roundoff u = 2^-p, range, and rounding emulation.

Rounding is emulated from float64 (numpy) or from float32/float64 (torch) by scaling to an integer
significand and rounding there, so each result is one correct rounding of the input: no double rounding.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from .errors import PitcheckError


@dataclass(frozen=True)
class Format:
    name: str
    p: int  # significand bits including the implicit bit
    emax: int  # largest exponent of a normal number
    emin: int  # smallest exponent of a normal number
    has_inf: bool = True
    # largest finite value; None means the IEEE value (2 - 2^(1-p)) 2^emax
    max_finite: float | None = None

    @property
    def u(self) -> float:
        """Unit roundoff 2^-p (half of numpy's finfo.eps)."""
        return 2.0 ** (-self.p)

    @property
    def max(self) -> float:
        if self.max_finite is not None:
            return self.max_finite
        return (2.0 - 2.0 ** (1 - self.p)) * 2.0 ** self.emax

    @property
    def tiny(self) -> float:
        """Smallest positive normal number."""
        return 2.0 ** self.emin

    @property
    def smallest_subnormal(self) -> float:
        return 2.0 ** (self.emin - self.p + 1)


FORMATS: dict[str, Format] = {
    f.name: f
    for f in [
        Format("fp64", 53, 1023, -1022),
        Format("fp32", 24, 127, -126),
        Format("tf32", 11, 127, -126),
        Format("fp16", 11, 15, -14),
        Format("bf16", 8, 127, -126),
        # OCP e4m3 "fn": no infinities, one NaN pattern, so its largest finite value is 448
        Format("fp8-e4m3", 4, 8, -6, has_inf=False, max_finite=448.0),
        Format("fp8-e5m2", 3, 15, -14),
    ]
}


def get_format(name: str) -> Format:
    try:
        return FORMATS[name]
    except KeyError:
        raise PitcheckError(f"unknown format {name!r}; choose from {', '.join(FORMATS)}") from None


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


def round_to(x, fmt: Format | str, mode: str = "nearest", rng=None):
    """Round every entry of x to the nearest value of `fmt` (ties to even), returned in x's dtype.

    mode="stochastic" rounds up with probability equal to the fractional distance (unbiased);
    it needs `rng` (a numpy Generator, or a torch Generator for torch input).
    Overflow gives +-inf, or NaN for formats without infinities (as ml_dtypes does).
    The input dtype must carry more significand bits than fmt, so x itself is exact.
    """
    if isinstance(fmt, str):
        fmt = get_format(fmt)
    if mode not in ("nearest", "stochastic"):
        raise PitcheckError(f"unknown rounding mode {mode!r}; choose nearest or stochastic")
    if _is_torch(x):
        import torch as xp

        def uniform(s):
            return xp.rand(s.shape, generator=rng, dtype=s.dtype, device=s.device)

        rint = xp.round  # half to even
        lib = "torch.Generator"
    else:
        xp = np
        x = np.asarray(x)

        def uniform(s):
            return rng.random(s.shape)

        rint = np.rint  # half to even
        lib = "numpy Generator"
    if mode == "stochastic":
        if rng is None:
            raise PitcheckError(f"stochastic rounding needs a {lib}")

        def rint(s):
            return xp.floor(s + uniform(s))

    where, full_like = xp.where, xp.full_like
    finite = xp.isfinite(x)
    # frexp: x = m 2^e with 0.5 <= |m| < 1, so a normal number of fmt has e - 1 >= emin.
    x_finite = where(finite, x, 0.0)
    _, e = xp.frexp(x_finite)
    e = where(e > fmt.emin + 1, e, fmt.emin + 1)  # below the normal range the quantum stays fixed
    shift = fmt.p - e  # quantum is 2^(e - p)
    y = xp.ldexp(rint(xp.ldexp(x_finite, shift)), -shift)
    overflow = xp.abs(y) > fmt.max
    big = xp.copysign(full_like(y, float("inf")), y) if fmt.has_inf else full_like(y, float("nan"))
    y = where(overflow, big, y)
    # infinities pass through, except into a format that has none (as ml_dtypes does)
    return where(finite, y, x if fmt.has_inf else full_like(x, float("nan")))


@functools.lru_cache(maxsize=None)
def overflow_threshold(format_name: str) -> float | None:
    """The smallest float64 magnitude that rounds to infinity in this format (RNE: the largest finite
    value plus half its spacing), checked against round_to itself; None where that rule does not apply."""
    fmt = FORMATS[format_name]
    if not fmt.has_inf or fmt.max_finite is not None:
        return None
    with np.errstate(over="ignore"):
        threshold = np.float64(fmt.max) + np.float64(2.0) ** (fmt.emax - fmt.p)
    below = np.nextafter(threshold, 0.0)
    rounds = round_to(np.array([threshold, below]), fmt)
    return float(threshold) if not np.isfinite(rounds[0]) and np.isfinite(rounds[1]) else None
