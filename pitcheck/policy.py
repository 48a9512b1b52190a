"""Precision policies: where every quantity of a PIT model lives.

A policy names the storage format of Z and L (what the model computes with, embedding and head), the
master copy the optimizer updates (mixed policies keep it in fp32), the dtype of factorisations and
solves (torch has no half-precision QR/SVD/eigh/Cholesky/triangular solve, so those are upcast), the
matmul precision of the optimizer step and retraction, the gradient format and whether fp16 loss
scaling is on. `describe()` goes into every run's manifest.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from .errors import PitcheckError
from .formats import FORMATS


@dataclass(frozen=True)
class Policy:
    name: str
    storage: str  # format of the Z and L the model computes with
    master: str  # format the optimizer updates (== storage unless mixed)
    factor: str  # dtype of QR/SVD/eigh/Cholesky/triangular solves
    matmul: str  # format of matmul operands in the optimizer step and retraction (fp32 accumulation)
    gradient: str  # format gradients arrive in
    loss_scaling: bool = False

    @property
    def u(self) -> float:
        """Unit roundoff of the coarsest format the data passes through: the unit errors are reported in."""
        return max(FORMATS[self.storage].u, FORMATS[self.matmul].u)

    @property
    def mixed(self) -> bool:
        return self.master != self.storage

    def describe(self) -> dict:
        d = asdict(self)
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
    ]
}


def get_policy(name: str) -> Policy:
    try:
        return POLICIES[name]
    except KeyError:
        raise PitcheckError(f"unknown precision {name!r}; choose from {', '.join(POLICIES)}") from None
