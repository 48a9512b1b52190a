"""Native float8: torch's float8 dtypes and torch._scaled_mm, the path the hardware takes, beside the
bit-exact emulation of pitcheck.numerics.scaling.

A recipe's hardware path forms the scaled operand in fp32 (x * scale, or x / scale), casts it to
torch.float8_e4m3fn / float8_e5m2 with torch's conversion, and multiplies the float8 operands with
torch._scaled_mm: exact fp8 x fp8 products, fp32 accumulation, fp32 decode scales. torch 2.13 runs
both on CPU too, so every claim below is tested here without a GPU; on CUDA the same calls run the
tensor cores' kernels (the cast is c10's, shared by CPU and CUDA).

How it differs from the emulation, and why the tests can still demand exactness:
- element casts: torch's E4M3 conversion saturates (overflow and infinities give +-448; measured on
  torch 2.13 CPU), its E5M2 conversion overflows to infinity. The recipes' satfinite casts are reached
  by clamping to +-fmax first (which rounds the same: everything beyond fmax rounds to fmax). On float32
  input the cast equals pitcheck.numerics.formats.round_to bit for bit (tests/numerics/test_native_float8.py enumerates
  every value, every midpoint and its neighbours). A float64 input is rounded to float32 first, a
  double rounding, so only float32 input is passed to the cast.
- scaled operands: the product is rounded to fp32 before the cast, where the emulation rounds the
  float64 product once. With a power-of-two scale (MX, tensor-current-pow2) the fp32 product is exact
  and the two agree bit for bit; with an fp32 scale an element may differ by one fp8 step where the fp32
  rounding moved the product onto or across a rounding boundary (each such element is identified in the
  tests; `operand_mismatches` counts them).
- the GEMM: each block's partial sum is accumulated in fp32 and the blocks' partial sums added in fp32
  (DeepSeek-V3's promotion every 128 products; a block of 32 for MX), against the emulation's float64
  product of the dequantised operands: they differ by fp32 accumulation, at most gamma_(K + c) u_fp32
  |A_hat| |W_hat|^T entrywise (`gemm_error_bound`). That is the CPU path's contract. On an NVIDIA H200
  (torch 2.11, cuBLASLt; results/gpu/NOTE.md) the largest error over this bound was 1.9 (per-tensor
  scales), 5.1 (MXFP8) and 7.6 (1x128 / 128x128 blocks) on 256 x 576 by 576 x 256 random operands: the
  tensor cores' FP8 accumulation is narrower than fp32, as DeepSeek-V3's report describes for Hopper.
  Errors that size are still about a thousand times below the operands' own fp8 rounding (u = 2^-4);
  a bound for the hardware's accumulation is not derived here.

Not native here: E2M1 (torch's float4_e2m1fn_x2 packs two elements per byte and has no CPU cast),
NVFP4 and MXFP4, and delayed scaling (its scale is the recipe's state; the cast is the same).
"""
from __future__ import annotations

import numpy as np

from ..infra.errors import PitcheckError
from .formats import FORMATS
from .scaling import MX, BlockFP32, Recipe, TensorCurrent, get_recipe

NATIVE_ELEMENTS = ("fp8-e4m3", "fp8-e5m2")
# the dimensions torch._scaled_mm's CUDA kernels need to be multiples of (zero padding is exact)
GEMM_MULTIPLE = 16


def float8_dtype(element: str):
    """torch's float8 dtype of an element format; a one-line error for one torch cannot cast to."""
    import torch

    if element not in NATIVE_ELEMENTS:
        raise PitcheckError(f"no native cast for {element}: torch casts only to {', '.join(NATIVE_ELEMENTS)} "
                            "(float4_e2m1fn_x2 packs two elements and has no cast kernel on CPU)")
    return getattr(torch, FORMATS[element].torch_name)


