"""Floating-point formats: significand bits, unit roundoff u = 2^-p, range, and rounding emulation.

Rounding is emulated from float64 (numpy) or from float32/float64 (torch) by scaling to an integer
significand and rounding there, so each result is one correct rounding of the input: no double rounding.

The 8- and 4-bit element formats follow the OCP 8-bit floating point (OFP8) and microscaling (MX v1.0)
specifications: fp8-e4m3 is E4M3 "fn" (no infinities, one NaN pattern, max 448), fp8-e5m2 is IEEE-like
(infinities, max 57344), fp4-e2m1 is E2M1 (no infinities and no NaN, max 6). OFP8 defines two
conversion modes for values beyond the largest finite one: non-saturating (overflow gives NaN in E4M3,
infinity in E5M2) and saturating (overflow and infinities give the signed largest finite value, the
"satfinite" casts of the scaling recipes). round_to defaults to non-saturating, which is what ml_dtypes
does (so the element casts are tested bit for bit against it); saturate=True gives the other. E2M1
has nothing to overflow to, so it always saturates. The E8M0 scale format (unsigned powers of two
2^-127..2^127, code 0xFF is NaN) has no sign, zero or significand and is not an element format: see
e8m0_encode / e8m0_decode.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from ..infra.errors import PitcheckError


@dataclass(frozen=True)
class Format:
    name: str
    p: int  # significand bits including the implicit bit
    emax: int  # largest exponent of a normal number
    emin: int  # smallest exponent of a normal number
    has_inf: bool = True
    # False for a format with no NaN encoding either (E2M1): out-of-range values can only saturate
    has_nan: bool = True
    # largest finite value; None means the IEEE value (2 - 2^(1-p)) 2^emax
    max_finite: float | None = None
    # the dtype of this format by its name in torch (also the validator's --dtype name: its targets are
    # torch modules) and in numpy, or in ml_dtypes for what numpy lacks; None where there is no such dtype
    # (tf32 is a matmul mode, torch's E2M1 dtype packs two elements in a byte)
    torch_name: str | None = None
    numpy_name: str | None = None

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

    def holds(self, other: Format) -> bool:
        """Whether every finite value of `other` is a value of this format: no more significand bits, a
        quantum no finer at the bottom of the range, and no larger a largest value."""
        return other.p <= self.p and other.emin - other.p >= self.emin - self.p and other.max <= self.max

    def torch_dtype(self):
        """This format's torch dtype (torch imported here: the numerics stay importable without it)."""
        import torch

        if self.torch_name is None:
            raise PitcheckError(f"format {self.name} has no torch dtype")
        return getattr(torch, self.torch_name)

    def numpy_dtype(self) -> np.dtype:
        """This format's numpy dtype; ml_dtypes' (an optional dependency, imported here) where numpy has none."""
        if self.numpy_name is None:
            raise PitcheckError(f"format {self.name} has no numpy dtype")
        if hasattr(np, self.numpy_name):
            return np.dtype(self.numpy_name)
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, self.numpy_name))


FORMATS: dict[str, Format] = {
    f.name: f
    for f in [
        Format("fp64", 53, 1023, -1022, torch_name="float64", numpy_name="float64"),
        Format("fp32", 24, 127, -126, torch_name="float32", numpy_name="float32"),
        Format("tf32", 11, 127, -126),
        Format("fp16", 11, 15, -14, torch_name="float16", numpy_name="float16"),
        Format("bf16", 8, 127, -126, torch_name="bfloat16", numpy_name="bfloat16"),
        # OCP e4m3 "fn": no infinities, one NaN pattern, so its largest finite value is 448
        Format("fp8-e4m3", 4, 8, -6, has_inf=False, max_finite=448.0, torch_name="float8_e4m3fn",
               numpy_name="float8_e4m3fn"),
        Format("fp8-e5m2", 3, 15, -14, torch_name="float8_e5m2", numpy_name="float8_e5m2"),
        # OCP MX E2M1: values 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives
        Format("fp4-e2m1", 2, 2, 0, has_inf=False, has_nan=False, max_finite=6.0, numpy_name="float4_e2m1fn"),
    ]
}

# the formats `pitcheck validate --dtype` takes, in the order it lists them (by their torch names)
VALIDATED = ("fp64", "fp32", "bf16", "fp16")


def validator_dtypes() -> tuple[str, ...]:
    """The validator's dtype names: float64, float32, bfloat16, float16."""
    return tuple(FORMATS[name].torch_name for name in VALIDATED)


def format_of_dtype(dtype_name: str) -> Format:
    """The format whose torch dtype is called `dtype_name` ('bfloat16' -> bf16)."""
    for fmt in FORMATS.values():
        if fmt.torch_name == dtype_name:
            return fmt
    raise PitcheckError(f"no format has the dtype {dtype_name!r}")


def get_format(name: str) -> Format:
    try:
        return FORMATS[name]
    except KeyError:
        raise PitcheckError(f"unknown format {name!r}; choose from {', '.join(FORMATS)}") from None


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


