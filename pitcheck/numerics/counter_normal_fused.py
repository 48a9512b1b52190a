"""counter_normal's draw as one Triton kernel: the same bits, one pass over memory instead of about 260.

Why: counter_normal runs each integer and float64 operation as its own torch kernel, so a V x D draw reads and
writes its temporaries about 260 times (that many torch operations a draw): some 50 GB for a 32768 x 512 draw,
about 12 ms at an H200's 4 TB/s, half the model's measured step there (23 ms). This kernel does the same
operations on registers and writes each normal once.

Why it keeps the bits: Philox is integer arithmetic (here a 64-bit product of 32-bit words, exact), and the
float64 stage is the same sequence of IEEE-rounded +, -, *, / as counter_normal's, on constants Triton makes at
float64 (in arithmetic a Python float beside a float64 tensor becomes a float64 constant; in a comparison it
would be rounded to float32 first, so the one compared constant is made float64 explicitly). The compiler may
contract a multiply and an add into an FMA: every launch passes enable_fp_fusion=False. The compiled PTX is
checked without a GPU (tests/numerics/test_counter_normal_fused.py: no FMA, IEEE division, every constant's exact
float64 literal), and on a GPU the bits are checked, not assumed: `ready(device)` draws irregular samples (4M
normals among them) both ways once per process and device and uses the kernel only if every bit agrees (else a
warning, and the unfused draw).
"""
from __future__ import annotations

import contextlib
import os
import warnings

import torch

from . import counter_normal as cn

BLOCK = 512  # Philox blocks (two normals each) a program draws
ELEMENT_LIMIT = 2**62  # element indices the kernel computes in int64 (2 (b + first) + 1), with room to spare
_READY: dict[str, bool] = {}


try:
    import triton
    import triton.language as tl
except ImportError:  # ready() says why, once, and the unfused draw serves
    triton = None