def cast(x, element: str, saturate: bool = True):
    """x (a float32 torch tensor) cast to the float8 dtype of `element` by torch's conversion; saturate
    clamps to +-fmax first (the scaling recipes' satfinite cast), NaN stays NaN."""
    import torch

    dtype = float8_dtype(element)
    if x.dtype != torch.float32:
        raise PitcheckError(f"native casts take float32 input (got {x.dtype}): a wider input would be "
                            "rounded to float32 first, a double rounding")
    if saturate:
        fmax = FORMATS[element].max
        x = torch.where(torch.isnan(x), x, x.clamp(-fmax, fmax))
    return x.to(dtype)


def _block_length(recipe: Recipe, K: int) -> tuple[int, bool]:
    """The recipe's block along the contraction axis K and whether its scales are per row (False: one
    scale per tensor)."""
    if isinstance(recipe, TensorCurrent):
        return K, False
    if isinstance(recipe, (BlockFP32, MX)):
        return recipe.block[-1], True
    raise PitcheckError(f"recipe {recipe.name!r} has no native path here: native recipes are per-tensor "
                        "current scaling, fp32-scaled blocks and MX blocks with fp8 elements")


def quantise(x, recipe: str | Recipe):
    """x (float32 torch tensor, M x K) quantised along its rows (the GEMM's contraction axis) the way the
    hardware does it: (values as a float8 tensor, decode scales as float32 (M or 1, number of blocks),
    the block length along K, whether the scales vary by row (False: tensorwise)). The scales follow the
    recipe's rule exactly (computed by pitcheck.numerics.scaling from the same amaxes); the values are the fp32
    scaled operand cast natively."""
    import torch

    recipe = get_recipe(recipe) if isinstance(recipe, str) else recipe
    float8_dtype(recipe.element)
    if x.dim() != 2:
        raise PitcheckError(f"native quantisation takes a matrix, got shape {tuple(x.shape)}")
    if x.dtype != torch.float32:
        raise PitcheckError(f"native quantisation takes float32 input, got {x.dtype}")
    M, K = x.shape
    length, per_row = _block_length(recipe, K)
    if not per_row:
        # TE's encode scale fp32(fmax / amax) and its scale_inv fp32(1 / scale), both where x is
        encode = _tensor_encode_scale(recipe, x)
        values = cast(x * encode.to(torch.float32), recipe.element)  # encode is an fp32 value: exact
        scales = (encode.new_full((), 1.0) / encode).to(torch.float32).reshape(1, 1)  # one division
        return values, scales, K, False
    # block scales by the emulation's rule from the same amaxes, computed where x is (its values are dropped)
    emulated = recipe._quantise(x.detach().double(), -1, "nearest", None)
    # block scales: one per (row, block) for 1 x n blocks; an n x n tile's scale repeated on its rows
    scales = emulated.scales.repeat_interleave(emulated.block[0], dim=0)[:M].to(torch.float32)
    divisor = scales.repeat_interleave(length, dim=1)[:, :K]
    values = cast(x / divisor, recipe.element)
    return values, scales, length, True


def _tensor_encode_scale(recipe: TensorCurrent, x):
    """The encode scale as a float64 0-d tensor on x's device (nothing read to the host)."""
    from .scaling import _tensor_amax, _tensor_scale  # the one definition of TE's scale rule

    amax = _tensor_amax(x.detach().double())
    return _tensor_scale(amax.clamp(min=recipe.amax_epsilon), FORMATS[recipe.element].max, 0, recipe.pow2)


def _pad(t, rows: int, cols: int):
    """t with `rows` zero rows and `cols` zero columns appended (through float32: torch pads no float8)."""
    import torch

    return torch.nn.functional.pad(t.float(), (0, cols, 0, rows)).to(t.dtype)


