"""Scaling recipes: how a tensor is put into an 8- or 4-bit element format through scales, and back.

Each recipe quantises x into element values (each exactly representable in the recipe's element
format) and decode scales, one per block, so that the dequantised tensor is
    x_hat = values * scale(block) * global_scale.
Blocks are rectangles of x: the whole tensor (per-tensor recipes), 1 x n along one axis (`axis`, the
orientation: quantising x along its rows and transposing differs from quantising x.T along its rows),
or n x n tiles of the last two axes (the same tiles either way round). A partial block at an edge is
a shorter block. All arithmetic is float64, where x lives (a numpy array on the host, a torch tensor on its
device, with the same bits: every step is an exact operation or one IEEE rounding): a scaled value x * s or x / s is formed once
(exactly for fp32 or bf16 input with a power-of-two scale; one float64 rounding otherwise, where the
hardware rounds to fp32) and rounded once to the element format, saturating (OFP8's satfinite
conversion), by round to nearest even or stochastic rounding. A NaN or infinity in a block makes that
block's scale, and so its values, NaN: the failure shows instead of vanishing into a saturated value
(except under delayed scaling, whose scale comes from earlier tensors: there an infinity saturates, as
TE's satfinite cast does, and a NaN stays NaN).

Recipes (get_recipe(name) makes a fresh one; the delayed-scaling recipe has state):
  tensor-current        one fp32 scale fmax / amax per tensor (Transformer Engine's current scaling)
  tensor-current-pow2   the same scale rounded down to a power of two (TE's force_pow_2_scales)
  tensor-delayed        TE's DelayedScaling: the scale comes from an amax history window
  block-1x128           DeepSeek-V3's activation tiles: fp32 scale amax / fmax per 1 x 128 block
  block-128x128         DeepSeek-V3's weight blocks: fp32 scale per 128 x 128 tile
  mxfp8, mxfp8-e5m2, mxfp4   OCP MX v1.0: 1 x 32 blocks, E8M0 scale 2^(floor(log2 amax) - emax_elem)
  mxfp8-rceil           MX with NVIDIA's scale rule 2^ceil(log2(amax / fmax)) (no saturation needed)
  nvfp4                 E2M1 in 1 x 16 blocks, an E4M3 scale per block, an fp32 global scale
                        amax / (6 * 448) per tensor
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

import numpy as np

from ..infra.errors import PitcheckError
from .formats import E8M0_BIAS, E8M0_NAN, FORMATS, _is_torch, e8m0_decode, get_format, round_to

FP32_MAX = float(np.finfo(np.float32).max)


@dataclass(frozen=True)
class Quantised:
    """A tensor in a scaled low-precision format. values has x's shape; scales has one entry per block
    (x's shape divided by `block`, rounded up); x_hat = values * scales (per block) * global_scale."""

    values: np.ndarray
    scales: np.ndarray
    element: str
    block: tuple
    global_scale: float = 1.0
    scale_codes: np.ndarray | None = None  # E8M0 codes of MX scales

    def dequantise(self) -> np.ndarray:
        return self.values * _expand(self.scales, self.block, self.values.shape) * self.global_scale


def _fp32(x):
    """x rounded to fp32's values, float64: a tensor stays a tensor (on its device)."""
    return round_to(x if _is_torch(x) else np.asarray(x, dtype=np.float64), FORMATS["fp32"])


def _where(condition, a, b):
    """np.where, or torch.where for a tensor condition (a Python float either side is broadcast)."""
    if _is_torch(condition):
        import torch

        return torch.where(condition, a, b)
    return np.where(condition, a, b)


def _tensor_amax(a):
    """max |a| over the whole tensor, 0 for an empty one (NaN where a holds a NaN): a Python float for an
    array, a 0-d tensor where a tensor lives (nothing is read to the host)."""
    if _is_torch(a):
        return a.abs().amax() if a.numel() else a.new_zeros(())
    return float(np.max(np.abs(a), initial=0.0))


def _block_shape(shape: tuple, block: tuple | None, axis: int | None) -> tuple:
    """The block as a tuple over x's axes: block=None is the whole tensor; a 1-tuple runs along
    `axis`; a 2-tuple covers the last two axes."""
    if block is None:
        return tuple(shape)
    if len(block) == 1:
        if not shape:
            raise PitcheckError("a block recipe needs an array with at least one axis")
        if not -len(shape) <= axis < len(shape):
            raise PitcheckError(f"axis {axis} is out of range for an array of {len(shape)} axes")
        out = [1] * len(shape)
        out[axis % len(shape)] = block[0]
        return tuple(out)
    if len(shape) < 2:
        raise PitcheckError(f"a {block[0]} x {block[1]} block recipe needs a matrix, got shape {tuple(shape)}")
    return (1,) * (len(shape) - 2) + tuple(block)


def _block_amax(a, block: tuple):
    """max |a| over each block (NaN where a block holds a NaN); blocks at the edges may be shorter (zeros
    pad them, which no |entry| is below)."""
    padding = [-n % b for n, b in zip(a.shape, block)]
    split = []
    for n, pad, b in zip(a.shape, padding, block):
        split += [(n + pad) // b, b]
    axes = tuple(range(1, 2 * a.ndim, 2))
    if _is_torch(a):
        padded = a.new_zeros([n + pad for n, pad in zip(a.shape, padding)])
        padded[tuple(slice(0, n) for n in a.shape)] = a.abs()
        if padded.numel() == 0:  # numpy's initial=0.0: an empty block's maximum is 0
            return a.new_zeros(split[0::2])
        return padded.reshape(split).amax(dim=axes)
    padded = np.pad(np.abs(a), [(0, pad) for pad in padding])
    return padded.reshape(split).max(axis=axes, initial=0.0)


def _expand(scales, block: tuple, shape: tuple):
    out = scales
    for axis, (b, n) in enumerate(zip(block, shape)):
        repeated = out.repeat_interleave(b, dim=axis) if _is_torch(out) else np.repeat(out, b, axis=axis)
        out = repeated[(slice(None),) * axis + (slice(0, n),)]
    return out


def _to_numpy(x) -> np.ndarray:
    if type(x).__module__.startswith("torch"):
        return x.detach().cpu().double().numpy()
    a = np.asarray(x)
    if not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.integer)):
        raise PitcheckError(f"cannot quantise an array of {a.dtype}")
    return a.astype(np.float64)


