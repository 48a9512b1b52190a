"""A plain numpy reference of pitcheck.numerics.counter_normal, for the tests only.

The integer part is written independently of the module: Philox's products are taken whole in uint64
(a 32 x 32-bit product fits) instead of from 16-bit limbs, one word at a time, with the key bumped as
Random123's philox4x32_R does. The float part follows the module's documented recipe operation by
operation (the same sequence of IEEE-rounded +, -, *, /, which numpy does not fuse), so that the two agree
bit for bit; tests/numerics/test_counter_normal.py separately holds each function within a few ulps of libm.
"""
import math
from fractions import Fraction

import numpy as np

U64 = np.uint64
MASK = U64(0xFFFFFFFF)
M0, M1 = U64(0xD2511F53), U64(0xCD9E8D57)
W0, W1 = 0x9E3779B9, 0xBB67AE85


def philox4x32(c0, c1, c2, c3, k0: int, k1: int, rounds: int = 10):
    """Philox4x32-`rounds` of counters (uint64 arrays of 32-bit words) under key (k0, k1): four uint64 arrays."""
    x0, x1, x2, x3 = (np.asarray(c, dtype=U64).copy() for c in (c0, c1, c2, c3))
    for r in range(rounds):
        if r > 0:
            k0, k1 = (k0 + W0) & 0xFFFFFFFF, (k1 + W1) & 0xFFFFFFFF
        p0 = x0 * M0  # < 2^64: exact in uint64
        p1 = x2 * M1
        hi0, lo0 = p0 >> U64(32), p0 & MASK
        hi1, lo1 = p1 >> U64(32), p1 & MASK
        x0, x1, x2, x3 = hi1 ^ x1 ^ U64(k0), lo1, hi0 ^ x3 ^ U64(k1), lo0
    return x0, x1, x2, x3


def words(n_blocks: int, seed: int, step: int, index: int, first: int = 0):
    """Philox words of blocks first .. first + n_blocks - 1 of the stream (seed, step, index)."""
    b = np.arange(first, first + n_blocks, dtype=U64)
    step_lo = np.full(n_blocks, step & 0xFFFFFFFF, dtype=U64)
    step_hi = np.full(n_blocks, step >> 32, dtype=U64)
    return philox4x32(b & MASK, b >> U64(32), step_lo, step_hi, seed, index)


def odd_numerator(hi, lo):
    """2j + 1, j = the top 52 of the 64 bits hi:lo (uint64)."""
    j = (hi << U64(20)) | (lo >> U64(12))
    return j * U64(2) + U64(1)


def uniforms(hi, lo):
    return odd_numerator(hi, lo).astype(np.float64) * 2.0 ** -53


def horner(z, coeffs):
    p = np.full_like(z, coeffs[-1])
    for c in coeffs[-2::-1]:
        p = p * z + c
    return p


LOG_C = [float(Fraction(2, n)) for n in range(3, 21, 2)]
SIN_C = [float(Fraction((-1) ** k, math.factorial(2 * k + 1))) for k in range(1, 9)]
COS_C = [float(Fraction((-1) ** k, math.factorial(2 * k))) for k in range(1, 9)]
LN2_HI = float.fromhex("0x1.62e42fee00000p-1")
LN2_LO = float.fromhex("0x1.a39ef35793c76p-33")


def log(u):
    m, e = np.frexp(u)  # u = m 2^e, m in [1/2, 1)
    m, e = m * 2.0, e - 1  # m in [1, 2)
    big = m > math.sqrt(2.0)
    m = np.where(big, m / 2.0, m)
    e = (e + big).astype(np.float64)
    f = m - 1.0
    s = f / (2.0 + f)
    z = s * s
    hfsq = 0.5 * f * f
    correction = s * (hfsq + z * horner(z, LOG_C))
    return e * LN2_HI - ((hfsq - (correction + e * LN2_LO)) - f)


def sqrt(a):
    bits = a.view(np.int64)
    y = ((bits >> 1) + (1023 << 51)).view(np.float64)
    for _ in range(4):
        y = (y + a / y) * 0.5
    return y


def cos_sin(n):
    """cos and sin of 2 pi n / 2^53 (n: uint64 below 2^53)."""
    n = n.astype(np.int64)
    q = n >> 51
    rest = n - (q << 51)
    swap = rest > 2 ** 50
    rest = np.where(swap, 2 ** 51 - rest, rest)
    x = rest.astype(np.float64) * 2.0 ** -53 * (2 * math.pi)
    z = x * x
    s = x + x * z * horner(z, SIN_C)
    c = z * horner(z, COS_C) + 1.0
    s, c = np.where(swap, c, s), np.where(swap, s, c)
    cos = np.choose(q, [c, -s, -c, s])
    sin = np.choose(q, [s, c, -s, -c])
    return cos, sin


def normals(shape, seed: int, step: int, index: int):
    """The stream's normals over `shape` (element 2b: r cos, 2b + 1: r sin of block b)."""
    n = math.prod(shape)
    x0, x1, x2, x3 = words((n + 1) // 2, seed, step, index)
    r = sqrt(-2.0 * log(uniforms(x0, x1)))
    cos, sin = cos_sin(odd_numerator(x2, x3))
    z = np.empty(2 * len(r))
    z[0::2] = r * cos
    z[1::2] = r * sin
    return z[:n].reshape(shape)