def scaled_mm(a, w, recipe_a: str | Recipe, recipe_w: str | Recipe):
    """a (M x K) times w (N x K) transposed, both float32 torch tensors, through the recipes' native
    path: quantised along K, multiplied by torch._scaled_mm block by block (fp32 accumulation within a
    block, fp32 sums across blocks), float32 M x N. The recipes' blocks along K must be equal, or one
    of them per-tensor."""
    import torch

    if a.dim() != 2 or w.dim() != 2 or a.shape[1] != w.shape[1]:
        raise PitcheckError(f"scaled_mm takes M x K and N x K matrices, got {tuple(a.shape)} and {tuple(w.shape)}")
    qa, sa, la, rows_a = quantise(a, recipe_a)
    qw, sw, lw, rows_w = quantise(w, recipe_w)
    K = a.shape[1]
    if rows_a and rows_w and la != lw:
        raise PitcheckError(f"the operands' blocks along K differ ({la} and {lw}): no common partial sums")
    length = la if rows_a else lw
    M, N = a.shape[0], w.shape[0]
    pad_m, pad_n = -M % GEMM_MULTIPLE, -N % GEMM_MULTIPLE
    out = torch.zeros(M + pad_m, N + pad_n, dtype=torch.float32, device=a.device)
    for j, start in enumerate(range(0, K, length)):
        stop = min(start + length, K)
        pad_k = -(stop - start) % GEMM_MULTIPLE
        block_a = _pad(qa[:, start:stop], pad_m, pad_k)
        block_w = _pad(qw[:, start:stop], pad_n, pad_k)
        scale_a = _pad(sa[:, j:j + 1], pad_m, 0).contiguous() if rows_a else sa.reshape(())
        scale_w = _pad(sw[:, j:j + 1], pad_n, 0).T.contiguous() if rows_w else sw.reshape(())
        if rows_a != rows_w:  # torch takes both rowwise or both tensorwise: expand the per-tensor one
            scale_a = scale_a.expand(M + pad_m, 1).contiguous() if not rows_a else scale_a
            scale_w = scale_w.expand(1, N + pad_n).contiguous() if not rows_w else scale_w
        # column-major second operand, as the CUDA kernels require
        out += _scaled_mm(block_a, block_w.T, scale_a, scale_w)
    return out[:M, :N]


def _scaled_mm(a, b, scale_a, scale_b):
    """torch._scaled_mm to fp32; a torch whose kernel for this device refuses the scales' layout is a one-line
    error (torch 2.11's CPU kernel takes per-tensor scales only: an internal assert; pitcheck's floor, 2.13,
    takes rowwise ones)."""
    import torch

    try:
        return torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=torch.float32)
    except RuntimeError as exc:
        if scale_a.numel() == 1 and scale_b.numel() == 1:
            raise
        raise PitcheckError(f"torch {torch.__version__}'s _scaled_mm on {a.device.type} refuses rowwise scales "
                            f"({str(exc).strip().splitlines()[-1][:160]}); pitcheck needs torch 2.13 or later, or "
                            "a per-tensor recipe") from None


def gemm_error_bound(a_hat: np.ndarray, w_hat: np.ndarray, block: int) -> np.ndarray:
    """Entrywise bound on |scaled_mm - a_hat w_hat^T| (a_hat, w_hat the dequantised operands, float64):
    gamma_(n) u_fp32 |a_hat| |w_hat|^T with n = block + K / block + 2 (each block's fp32 sum, the sum
    over blocks, the two scale multiplications), gamma_n = n u / (1 - n u)."""
    K = a_hat.shape[1]
    n = min(block, K) + -(-K // block) + 2
    u = FORMATS["fp32"].u
    return n * u / (1 - n * u) * (np.abs(a_hat) @ np.abs(w_hat).T)


def has_native_path(recipe: str | Recipe) -> bool:
    """Whether `quantise` runs this recipe natively (fp8 elements; per-tensor current, fp32-block or MX scales)."""
    recipe = get_recipe(recipe) if isinstance(recipe, str) else recipe
    return recipe.element in NATIVE_ELEMENTS and isinstance(recipe, (TensorCurrent, BlockFP32, MX))


def fake_quant(x, recipe: str | Recipe):
    """x (a torch matrix) through the recipe's native path and back: float64 on x's device, blocks along
    the rows, as pitcheck.numerics.scaling.fake_quant gives it from the emulation. x is rounded to float32 first
    (the operand the hardware casts: exact for a float32 master)."""
    import torch

    values, scales, length, per_row = quantise(x.detach().to(torch.float32), recipe)
    divisor = scales.double().repeat_interleave(length, dim=1)[:, : x.shape[1]] if per_row else scales.double()
    return values.double() * divisor