def _divide(a, b):
    """a / b, one IEEE division, where either is a tensor: torch divides a CUDA tensor by a Python float as a
    times 1/b, and a Python float by a tensor as 1/b times a (two roundings each), so a float operand is made a
    0-d tensor first (a fill, no copy from the host)."""
    if _is_torch(a) or _is_torch(b):
        like = a if _is_torch(a) else b
        a, b = (x if _is_torch(x) else like.new_full((), x) for x in (a, b))
    return a / b


def _namespace(a):
    """numpy, or torch for a tensor."""
    if _is_torch(a):
        import torch

        return torch
    return np


def _full_like(a, value: float):
    return a.new_full(a.shape, value) if _is_torch(a) else np.full_like(a, value, dtype=np.float64)


def _cast(scaled: np.ndarray, element: str, rounding: str, rng) -> np.ndarray:
    return round_to(scaled, FORMATS[element], mode=rounding, rng=rng, saturate=True)


@dataclass
class Recipe:
    """Base of the recipes: quantise(x) -> Quantised, fake_quant(x) -> x_hat (x's kind, float64)."""

    element: str = "fp8-e4m3"
    name: str = ""

    def quantise(self, x, axis: int = -1, rounding: str = "nearest", rng=None) -> Quantised:
        return self._quantise(_to_numpy(x), axis, rounding, rng)

    def fake_quant(self, x, axis: int = -1, rounding: str = "nearest", rng=None):
        """x through the recipe and back, float64 in x's kind. A tensor is quantised where it lives, to the
        same bits as the host's numpy (a stochastic rounding's numpy Generator draws on the host, and only
        its noise is copied to the device). One Generator shared by several casts keeps that only while every
        tensor is finite: the host skips the draw for a per-tensor or NVFP4 recipe's non-finite tensor (all NaN),
        the device, which does not branch on the amax, draws it (a run seeds a Generator per tensor)."""
        if _is_torch(x):
            return self._quantise(x.detach().double(), axis, rounding, rng).dequantise()
        return self.quantise(x, axis=axis, rounding=rounding, rng=rng).dequantise()

    def _quantise(self, a: np.ndarray, axis: int, rounding: str, rng) -> Quantised:
        raise NotImplementedError