if triton is not None:
    @triton.jit
    def horner8(z, c0: tl.constexpr, c1: tl.constexpr, c2: tl.constexpr, c3: tl.constexpr, c4: tl.constexpr,
                c5: tl.constexpr, c6: tl.constexpr, c7: tl.constexpr):
        """c0 + z c1 + ... + z^7 c7 by Horner's rule, counter_normal._horner's operations in its order."""
        p = z * c7 + c6
        p = p * z + c5
        p = p * z + c4
        p = p * z + c3
        p = p * z + c2
        p = p * z + c1
        return p * z + c0

    @triton.jit
    def horner9(z, c0: tl.constexpr, c1: tl.constexpr, c2: tl.constexpr, c3: tl.constexpr, c4: tl.constexpr,
                c5: tl.constexpr, c6: tl.constexpr, c7: tl.constexpr, c8: tl.constexpr):
        return horner8(z, c1, c2, c3, c4, c5, c6, c7, c8) * z + c0  # the same operations as nine in one loop

    @triton.jit(do_not_specialize=["first", "count", "start", "stop", "seed", "index", "step_lo", "step_hi"])
    def draw(out, first, count, start, stop, seed, index, step_lo, step_hi, BLOCK: tl.constexpr,
             M0: tl.constexpr, M1: tl.constexpr, W0: tl.constexpr, W1: tl.constexpr, LN2_HI: tl.constexpr,
             LN2_LO: tl.constexpr, SQRT2: tl.constexpr, SQRT_MAGIC: tl.constexpr, NEWTON: tl.constexpr,
             TWO_NEG53: tl.constexpr, TURN: tl.constexpr,
             L0: tl.constexpr, L1: tl.constexpr, L2: tl.constexpr, L3: tl.constexpr, L4: tl.constexpr,
             L5: tl.constexpr, L6: tl.constexpr, L7: tl.constexpr, L8: tl.constexpr,
             S0: tl.constexpr, S1: tl.constexpr, S2: tl.constexpr, S3: tl.constexpr, S4: tl.constexpr,
             S5: tl.constexpr, S6: tl.constexpr, S7: tl.constexpr,
             C0: tl.constexpr, C1: tl.constexpr, C2: tl.constexpr, C3: tl.constexpr, C4: tl.constexpr,
             C5: tl.constexpr, C6: tl.constexpr, C7: tl.constexpr):
        b = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
        n = (b + first).to(tl.uint64)
        x0 = n & 0xFFFFFFFF
        x1 = n >> 32
        x2 = tl.zeros_like(n) + step_lo.to(tl.uint64)
        x3 = tl.zeros_like(n) + step_hi.to(tl.uint64)
        k0 = seed.to(tl.uint64)
        k1 = index.to(tl.uint64)
        for r in tl.static_range(10):
            p0 = x0 * M0  # a 32-bit word times a 32-bit multiplier: exact in 64 bits
            p1 = x2 * M1
            kr0 = (k0 + r * W0) & 0xFFFFFFFF
            kr1 = (k1 + r * W1) & 0xFFFFFFFF
            y0 = (p1 >> 32) ^ x1 ^ kr0
            y2 = (p0 >> 32) ^ x3 ^ kr1
            x1 = p1 & 0xFFFFFFFF
            x3 = p0 & 0xFFFFFFFF
            x0 = y0
            x2 = y2
        w0, w1, w2, w3 = x0.to(tl.int64), x1.to(tl.int64), x2.to(tl.int64), x3.to(tl.int64)
        # radius: sqrt(-2 ln u1), u1 = (2j + 1) 2^-53 from (w0, w1)
        u = (((w0 << 20) | (w1 >> 12)) * 2 + 1).to(tl.float64) * TWO_NEG53  # exact
        bits = u.to(tl.int64, bitcast=True)
        e = ((bits >> 52) & 0x7FF) - 1023
        m = ((bits & 0xFFFFFFFFFFFFF) | 0x3FF0000000000000).to(tl.float64, bitcast=True)
        big = m > tl.full([], SQRT2, tl.float64)  # a comparison would round a bare float constant to float32
        m = tl.where(big, m * 0.5, m)
        ef = (e + big.to(tl.int64)).to(tl.float64)
        f = m - 1.0
        s = f / (m + 1.0)
        z = s * s
        r2 = z * horner9(z, L0, L1, L2, L3, L4, L5, L6, L7, L8)
        half_f2 = f * f * 0.5
        ln = ef * LN2_HI - ((half_f2 - (s * (half_f2 + r2) + ef * LN2_LO)) - f)
        a = ln * -2.0
        y = ((a.to(tl.int64, bitcast=True) >> 1) + SQRT_MAGIC).to(tl.float64, bitcast=True)
        for _ in tl.static_range(NEWTON):
            y = (y + a / y) * 0.5
        # angle: 2 pi t 2^-53, t = 2j + 1 from (w2, w3), reduced by its quadrant and octant bits
        t = ((w2 << 20) | (w3 >> 12)) * 2 + 1
        quadrant = t >> 51
        rest = t & 0x7FFFFFFFFFFFF
        flip = rest > 0x4000000000000
        x = tl.where(flip, 0x8000000000000 - rest, rest).to(tl.float64) * TURN
        zz = x * x
        sn = x + x * zz * horner8(zz, S0, S1, S2, S3, S4, S5, S6, S7)
        cs = zz * horner8(zz, C0, C1, C2, C3, C4, C5, C6, C7) + 1.0
        swap = flip ^ ((quadrant & 1) != 0)
        cos_sign = (1 - 2 * ((quadrant ^ (quadrant >> 1)) & 1)).to(tl.float64)
        sin_sign = (1 - 2 * (quadrant >> 1)).to(tl.float64)
        cosv = tl.where(swap, sn, cs) * cos_sign
        sinv = tl.where(swap, cs, sn) * sin_sign
        # the elements of this block, e0 and e0 + 1 (below 2^63: draw_into); stop bounds the last block
        e0 = 2 * (b + first)
        tl.store(out + (e0 - start), y * cosv, mask=(e0 >= start) & (e0 < stop))
        tl.store(out + (e0 + 1 - start), y * sinv, mask=(e0 + 1 >= start) & (e0 + 1 < stop))


# counter_normal's constants, handed to the kernel as compile-time values (a Python float beside a float64
# tensor is made a float64 constant, so each is exactly counter_normal's)
_CONSTANTS = dict(M0=cn.PHILOX_M0, M1=cn.PHILOX_M1, W0=cn.PHILOX_W0, W1=cn.PHILOX_W1, LN2_HI=cn.LN2_HI,
                  LN2_LO=cn.LN2_LO, SQRT2=cn.SQRT2, SQRT_MAGIC=cn.SQRT_MAGIC, NEWTON=cn.NEWTON_STEPS,
                  TWO_NEG53=2.0 ** -53, TURN=cn.TWO_PI * 2.0 ** -53,
                  **{f"L{i}": c for i, c in enumerate(cn.LOG_COEFFS)},
                  **{f"S{i}": c for i, c in enumerate(cn.SIN_COEFFS)},
                  **{f"C{i}": c for i, c in enumerate(cn.COS_COEFFS)})


