"""Placements: which of PIT's tensors go through an 8- or 4-bit format, under which scaling recipe.

A placement names, for the tensors of one PIT model, the scaling recipe (pitcheck.numerics.scaling) each passes
through where real training would put a narrow format; the master copy the optimizer updates stays in
the policy's master format (fp32). The roles:

  z_copy, l_copy   the Z and L the model computes with (embedding and head) are the master rounded
                   through the recipe: the communicated copy of Z that FSDP2 all-gathers in float8, or, at
                   the extreme, Z and L stored in FP8 / MXFP8 / NVFP4. Orthonormality, the solves and the
                   head are measured on these dequantised copies.
  logits           the logits GEMM (h T) Z^T with both operands in FP8, as Transformer Engine and
                   DeepSeek-V3 run linear layers: the activation h T quantised along its row (the GEMM's
                   contraction axis, D), Z along its rows too. The head's effective matrix is the logits of
                   the basis vectors, W = q_a(T) q_w(Z)^T (row i of T is the activation of h = e_i), and
                   pinv drift, Penrose and pinv error are measured with it: W E - I is then what a token's
                   embedding, sent through the FP8 head, gives back. The embedding (two solves) and the
                   gradient models still see the stored fp32 Z and L.
  moments          Adam's m and v stored in FP8 after every update (Megatron's precision-aware optimizer
                   keeps exp_avg / exp_avg_sq in narrow formats), each moment one tensor of the recipe.
  gradients        the gradients of Z and L, as they reach the optimizer, through the recipe: NVIDIA's NVFP4
                   training recipe quantises the backward pass's gradients to NVFP4 with stochastic rounding
                   (`stochastic` names the roles rounded so), the forward pass to nearest. The nearest
                   twin of the same placement shows what the rounding mode alone changes.

All quantisation is the bit-exact emulation of pitcheck.numerics.scaling (float64 arithmetic where the tensor
lives, host or device, the decoded values then held in the policy's storage format), on CUDA too: native
float8 GEMMs are not used (the run's manifest lists this under `emulated`). Current, block and MX scaling are stateless: a resumed run recomputes
the same copies from the same master. Delayed scaling (`tensor-delayed`, its options in `recipe_options`) has
an amax history per tensor, and stochastic rounding draws noise: a run holds both in
pitcheck.numerics.quantisers, which checkpoints the histories and seeds the noise from the run's seed and step.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..infra.errors import PitcheckError
from .formats import FORMATS, round_to
from .scaling import fake_quant, get_recipe


@dataclass(frozen=True)
class Placement:
    name: str
    where: str  # where real training puts these formats, one line
    z_copy: str = ""  # recipe of the Z the model computes with
    l_copy: str = ""  # recipe of the L the model computes with
    logits: tuple[str, str] | None = None  # recipes of the logits GEMM's (activation, weight) operands
    moments: str = ""  # recipe Adam's moments are stored in
    gradients: str = ""  # recipe the gradients of Z and L pass through before the optimizer
    stochastic: tuple[str, ...] = ()  # the roles rounded stochastically (only "gradients" so far)
    recipe_options: tuple[tuple[str, object], ...] = ()  # options of every recipe here (scaling.get_recipe)

    def __post_init__(self):
        unknown = set(self.stochastic) - {"gradients"}
        if unknown or (self.stochastic and not self.gradients):
            raise PitcheckError(f"placement {self.name}: stochastic rounding is supported on its gradients only")

    @property
    def options(self) -> dict:
        return dict(self.recipe_options)

    def recipes(self) -> list[str]:
        return [r for r in (self.z_copy, self.l_copy, self.moments, self.gradients, *(self.logits or ())) if r]

    def roles(self) -> set[str]:
        """The roles this placement puts through a recipe."""
        return {role for role, recipe in (("z_copy", self.z_copy), ("l_copy", self.l_copy), ("logits", self.logits),
                                          ("moments", self.moments), ("gradients", self.gradients)) if recipe}

    def map_recipes(self) -> list[str]:
        """The recipes the maps pass through (the moments' only reach them through the steps)."""
        return [r for r in (self.z_copy, self.l_copy, *(self.logits or ())) if r]

    def u(self) -> float:
        """Unit roundoff of the coarsest element format the maps pass through (0: none)."""
        return max((FORMATS[get_recipe(r).element].u for r in self.map_recipes()), default=0.0)

    def describe(self) -> dict:
        d = {"name": self.name, "where": self.where}
        d.update({k: v for k, v in (("z_copy", self.z_copy), ("l_copy", self.l_copy), ("moments", self.moments),
                                    ("gradients", self.gradients)) if v})
        if self.logits:
            d["logits"] = {"activation": self.logits[0], "weight": self.logits[1]}
        if self.stochastic:
            d["stochastic_rounding"] = list(self.stochastic)
        if self.recipe_options:
            d["recipe_options"] = self.options
        return d


DELAYED_OPTIONS = (("history_len", 16), ("algo", "max"))

PLACEMENTS: dict[str, Placement] = {
    p.name: p
    for p in [
        Placement("logits-tensor", "TE's Float8CurrentScaling: the logits GEMM's operands in E4M3, one fp32 scale "
                  "per tensor", logits=("tensor-current", "tensor-current")),
        Placement("logits-block", "DeepSeek-V3: activations in 1 x 128 tiles, weights in 128 x 128 blocks, E4M3 "
                  "with fp32 scales", logits=("block-1x128", "block-128x128")),
        Placement("logits-mxfp8", "MXFP8 GEMM (Blackwell): both operands in 1 x 32 blocks with E8M0 scales",
                  logits=("mxfp8", "mxfp8")),
        Placement("logits-mxfp8-rceil", "MXFP8 GEMM with NVIDIA's scale rule 2^ceil(log2(amax / 448)): no block "
                  "maximum saturates", logits=("mxfp8-rceil", "mxfp8-rceil")),
        Placement("gathered-z", "FSDP2 float8 all-gather: the communicated Z in E4M3 with a per-tensor scale, the "
                  "fp32 master kept", z_copy="tensor-current"),
        Placement("adam-fp8", "Megatron's precision-aware optimizer: Adam's moments stored in E4M3, one scale per "
                  "moment tensor", moments="tensor-current"),
        Placement("store-fp8", "the extreme: Z and L stored in E4M3 with a per-tensor scale",
                  z_copy="tensor-current", l_copy="tensor-current"),
        Placement("store-mxfp8", "the extreme: Z and L stored in MXFP8 (1 x 32 blocks, E8M0 scales)",
                  z_copy="mxfp8", l_copy="mxfp8"),
        Placement("store-nvfp4", "the extreme: Z and L stored in NVFP4 (E2M1, an E4M3 scale per 16, an fp32 "
                  "global scale)", z_copy="nvfp4", l_copy="nvfp4"),
        # delayed scaling: TE's DelayedScaling with a 16-step window, algo max, margin 0. TE's default window
        # is 1024 steps; 16 keeps it a small part of the runs here (200-1000 steps), so that old amaxes do
        # leave the window, and max is TE's default algo
        Placement("logits-delayed", "TE's DelayedScaling: the logits GEMM's operands in E4M3, each scaled by "
                  "the max of its last 16 amaxes", logits=("tensor-delayed", "tensor-delayed"),
                  recipe_options=DELAYED_OPTIONS),
        Placement("adam-fp8-delayed", "Adam's moments stored in E4M3, each moment tensor scaled by the max of its "
                  "last 16 amaxes (TE's DelayedScaling)", moments="tensor-delayed", recipe_options=DELAYED_OPTIONS),
        Placement("grad-nvfp4", "the gradients in NVFP4 (1 x 16 blocks along D), rounded to nearest",
                  gradients="nvfp4"),
        Placement("grad-nvfp4-sr", "NVIDIA's NVFP4 training recipe: the gradients in NVFP4 with stochastic "
                  "rounding, seeded by the run's seed, step and tensor", gradients="nvfp4",
                  stochastic=("gradients",)),
    ]
}


def get_placement(name: str) -> Placement:
    try:
        return PLACEMENTS[name]
    except KeyError:
        raise PitcheckError(f"unknown placement {name!r}; choose from {', '.join(PLACEMENTS)}") from None


def through(x, recipe: str, native: bool | None = None):
    """x through the recipe and back (x's kind: numpy, or a float64 torch tensor on x's device), blocks
    along the rows (the contraction axis of every GEMM these tensors enter). native (None: for a CUDA
    tensor) casts with torch's float8 dtypes where the recipe has a native path (pitcheck.numerics.native_float8:
    equal to the emulation on float32 input, tested); otherwise, and on the CPU by default, the emulation."""
    if native is None:
        native = type(x).__module__.startswith("torch") and x.is_cuda
    if native and getattr(x, "ndim", 0) == 2:
        from . import native_float8  # deferred: it needs torch, which a numpy run never imports

        if native_float8.has_native_path(recipe):
            return native_float8.fake_quant(x, recipe)
    return fake_quant(x, get_recipe(recipe), axis=-1)


def quantised_head(Z, L: np.ndarray, placement: Placement, operands: tuple | None = None):
    """B = W^T of the FP8 logits GEMM, float64: q_w(Z) q_a(T)^T with T = L L^T (see the module doc), where Z
    lives: a torch Z's q_w(Z) and the product are formed on its device, T (D x D) and q_a(T) on the host.
    operands: the (activation, weight) Recipe instances to cast with (a run's, with their state); by default
    fresh ones of the placement's recipes."""
    if operands is None:
        operands = tuple(get_recipe(name, **placement.options) for name in placement.logits)
    activation, weight = operands
    T = L @ L.T
    q_T = fake_quant(T, activation, axis=-1)
    q_Z = fake_quant(Z, weight, axis=-1)
    if type(q_Z).__module__.startswith("torch"):
        import torch

        return q_Z @ torch.from_numpy(q_T).to(q_Z.device).T
    return q_Z @ q_T.T


def z_format(storage: str, placement: Placement | None) -> tuple[str, float]:
    """The format the model's Z is computed in, as a label, and its unit roundoff: the storage format, or the
    placement's recipe for Z's copy and that recipe's element format."""
    if placement is None or not placement.z_copy:
        return storage, FORMATS[storage].u
    element = get_recipe(placement.z_copy).element
    return f"{storage} via {placement.z_copy} ({element})", FORMATS[element].u


def stored_copy(Q: np.ndarray, storage: str, placement: Placement | None) -> np.ndarray:
    """Q (float64) as a model storing it in `storage` computes with it under the placement: the floor of
    an exactly orthonormal Q is the orthonormality of this copy."""
    fmt = FORMATS[storage]
    Q = Q if fmt.name == "fp64" else round_to(Q, fmt)
    if placement is None or not placement.z_copy:
        return Q
    return round_to(through(Q, placement.z_copy), fmt)
