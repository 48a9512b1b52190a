"""Precision policies: where every quantity of a PIT model lives.

A policy names the storage format of Z and L (what the model computes with, embedding and head), the
master copy the optimizer updates (mixed policies keep it in fp32), the dtype of factorisations and
solves (torch has no half-precision QR/SVD/eigh/Cholesky/triangular solve, so those are upcast), the
matmul precision of the optimizer step and retraction, the gradient format and whether fp16 loss
scaling is on, and optionally a placement (pitcheck.numerics.placement): which of PIT's tensors pass through an
8- or 4-bit format and its scaling recipe. `describe()` goes into every run's manifest.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from ..infra.errors import PitcheckError
from .formats import FORMATS
from .placement import Placement, get_placement


@dataclass(frozen=True)
class Policy:
    name: str
    storage: str  # format of the Z and L the model computes with
    master: str  # format the optimizer updates (== storage unless mixed)
    factor: str  # dtype of QR/SVD/eigh/Cholesky/triangular solves
    matmul: str  # format of matmul operands in the optimizer step and retraction (fp32 accumulation)
    gradient: str  # format gradients arrive in
    loss_scaling: bool = False
    placement_name: str = ""  # pitcheck.numerics.placement: the tensors in 8- or 4-bit formats ("" none)

    @property
    def placement(self) -> Placement | None:
        return get_placement(self.placement_name) if self.placement_name else None

    @property
    def u(self) -> float:
        """Unit roundoff of the coarsest format the maps' data passes through: the unit errors are reported in."""
        placed = self.placement.u() if self.placement else 0.0
        return max(FORMATS[self.storage].u, FORMATS[self.matmul].u, placed)

    @property
    def solve_u(self) -> float:
        """Unit roundoff of T's triangular solves: their arithmetic and the rows they store. A copy of Z or L in
        an 8- or 4-bit format is their input, the same for both maps, and a coarser matmul or logits GEMM is
        not in them: a solve's forward error is about cond(T) times this."""
        return max(FORMATS[self.storage].u, FORMATS[self.factor].u)

    @property
    def mixed(self) -> bool:
        return self.master != self.storage

    def describe(self) -> dict:
        d = asdict(self)
        del d["placement_name"]  # the manifests of policies without one stay as they were
        if self.placement:
            d["placement"] = self.placement.describe()
        d["u"] = self.u
        return d


POLICIES: dict[str, Policy] = {
    p.name: p
    for p in [
        Policy("fp64", "fp64", "fp64", "fp64", "fp64", "fp64"),
        Policy("fp32", "fp32", "fp32", "fp32", "fp32", "fp32"),
        Policy("tf32", "fp32", "fp32", "fp32", "tf32", "fp32"),
        Policy("bf16", "bf16", "bf16", "fp32", "bf16", "bf16"),
        Policy("fp16", "fp16", "fp16", "fp32", "fp16", "fp16", loss_scaling=True),
        # as under AMP, the optimizer step (retraction included) runs on the fp32 master in fp32
        Policy("bf16-mixed", "bf16", "fp32", "fp32", "fp32", "bf16"),
        Policy("fp16-mixed", "fp16", "fp32", "fp32", "fp32", "fp16", loss_scaling=True),
        # fp32 training with one placement each (pitcheck.numerics.placement): the precision frontier
        *(Policy(name, "fp32", "fp32", "fp32", "fp32", "fp32", placement_name=placement)
          for name, placement in (("fp8-logits", "logits-tensor"), ("fp8-logits-block", "logits-block"),
                                  ("mxfp8-logits", "logits-mxfp8"),
                                  ("mxfp8-rceil-logits", "logits-mxfp8-rceil"), ("fp8-gathered-z", "gathered-z"),
                                  ("fp8-adam", "adam-fp8"), ("fp8-store", "store-fp8"),
                                  ("mxfp8-store", "store-mxfp8"), ("nvfp4-store", "store-nvfp4"),
                                  ("fp8-logits-delayed", "logits-delayed"), ("fp8-adam-delayed", "adam-fp8-delayed"),
                                  ("nvfp4-grad", "grad-nvfp4"), ("nvfp4-grad-sr", "grad-nvfp4-sr"))),
    ]
}


def get_policy(name: str) -> Policy:
    try:
        return POLICIES[name]
    except KeyError:
        raise PitcheckError(f"unknown precision {name!r}; choose from {', '.join(POLICIES)}") from None


@dataclass(frozen=True)
class PrecisionStyle:
    """How figures draw one precision: its own colour and marker (no two precisions share both)."""
    colour: str
    marker: str


# one entry per policy of POLICIES: the seven storage precisions keep the colours figures have always given them
PRECISION_STYLES: dict[str, PrecisionStyle] = {name: PrecisionStyle(colour, marker) for name, colour, marker in (
    ("fp64", "#1f77b4", "o"), ("fp32", "#2ca02c", "s"), ("tf32", "#17becf", "D"), ("bf16", "#d62728", "^"),
    ("fp16", "#9467bd", "v"), ("bf16-mixed", "#ff7f0e", "<"), ("fp16-mixed", "#8c564b", ">"),
    ("fp8-logits", "#e377c2", "P"), ("fp8-logits-block", "#f7b6d2", "X"), ("mxfp8-logits", "#7f7f7f", "*"),
    ("mxfp8-rceil-logits", "#bcbd22", "h"), ("fp8-gathered-z", "#393b79", "p"), ("fp8-adam", "#637939", "d"),
    ("fp8-store", "#8c6d31", "H"), ("mxfp8-store", "#843c39", "8"), ("nvfp4-store", "#7b4173", "x"),
    ("fp8-logits-delayed", "#aec7e8", "+"), ("fp8-adam-delayed", "#98df8a", "1"), ("nvfp4-grad", "#ff9896", "2"),
    ("nvfp4-grad-sr", "#c5b0d5", "3"))}


def precision_style(name: str) -> PrecisionStyle:
    """The figure style of a precision (a policy's name); black dots for a name with none."""
    return PRECISION_STYLES.get(name, PrecisionStyle("#000000", "."))