def _tensor_scale(amax, fmax: float, margin: float, pow2: bool):
    """TE's encode scale fmax / amax / 2^margin in fp32 (saturated to fp32's max for a tiny amax),
    optionally rounded down to a power of two; 1 for a zero amax. A 0-d tensor's amax gives a 0-d tensor
    on its device (a Python float's a float)."""
    if _is_torch(amax):
        import torch

        scale = _fp32(_divide(_divide(fmax, amax), 2.0**margin)).clamp(max=FP32_MAX)
        if pow2:  # 2^floor(log2 scale), exactly: scale = m 2^e with 1/2 <= m < 1 (an underflowed 0 kept)
            scale = torch.where(scale > 0, torch.ldexp(torch.ones_like(scale), torch.frexp(scale)[1] - 1), scale)
        return torch.where(amax == 0, 1.0, scale)
    if amax == 0:
        return 1.0
    scale = float(_fp32(fmax / amax / 2.0**margin))
    scale = min(scale, FP32_MAX)
    if pow2 and scale > 0:  # 0: fmax / amax underflowed fp32 (an amax past fp32's range), NaN values follow
        scale = 2.0 ** math.floor(math.log2(scale))
    return scale


def _tensor_quantised(a, scale, element: str, rounding: str, rng) -> Quantised:
    values = _cast(a * scale, element, rounding, rng)
    if _is_torch(a):  # a Python or a 0-d tensor's scale: TE's scale_inv, kept where a is
        decode = _fp32(_divide(a.new_full((), 1.0), scale))
        return Quantised(values, decode.reshape((1,) * a.ndim), element, tuple(a.shape))
    # TE's scale_inv, the fp32 reciprocal the GEMM multiplies by; a scale that underflowed fp32 (an amax past
    # fp32's range, which no fp32 tensor has) gives inf, and so NaN values, as on a device
    with np.errstate(divide="ignore"):
        decode = float(_fp32(np.float64(1.0) / scale))
    return Quantised(values, np.array(decode).reshape((1,) * a.ndim), element, tuple(a.shape))


@dataclass
class TensorCurrent(Recipe):
    """Per-tensor current scaling: scale = fmax / max(amax, amax_epsilon) from this tensor, values =
    RN_sat(x scale), decode scale = fp32(1 / scale). Models TE's Float8CurrentScaling (its
    force_pow_2_scales and amax_epsilon options); leaves out the amax all-reduce across ranks."""

    pow2: bool = False
    amax_epsilon: float = 0.0

    def _quantise(self, a, axis: int, rounding: str, rng) -> Quantised:
        amax = _tensor_amax(a)
        fmax = FORMATS[self.element].max
        if _is_torch(a):  # no branch on the amax, which would read it: a non-finite one's NaNs selected
            out = _tensor_quantised(a, _tensor_scale(amax.clamp(min=self.amax_epsilon), fmax, 0, self.pow2),
                                    self.element, rounding, rng)
            return _nan_where(amax, out)
        if not math.isfinite(amax):
            return _nan_quantised(a, self.element)
        return _tensor_quantised(a, _tensor_scale(max(amax, self.amax_epsilon), fmax, 0, self.pow2), self.element,
                                 rounding, rng)


