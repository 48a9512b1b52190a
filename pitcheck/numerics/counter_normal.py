"""Standard normals from a counter-based generator, the same bits on any device: Philox4x32-10 in int64.

Why counter-based: a normal is a pure function of (seed, step, index, element), so a step's draw needs no
generator state (resume is free), a batch of cells draws its streams independently, and any slice of rows
can be drawn alone (a shard draws only its rows). Why int64 and no transcendental library call: torch has no
uint64 multiply on CUDA, and its float64 log/sin/cos/sqrt differ between CPU builds and CUDA (torch 2.13's
AVX512 float64 sqrt is not even correctly rounded: 1.4% of random inputs come out an ulp off). Everything
here is integer arithmetic, exact conversions and IEEE-rounded +, -, *, / (one rounding each: every op is its
own torch kernel, so nothing is fused), so a draw has the same bits on any CPU, on CUDA, and in
tests/counter_normal_reference.py's numpy. counter_normal_fused draws the same bits on CUDA as one Triton kernel.

The stream of (seed, step, index) over `shape`, row-major element n:
  * Philox4x32-10 (Salmon et al., SC'11; Random123's philox4x32_R with R = 10) with key (seed, index) and
    counter (n // 2 mod 2^32, n // 2 >> 32, step mod 2^32, step >> 32) gives words x0..x3;
  * (x0, x1) and (x2, x3) each give a uniform on {1, 3, ..., 2^53 - 1} / 2^53: j = x_hi << 20 | x_lo >> 12
    (52 random bits), u = (2j + 1) * 2^-53. Every value is exact and strictly inside (0, 1); an evenly spaced
    grid of 2^53 values cannot be (its midpoints above 1/2 need 54 bits and the top one rounds to 1.0), so
    the lowest bit is fixed at 1 (Random123's u01fixedpt for a double);
  * Box-Muller, both outputs: r = sqrt(-2 ln u1), theta = 2 pi u2; element 2b is r cos theta, 2b + 1 is
    r sin theta. ln is e ln 2 + 2 atanh((m - 1) / (m + 1)) (m in [sqrt(1/2), sqrt(2)), Taylor series to
    z^9/19); cos and sin are Taylor polynomials on [0, pi/4] after an exact quadrant and octant reduction of
    u2's integer; sqrt is 4 Newton steps from an exponent-halving guess. Each is within ~1 ulp of libm.
"""
from __future__ import annotations

import math
import operator
from fractions import Fraction

import torch

from ..infra.errors import PitcheckError

MASK32 = 0xFFFFFFFF
PHILOX_M0, PHILOX_M1 = 0xD2511F53, 0xCD9E8D57  # round multipliers
PHILOX_W0, PHILOX_W1 = 0x9E3779B9, 0xBB67AE85  # key increments (Weyl sequence)
PHILOX_ROUNDS = 10

# blocks (4 words, 2 normals) drawn per pass: a few MB of int64 temporaries on the CPU (its caches), larger on
# CUDA (fewer kernel launches). A block's value does not depend on the pass it is drawn in.
CHUNK_BLOCKS = {"cpu": 1 << 15, "cuda": 1 << 22}

TWO_PI = math.tau  # 2 pi rounded to float64
LN2_HI = float.fromhex("0x1.62e42fee00000p-1")  # ln 2 split (fdlibm's): e * LN2_HI is exact for |e| < 2^11
LN2_LO = float.fromhex("0x1.a39ef35793c76p-33")
SQRT2 = math.sqrt(2.0)
# series coefficients, each the float64 nearest the exact rational
LOG_COEFFS = tuple(float(Fraction(2, 2 * k + 1)) for k in range(1, 10))  # R / z = 2/3 + 2z/5 + ... (log_unit)
SIN_COEFFS = tuple(float(Fraction((-1) ** k, math.factorial(2 * k + 1))) for k in range(1, 9))
COS_COEFFS = tuple(float(Fraction((-1) ** k, math.factorial(2 * k))) for k in range(1, 9))
NEWTON_STEPS = 4  # from a 6% guess: 2e-3, 2e-6, 1e-12, then rounding's ulp
SQRT_MAGIC = 1023 << 51  # (bits >> 1) + this halves a double's exponent: sqrt to within 6%
EXP_MASK, FRACTION_MASK, ONE_BITS = 0x7FF, (1 << 52) - 1, 1023 << 52


