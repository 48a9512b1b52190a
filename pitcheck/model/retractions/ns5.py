"""`ns5`: Muon's quintic Newton-Schulz orthogonalisation, approximate (it does not land on the manifold)."""
from __future__ import annotations

from ...numerics.arrays import ops_for
from .common import _contiguous
from .registry import register


# Muon's quintic Newton-Schulz coefficients (Jordan et al. 2024): fast, not convergent
NS5_COEFFICIENTS = (3.4445, -4.7750, 2.0315)


@register("ns5", "#637939", "p", table_order=8, sharded="retract_ns5",
          approximate="Muon's 5 quintic Newton-Schulz steps leave singular values in about [0.7, 1.2]")
def retract_ns5(Z, xi, ops=None, steps: int = 5):
    """APPROXIMATE, not a retraction: Muon-style orthogonalisation of Z + xi by 5 quintic Newton-Schulz
    steps X <- a X + b X (X^T X) + c X (X^T X)^2 with (a, b, c) = (3.4445, -4.7750, 2.0315), after
    scaling by the Frobenius norm.

    The coefficients trade convergence for speed: singular values land in about [0.7, 1.2], so
    ||X^T X - I||_F is O(0.1-1), even from a point on the manifold (it does not fix Z, so it does not
    agree with Z + xi even to zeroth order). Muon tolerates that; PIT's W E = I does not. Here to show
    why, next to its cost: 3 GEMM units per step.
    """
    ops = ops or ops_for(Z)
    a, b, c = NS5_COEFFICIENTS
    X = Z + xi
    X = X / (ops.norm(X) + 1e-7)
    for _ in range(steps):
        A = ops.matmul(X.T, X)
        B = b * A + c * ops.matmul(A, A)
        X = a * X + ops.matmul(X, B)
    return _contiguous(X)