@dataclass
class TensorDelayed(Recipe):
    """Per-tensor delayed scaling as TE's DelayedScaling: a tensor is cast with the scale computed
    from the amax history of earlier calls (1 before any), then its own amax enters the history (the
    last history_len amaxes) and the scale is recomputed as fmax / amax_h / 2^margin, amax_h the
    history's max ("max") or its newest entry ("most_recent"); a zero or non-finite amax_h keeps the
    previous scale, as TE does. Values beyond the range saturate. Leaves out: the amax reduction
    across ranks, the old `interval` option and custom amax/scale callables."""

    history_len: int = 1024
    algo: str = "max"
    margin: float = 0.0
    scale: float = 1.0
    history: list = field(default_factory=list)  # newest first

    def __post_init__(self):
        if self.algo not in ("max", "most_recent"):
            raise PitcheckError(f"unknown amax_compute_algo {self.algo!r}; choose max or most_recent")
        if self.history_len < 1:
            raise PitcheckError(f"amax history length must be at least 1, got {self.history_len}")

    def _quantise(self, a, axis: int, rounding: str, rng) -> Quantised:
        # a device's scale is read for a host cast (a measurement's copy of the recipe, say): one scalar
        scale = self.scale if _is_torch(a) or not _is_torch(self.scale) else float(self.scale)
        out = _tensor_quantised(a, scale, self.element, rounding, rng)
        self.observe(_tensor_amax(a))  # a float from an array; a 0-d tensor from a tensor, nothing read
        return out

    def observe(self, amax) -> None:
        """What a cast leaves behind: its tensor's amax enters the history and the scale follows. An amax that
        is a 0-d tensor keeps the history and the scale where it lives (the same bits, nothing read)."""
        if _is_torch(amax):  # a float32 tensor's amax, say: the host's rule computes in float64; a copy, so
            amax = amax.detach().to(dtype=_namespace(amax).float64, copy=True)  # the caller's may change
        self.history = [amax] + self.history[: self.history_len - 1]
        if any(map(_is_torch, self.history)):
            self.scale = self._scale_on_device()
            return
        amax = max(self.history) if self.algo == "max" else self.history[0]
        if amax > 0 and math.isfinite(amax):  # else TE keeps the previous scale
            self.scale = _tensor_scale(amax, FORMATS[self.element].max, self.margin, False)

    def _scale_on_device(self):
        """observe's rule on the device. Python's max over the history, which the host form takes, is NaN when the
        newest amax is NaN and passes over an older NaN (no float is greater than NaN, nor NaN than any)."""
        import torch

        like = next(a for a in self.history if _is_torch(a))
        # floats from a restored checkpoint, until the window has moved past them
        h = torch.stack([a if _is_torch(a) else like.new_full((), a) for a in self.history])
        newest = h[0]
        if self.algo == "max":
            amax = torch.where(newest.isnan(), newest, torch.where(h.isnan(), -math.inf, h).amax())
        else:
            amax = newest
        previous = self.scale if _is_torch(self.scale) else like.new_full((), self.scale)
        kept = (amax > 0) & amax.isfinite()
        new = _tensor_scale(torch.where(kept, amax, 1.0), FORMATS[self.element].max, self.margin, False)
        return torch.where(kept, new, previous)


def _nan_quantised(a: np.ndarray, element: str) -> Quantised:
    nan = np.full(a.shape, np.nan)
    return Quantised(nan, np.full((1,) * a.ndim, np.nan), element, tuple(a.shape))


def _nan_where(amax, q: Quantised) -> Quantised:
    """q, or _nan_quantised's all-NaN tensor where the (0-d tensor) amax is not finite: the device's form of
    the host's early return."""
    finite = amax.isfinite()
    return Quantised(q.values.where(finite, float("nan")), q.scales.where(finite, float("nan")), q.element, q.block,
                     q.global_scale if isinstance(q.global_scale, float) else q.global_scale.where(finite, float("nan")),
                     q.scale_codes)