def _word(name: str, value, limit: int) -> int:
    """value as an int in [0, limit), else a one-line PitcheckError (bools and floats are refused)."""
    bound = f"[0, 2^{limit.bit_length() - 1})"
    try:
        if isinstance(value, bool):
            raise TypeError
        value = operator.index(value)
    except TypeError:
        raise PitcheckError(f"{name} must be an integer in {bound}, got {value!r}") from None
    if not 0 <= value < limit:
        raise PitcheckError(f"{name} must be in {bound}, got {value}")
    return value


def _mulhilo(a: torch.Tensor, m_lo: torch.Tensor, m_hi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(high, low) 32-bit words of a * m for words a < 2^32 and m = m_hi 2^16 + m_lo: a m_lo and a m_hi are
    below 2^48 and every sum below 2^49, so no int64 overflows (CUDA has no uint64 multiply)."""
    t = a * m_lo
    u = (a * m_hi).add_(t >> 16)  # a m >> 16
    hi = u >> 16
    lo = torch.add(t.bitwise_and_(0xFFFF), u.bitwise_and_(0xFFFF), alpha=1 << 16)
    return hi, lo


def philox4x32(counter: torch.Tensor, key: tuple[int, int], rounds: int = PHILOX_ROUNDS) -> torch.Tensor:
    """Philox4x32-`rounds` of each column of `counter` (4 x n int64, words in [0, 2^32)) under `key` (two
    words): 4 x n int64 words, Random123's philox4x32_R bit for bit.

    A round multiplies x0 by M0 and x2 by M1 (one 2 x n product), then x0, x1, x2, x3 <- hi(x2 M1) ^ x1 ^ k0,
    lo(x2 M1), hi(x0 M0) ^ x3 ^ k1, lo(x0 M0). Rather than permute rows, each round takes its rows in the
    order the last one left them: (x0, x2) and (x1, x3) after an even number of rounds, (x2, x0) and
    (x3, x1) after an odd one."""
    k0, k1 = key
    dev = counter.device
    mults = torch.tensor([PHILOX_M0, PHILOX_M1], dtype=torch.int64, device=dev).reshape(2, 1)
    m_lo, m_hi = [mults & 0xFFFF, mults.flip(0) & 0xFFFF], [mults >> 16, mults.flip(0) >> 16]
    # round r's key words (bumped before every round but the first), in the order its rows meet them
    keys = [[(k1 + r * PHILOX_W1) & MASK32, (k0 + r * PHILOX_W0) & MASK32] for r in range(rounds)]
    keys = torch.tensor([k if r % 2 == 0 else k[::-1] for r, k in enumerate(keys)], dtype=torch.int64,
                        device=dev).reshape(rounds, 2, 1)
    a, b = counter[0::2], counter[1::2]
    for r in range(rounds):
        hi, lo = _mulhilo(a, m_lo[r % 2], m_hi[r % 2])
        hi[0].bitwise_xor_(b[1])
        hi[1].bitwise_xor_(b[0])
        a, b = hi.bitwise_xor_(keys[r]), lo
    if rounds % 2:
        a, b = a.flip(0), b.flip(0)
    return torch.stack((a[0], b[0], a[1], b[1]))


def block_words(first: int, count: int, seed: int, step: int, index: int, *, device="cpu") -> torch.Tensor:
    """The Philox words of blocks first .. first + count - 1 of stream (seed, step, index): 4 x count int64."""
    seed = _word("seed", seed, 1 << 32)
    index = _word("index", index, 1 << 32)
    step = _word("step", step, 1 << 64)
    blocks = torch.arange(first, first + count, dtype=torch.int64, device=device)
    counter = torch.empty((4, count), dtype=torch.int64, device=device)
    counter[0] = blocks & MASK32
    counter[1] = blocks >> 32
    counter[2] = step & MASK32
    counter[3] = step >> 32
    return philox4x32(counter, (seed, index))


def _fixed_point(hi: torch.Tensor, lo: torch.Tensor) -> torch.Tensor:
    """2j + 1 for j = the 52 bits hi << 20 | lo >> 12 of two words: an odd int64 in [1, 2^53)."""
    return ((hi << 20) | (lo >> 12)) * 2 + 1


def open_uniforms(hi: torch.Tensor, lo: torch.Tensor) -> torch.Tensor:
    """Uniforms from two words each: (2j + 1) * 2^-53, exact, strictly inside (0, 1)."""
    return _fixed_point(hi, lo).to(torch.float64) * 2.0 ** -53


def _horner(z: torch.Tensor, coeffs) -> torch.Tensor:
    """coeffs[0] + z coeffs[1] + ... by Horner's rule, one rounding an operation."""
    p = z * coeffs[-1] + coeffs[-2]
    for c in reversed(coeffs[:-2]):
        p = p * z + c
    return p


def log_unit(u: torch.Tensor) -> torch.Tensor:
    """ln u for positive normal float64 u (here in (0, 1)), from +, -, *, / only."""
    bits = u.view(torch.int64)
    e = (bits >> 52 & EXP_MASK) - 1023
    m = (bits & FRACTION_MASK | ONE_BITS).view(torch.float64)  # u = m 2^e, m in [1, 2)
    big = m > SQRT2
    m = torch.where(big, m * 0.5, m)  # now in [sqrt(1/2), sqrt(2))
    e = e.add_(big).to(torch.float64)
    # ln m = 2 atanh(s) = 2s + s R with s = f / (2 + f), f = m - 1 (exact), R = z (2/3 + 2z/5 + ...), z = s^2;
    # written (as fdlibm does) as f less a small correction, so that its rounding errors stay small
    f = m - 1.0
    s = f / (m + 1.0)
    z = s * s
    r = z * _horner(z, LOG_COEFFS)
    half_f2 = f * f * 0.5
    return e * LN2_HI - ((half_f2 - (s * (half_f2 + r) + e * LN2_LO)) - f)


def sqrt_positive(a: torch.Tensor) -> torch.Tensor:
    """sqrt of positive normal float64 a from +, *, / only (torch.sqrt's CPU bits are not IEEE's)."""
    y = ((a.view(torch.int64) >> 1) + SQRT_MAGIC).view(torch.float64)
    for _ in range(NEWTON_STEPS):
        y = (y + a / y) * 0.5
    return y


def cos_sin_turns(n: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) of 2 pi n 2^-53 for int64 n in [0, 2^53): the quadrant and octant come from n's bits (exact),
    the Taylor polynomials see an angle in [0, pi/4], and the quadrant's signs multiply exactly."""
    quadrant = n >> 51
    rest = n & ((1 << 51) - 1)  # the angle past the quadrant, in units of 2 pi 2^-53
    flip = rest > (1 << 50)  # past the octant: pi/2 minus the angle, sin and cos swapped
    x = torch.where(flip, (1 << 51) - rest, rest).to(torch.float64) * (TWO_PI * 2.0 ** -53)
    z = x * x
    s = x + x * z * _horner(z, SIN_COEFFS)
    c = z * _horner(z, COS_COEFFS) + 1.0
    swap = flip ^ (quadrant & 1).to(torch.bool)  # an odd quadrant swaps sin and cos once more
    # cos is negative in quadrants 1 and 2, sin in 2 and 3
    cos_sign = 1 - 2 * ((quadrant ^ quadrant >> 1) & 1)
    sin_sign = 1 - 2 * (quadrant >> 1)
    return torch.where(swap, s, c) * cos_sign, torch.where(swap, c, s) * sin_sign


def box_muller(words: torch.Tensor) -> torch.Tensor:
    """The two normals of each block of words (4 x n int64), interleaved: 2n float64."""
    radius = sqrt_positive(log_unit(open_uniforms(words[0], words[1])) * -2.0)
    cos, sin = cos_sin_turns(_fixed_point(words[2], words[3]))
    pairs = torch.empty((radius.shape[0], 2), dtype=torch.float64, device=radius.device)
    torch.mul(radius, cos, out=pairs[:, 0])
    torch.mul(radius, sin, out=pairs[:, 1])
    return pairs.reshape(-1)


def _shape(shape) -> tuple[int, ...]:
    if hasattr(shape, "__index__"):  # one dimension
        shape = (shape,)
    try:
        dims = tuple(operator.index(d) for d in shape)
    except TypeError:
        raise PitcheckError(f"shape must be a tuple of non-negative integers, got {shape!r}") from None
    if any(isinstance(d, bool) for d in shape) or any(d < 0 for d in dims):
        raise PitcheckError(f"shape must be a tuple of non-negative integers, got {shape!r}")
    return dims


def _row_range(rows, n_rows: int) -> tuple[int, int]:
    if isinstance(rows, tuple) and len(rows) == 2:
        rows = slice(*rows)
    if not isinstance(rows, (slice, range)) or rows.step not in (None, 1):
        raise PitcheckError(f"rows must be a slice (start, stop) of step 1, got {rows!r}")
    start, stop, _ = slice(rows.start, rows.stop).indices(n_rows)
    return start, max(start, stop)


def normals(shape, seed: int, step: int, index: int, *, device="cpu", rows=None, fill=None) -> torch.Tensor:
    """Standard normals of stream (seed, step, index) over `shape`, float64 on `device`; `rows` (a slice of
    step 1 or a (start, stop) pair over shape[0]) draws only those rows, the same bits as the full draw's.
    `fill(out, start, stop, seed, step, index)`, where given, writes elements start .. stop - 1 into `out` in
    place of the passes here (counter_normal_fused.normals hands its one-kernel form in on CUDA).

    seed and index are 32-bit words (Philox's key), step a 64-bit counter. The same arguments give the same
    bits at any thread count and in the numpy reference (tests/numerics/test_counter_normal.py), and by construction on
    CUDA (which that file checks where there is one)."""
    dims = _shape(shape)
    seed = _word("seed", seed, 1 << 32)
    index = _word("index", index, 1 << 32)
    step = _word("step", step, 1 << 64)
    device = torch.device(device)
    if rows is None:
        start, stop, out_dims = 0, math.prod(dims), dims
    else:
        if not dims:
            raise PitcheckError("rows needs a shape of at least one dimension")
        width = math.prod(dims[1:])
        r0, r1 = _row_range(rows, dims[0])
        start, stop, out_dims = r0 * width, r1 * width, (r1 - r0, *dims[1:])
    out = torch.empty(stop - start, dtype=torch.float64, device=device)
    (fill or fill_by_passes)(out, start, stop, seed, step, index)
    return out.reshape(out_dims)


def fill_by_passes(out: torch.Tensor, start: int, stop: int, seed: int, step: int, index: int) -> None:
    """Elements start .. stop - 1 of stream (seed, step, index) into `out` (float64, stop - start elements on
    the draw's device), a torch kernel an operation over passes of CHUNK_BLOCKS blocks."""
    chunk = CHUNK_BLOCKS.get(out.device.type, CHUNK_BLOCKS["cuda"])
    first, last = start // 2, (stop + 1) // 2  # the blocks holding elements start .. stop - 1
    for b0 in range(first, last, chunk):
        b1 = min(b0 + chunk, last)
        z = box_muller(block_words(b0, b1 - b0, seed, step, index, device=out.device))
        lo, hi = max(start, 2 * b0), min(stop, 2 * b1)
        out[lo - start:hi - start] = z[lo - 2 * b0:hi - 2 * b0]