def draw_into(out: torch.Tensor, start: int, stop: int, seed: int, step: int, index: int) -> None:
    """Fill `out` (float64, stop - start elements, contiguous) with elements start .. stop - 1 of stream
    (seed, step, index), as counter_normal.normals draws them."""
    if triton is None:
        raise ImportError("Triton is not installed")
    if out.dtype != torch.float64 or not out.is_contiguous() or out.numel() != max(stop - start, 0):
        raise ValueError(f"out must be a contiguous float64 tensor of {max(stop - start, 0)} elements, got "
                         f"{out.dtype} of {out.numel()}")
    if stop >= ELEMENT_LIMIT:  # the kernel's element indices are int64: past them, the passes draw
        cn.fill_by_passes(out, start, stop, seed, step, index)
        return
    first, last = start // 2, (stop + 1) // 2
    count = last - first
    if count <= 0:
        return
    grid = (triton.cdiv(count, BLOCK),)
    launch = torch.cuda.device(out.device) if out.device.type == "cuda" else contextlib.nullcontext()
    with launch:  # Triton launches on the current device: make it out's
        draw[grid](out, first, count, start, stop, seed, index, step & cn.MASK32, step >> 32, BLOCK=BLOCK,
                   enable_fp_fusion=False, **_CONSTANTS)


def normals(shape, seed: int, step: int, index: int, *, device="cpu", rows=None, fused=None) -> torch.Tensor:
    """counter_normal.normals, drawn by this kernel where `fused` says (None: on CUDA where `ready`), else by
    counter_normal's passes: the same bits either way."""
    use = ready(torch.device(device)) if fused is None else fused
    return cn.normals(shape, seed, step, index, device=device, rows=rows, fill=draw_into if use else None)


def agrees(device, fill=None) -> bool:
    """Whether `fill` (default: this kernel's draw_into) writes counter_normal's passes' bits on `device`, through
    normals for irregular shapes, row slices and the largest words, and directly for blocks whose counter's
    second word turns over (elements past 2^33, beyond any shape drawn here), an odd element at each end."""
    fill = fill or draw_into
    cases = [((37, 29), 2**31 + 5, 2**40 + 3, 7, None), ((256, 256), 1, 2, 3, None), ((1001, 3), 0, 0, 0, (17, 400)),
             ((5,), 9, 1, 2**32 - 1, None), ((64, 64), 2**32 - 1, 2**64 - 1, 3, (1, 63))]
    if torch.device(device).type == "cuda":  # milliseconds there; minutes under the interpreter
        cases.append(((4096, 1024), 11, 2**20 + 1, 12, None))
    pairs = [(cn.normals(shape, seed, step, index, device=device, rows=rows, fill=fill),
              cn.normals(shape, seed, step, index, device=device, rows=rows))
             for shape, seed, step, index, rows in cases]
    start, stop = 2 * (2**32 - 5) + 1, 2 * (2**32 + 5) - 1
    turned = [torch.empty(stop - start, dtype=torch.float64, device=device) for _ in range(2)]
    fill(turned[0], start, stop, 77, 2**33 + 1, 5)
    cn.fill_by_passes(turned[1], start, stop, 77, 2**33 + 1, 5)
    return all(got.shape == want.shape and torch.equal(got.view(torch.int64), want.view(torch.int64))
               for got, want in [*pairs, turned])


def ready(device: torch.device) -> bool:
    """Whether to draw on `device` with the kernel: a CUDA device, Triton importable, PITCHECK_FUSED_NORMALS not
    0, and the kernel's bits checked against the unfused draw's once for this process and device."""
    if device.type != "cuda" or os.environ.get("PITCHECK_FUSED_NORMALS", "1") == "0":
        return False
    name = f"cuda:{torch.cuda.current_device() if device.index is None else device.index}"
    if name not in _READY:
        try:
            ok = agrees(device)
        except Exception as exc:  # no Triton, or it cannot build here: the unfused draw is the same stream
            warnings.warn(f"the fused counter-normal kernel is unavailable on {name} ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0] if str(exc) else ''}); drawing unfused, the same bits, slower",
                          RuntimeWarning, stacklevel=3)
            ok = False
        else:
            if not ok:
                warnings.warn(f"the fused counter-normal kernel's bits differ from the unfused draw's on {name}; "
                              "drawing unfused", RuntimeWarning, stacklevel=3)
        _READY[name] = ok
    return _READY[name]