@dataclass
class BlockFP32(Recipe):
    """DeepSeek-V3's fine-grained scaling: per block, decode scale s = fp32(amax / fmax), values =
    RN_sat(x / s). block=(1, 128) runs along `axis` (activations); (128, 128) tiles the last two
    axes (weights). An all-zero block gets scale 1. Leaves out the GEMM's promotion of partial sums to
    fp32 every 128 products (an accumulation rule, not a storage one)."""

    block: tuple = (128,)

    def _quantise(self, a, axis: int, rounding: str, rng) -> Quantised:
        block = _block_shape(a.shape, self.block, axis)
        amax = _block_amax(a, block)
        scales = _fp32(_divide(amax, FORMATS[self.element].max))
        scales = _where(amax > 0, scales, 1.0)
        scales = _where(_namespace(amax).isfinite(amax), scales, float("nan"))
        values = _cast(a / _expand(scales, block, a.shape), self.element, rounding, rng)
        return Quantised(values, scales, self.element, block)


@dataclass
class MX(Recipe):
    """OCP MX v1.0: per 1 x 32 block along `axis`, the shared scale X = 2^(floor(log2 amax) -
    emax_elem) stored as E8M0 (exponent clamped to [-127, 127]; an all-zero block gets 2^-127), values
    = RN_sat(x / X). With scale_rounding="ceil" (NVIDIA's RCEIL) X = 2^ceil(log2(amax / fmax)), the
    smallest power of two that brings amax within range. Leaves out the spec's other element types
    (FP6, INT8)."""

    block: tuple = (32,)
    scale_rounding: str = "floor"

    def _quantise(self, a, axis: int, rounding: str, rng) -> Quantised:
        fmt = FORMATS[self.element]
        block = _block_shape(a.shape, self.block, axis)
        amax = _block_amax(a, block)
        # an all-zero (or NaN) block gets a tiny stand-in, whose exponent clamps to E8M0's 2^-127
        safe = _where(amax > 0, amax, 2.0**-200)
        xp = _namespace(amax)
        e = xp.frexp(safe)[1]  # safe = m 2^e, 1/2 <= m < 1
        if self.scale_rounding == "floor":
            exponent = e - 1 - fmt.emax  # floor(log2 amax) - emax_elem, exactly
        else:
            # the smallest k with amax <= fmax 2^k: with fmax = f 2^g (1/2 <= f < 1), k is e - g when
            # amax <= f 2^e and e - g + 1 otherwise (exact comparisons, no logarithm)
            f, g = math.frexp(fmt.max)
            exponent = e - g + (safe > xp.ldexp(_full_like(safe, f), e))
        codes = xp.clip(exponent, -E8M0_BIAS, E8M0_BIAS) + E8M0_BIAS
        codes = _where(xp.isfinite(amax), codes, E8M0_NAN)
        codes = codes.to(xp.uint8) if xp is not np else codes.astype(np.uint8)
        scales = e8m0_decode(codes)
        values = _cast(a / _expand(scales, block, a.shape), self.element, rounding, rng)
        return Quantised(values, scales, self.element, block, scale_codes=codes)


@dataclass
class NVFP4(Recipe):
    """NVIDIA's NVFP4: a per-tensor fp32 global scale g = fp32(amax / (6 * 448)), per 1 x 16 block
    along `axis` an E4M3 scale s = RN_sat_e4m3(amax_block / (6 g)), values = RN_sat_e2m1(x / (s g)),
    x_hat = values s g. A block whose scale rounds to 0 dequantises to 0; an all-zero tensor gets
    g = 1. Leaves out the random Hadamard transform and 2-D (16 x 16) weight scaling of NVIDIA's
    training recipe; stochastic rounding is the caller's `rounding`."""

    element: str = "fp4-e2m1"
    block: tuple = (16,)

    def _quantise(self, a, axis: int, rounding: str, rng) -> Quantised:
        fmt, scale_fmt = FORMATS[self.element], FORMATS["fp8-e4m3"]
        block = _block_shape(a.shape, self.block, axis)
        tensor_amax = _tensor_amax(a)
        on_device = _is_torch(a)
        if on_device:  # g as a 0-d tensor (nothing read); a non-finite amax's NaNs selected at the end
            g = _where(tensor_amax > 0, _fp32(_divide(tensor_amax, fmt.max * scale_fmt.max)), 1.0)
        elif not math.isfinite(tensor_amax):
            return _nan_quantised(a, self.element)
        else:
            g = float(_fp32(tensor_amax / (fmt.max * scale_fmt.max))) if tensor_amax > 0 else 1.0
        amax = _block_amax(a, block)
        scales = round_to(_divide(amax, fmt.max * g), scale_fmt, saturate=True)
        divisor = _expand(scales, block, a.shape) * g
        with np.errstate(divide="ignore", invalid="ignore"):  # a zero scale: its block is set to 0 below
            values = _cast(a / divisor, self.element, rounding, rng)
        values = _where(divisor > 0, values, 0.0)
        out = Quantised(values, scales, self.element, block, global_scale=g)
        return _nan_where(tensor_amax, out) if on_device else out