def round_to(x, fmt: Format | str, mode: str = "nearest", rng=None, saturate: bool = False):
    """Round every entry of x to the nearest value of `fmt` (ties to even), returned in x's dtype (float64 under
    stochastic rounding with a numpy Generator, whose float64 noise the sum takes, as numpy's own sum does).

    mode="stochastic" rounds up with probability equal to the fractional distance (unbiased);
    it needs `rng`: a numpy Generator (or RandomState), or for torch input a torch Generator or a numpy one
    (whose float64 draws, made on the host, are copied to the tensor's device: the same noise, and so the same
    bits, as numpy's; the sum is then float64, as numpy's is).
    Overflow gives +-inf, or NaN for formats without infinities (as ml_dtypes does: OFP8's
    non-saturating mode); saturate=True (OFP8's saturating mode) gives the signed largest finite
    value instead, for infinities too, and a format with no NaN (E2M1) always saturates. NaN stays NaN
    in every format (ml_dtypes turns NaN into -0 in E2M1; a silent zero would hide a failure).
    The input dtype must carry more significand bits than fmt, so x itself is exact.
    """
    if isinstance(fmt, str):
        fmt = get_format(fmt)
    if mode not in ("nearest", "stochastic"):
        raise PitcheckError(f"unknown rounding mode {mode!r}; choose nearest or stochastic")
    if _is_torch(x):
        import torch as xp

        def uniform(s):
            if not isinstance(rng, xp.Generator):  # numpy's: its float64 draws, added in float64 as numpy adds them
                return xp.from_numpy(rng.random(s.shape)).to(device=s.device)
            return xp.rand(s.shape, generator=rng, dtype=s.dtype, device=s.device)

        rint = xp.round  # half to even
        lib = "torch.Generator or a numpy Generator"
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
    if saturate or not fmt.has_nan:
        big = xp.copysign(full_like(y, fmt.max), x_finite)
        rest = where(xp.isinf(x), xp.copysign(full_like(x, fmt.max), x), x)  # NaN stays NaN
    elif fmt.has_inf:
        big = xp.copysign(full_like(y, float("inf")), y)
        rest = x  # infinities pass through
    else:  # no infinity to pass through or overflow to (as ml_dtypes does)
        big = full_like(y, float("nan"))
        rest = full_like(x, float("nan"))
    y = where(xp.abs(y) > fmt.max, big, y)
    return where(finite, y, rest)


# E8M0: an unsigned power of two 2^(code - 127), code 0..254, and code 255 is NaN (OCP MX v1.0)
E8M0_BIAS = 127
E8M0_NAN = 255
E8M0_ROUNDINGS = ("nearest", "floor", "ceil")


def e8m0_encode(x, rounding: str = "nearest") -> np.ndarray:
    """E8M0 codes (uint8) of positive values: the exponent of the nearest power of two (linear
    distance, a tie 1.5 2^k going up, as ml_dtypes does for every normal float32), of the power of
    two at or below ("floor", the OCP MX scale rule) or at or above ("ceil", NVIDIA's RCEIL).
    Values below 2^-127 give 2^-127 (code 0); values above 2^127 that do not round to it, zero,
    negatives, infinities and NaN give NaN (code 255)."""
    if rounding not in E8M0_ROUNDINGS:
        raise PitcheckError(f"unknown E8M0 rounding {rounding!r}; choose from {', '.join(E8M0_ROUNDINGS)}")
    x = np.asarray(x, dtype=np.float64)
    positive = np.logical_and(np.isfinite(x), x > 0)
    m, e = np.frexp(np.where(positive, x, 1.0))  # x = (2m) 2^(e - 1), 1 <= 2m < 2
    k = e - 1
    if rounding == "nearest":
        k = k + (m >= 0.75)
    elif rounding == "ceil":
        k = k + (m > 0.5)
    code = np.maximum(k, -E8M0_BIAS) + E8M0_BIAS
    code = np.where(np.logical_and(positive, code < E8M0_NAN), code, E8M0_NAN)
    return code.astype(np.uint8)


def e8m0_decode(codes) -> np.ndarray:
    """The float64 values 2^(code - 127) of E8M0 codes; code 255 is NaN. A uint8 tensor's values are a
    float64 tensor on its device."""
    if _is_torch(codes):
        import torch

        if codes.dtype != torch.uint8:
            raise PitcheckError(f"E8M0 codes are uint8, got {codes.dtype}")
        values = torch.ldexp(torch.ones(codes.shape, dtype=torch.float64, device=codes.device),
                             codes.long() - E8M0_BIAS)
        return values.where(codes != E8M0_NAN, float("nan"))
    codes = np.asarray(codes)
    if codes.dtype != np.uint8:
        raise PitcheckError(f"E8M0 codes are uint8, got {codes.dtype}")
    values = np.ldexp(1.0, codes.astype(np.int64) - E8M0_BIAS)
    return np.where(codes == E8M0_NAN, np.nan, values)


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