RECIPES = {
    "tensor-current": lambda: TensorCurrent(name="tensor-current"),
    "tensor-current-pow2": lambda: TensorCurrent(name="tensor-current-pow2", pow2=True),
    "tensor-delayed": lambda: TensorDelayed(name="tensor-delayed"),
    "block-1x128": lambda: BlockFP32(name="block-1x128"),
    "block-128x128": lambda: BlockFP32(name="block-128x128", block=(128, 128)),
    "mxfp8": lambda: MX(name="mxfp8"),
    "mxfp8-e5m2": lambda: MX(name="mxfp8-e5m2", element="fp8-e5m2"),
    "mxfp8-rceil": lambda: MX(name="mxfp8-rceil", scale_rounding="ceil"),
    "mxfp4": lambda: MX(name="mxfp4", element="fp4-e2m1"),
    "nvfp4": lambda: NVFP4(name="nvfp4"),
}
ELEMENT_FORMATS = ("fp8-e4m3", "fp8-e5m2", "fp4-e2m1")


def _real(x) -> bool:
    """A real number (Python's or numpy's), not a bool."""
    return isinstance(x, numbers.Real) and not isinstance(x, (bool, np.bool_))


def get_recipe(name: str, **options) -> Recipe:
    """A fresh recipe by name (fresh state for tensor-delayed); options override its fields
    (element, margin, history_len, algo, ...)."""
    try:
        recipe = RECIPES[name]()
    except KeyError:
        raise PitcheckError(f"unknown scaling recipe {name!r}; choose from {', '.join(RECIPES)}") from None
    for key, value in options.items():
        if not hasattr(recipe, key) or key in ("name", "history", "scale"):
            raise PitcheckError(f"scaling recipe {name!r} has no option {key!r}")
        setattr(recipe, key, value)
    get_format(recipe.element)
    if recipe.element not in ELEMENT_FORMATS:
        raise PitcheckError(f"element format {recipe.element!r} is not one of {', '.join(ELEMENT_FORMATS)}")
    if isinstance(recipe, TensorDelayed):
        recipe.__post_init__()
    epsilon = getattr(recipe, "amax_epsilon", 0.0)
    if not (_real(epsilon) and 0 <= epsilon < math.inf):
        raise PitcheckError(f"amax_epsilon must be a finite number >= 0, got {epsilon!r}")
    margin = getattr(recipe, "margin", 0.0)
    if not (_real(margin) and -1000 <= margin <= 1000):  # 2^margin a normal float64 either way
        raise PitcheckError(f"margin must be a number in [-1000, 1000], got {margin!r}")
    if isinstance(recipe, MX) and recipe.scale_rounding not in ("floor", "ceil"):
        raise PitcheckError(f"unknown MX scale rounding {recipe.scale_rounding!r}; choose floor or ceil")
    return recipe


def quantise(x, recipe: str | Recipe, axis: int = -1, rounding: str = "nearest", rng=None) -> Quantised:
    if isinstance(recipe, str):
        recipe = get_recipe(recipe)
    return recipe.quantise(x, axis=axis, rounding=rounding, rng=rng)


def fake_quant(x, recipe: str | Recipe, axis: int = -1, rounding: str = "nearest", rng=None):
    """x through the recipe and back: the tensor a low-precision GEMM or store sees (float64)."""
    if isinstance(recipe, str):
        recipe = get_recipe(recipe)
    return recipe.fake_quant(x, axis=axis, rounding=rounding, rng=rng)
