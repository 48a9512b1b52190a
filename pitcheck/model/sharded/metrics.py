"""Metrics of a row-sharded model computed on the shards: every V-long sum is a D x D (or scalar)
all-reduce in float64, never a gather of Z. Each returns the same value on every rank, with the meaning
of the single-process metric of the same name in pitcheck.numerics.metrics.

Pass the rows the model uses (padding rows are zero and change nothing; a model that pads with copies
should be judged on its real rows and on its stored block, see tests/sharded_zoo).
"""
from __future__ import annotations

import math

import numpy as np
import torch

from ...infra.errors import PitcheckError
from ...numerics.metrics import unit_roundoff
from .comm import all_reduce_max, all_reduce_sum, broadcast_copy, rank_and_size, require_finite


def _f64(x: torch.Tensor, name: str, group) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or x.ndim != 2 or x.is_complex():
        raise PitcheckError(f"{name} must be a real 2-D torch tensor (this rank's row block), got "
                            f"{getattr(x, 'shape', type(x).__name__)}")
    x = x.detach().to(torch.float64)
    require_finite(x, name, group)
    return x


def gram_deviation(Z_local, group=None) -> np.ndarray:
    """Z^T Z - I of the full Z (float64, D x D) from the all-reduced local Grams."""
    Z = _f64(Z_local, "Z", group)
    G = all_reduce_sum(Z.T @ Z, group)
    return (G - torch.eye(G.shape[0], dtype=G.dtype, device=G.device)).cpu().numpy()


def orthonormality(Z_local, group=None) -> float:
    """||Z^T Z - I||_F of the assembled Z."""
    return float(np.linalg.norm(gram_deviation(Z_local, group)))


def orthonormality_ratio(Z_local, u: float, vocab_size: int, group=None) -> float:
    """LAPACK dqrt01's ratio ||I - Z^T Z||_1 / (V u) of the assembled Z (V the real vocabulary)."""
    u = unit_roundoff(u)
    return float(np.linalg.norm(gram_deviation(Z_local, group), 1) / (vocab_size * u))


def pinv_drift(E_local, B_local, group=None) -> float:
    """||W E - I||_F with W = B^T, from M = sum over ranks of E_r^T B_r (D x D). For PIT, E the embedding
    rows as the model computes them and B = Z T (so W E = T sum_r Z_r^T E_r)."""
    E, B = _f64(E_local, "E", group), _f64(B_local, "B", group)
    if E.shape != B.shape:
        raise PitcheckError(f"shape mismatch: E {tuple(E.shape)} and B {tuple(B.shape)} on this rank")
    M = all_reduce_sum(E.T @ B, group)
    return float(torch.linalg.norm(M - torch.eye(M.shape[0], dtype=M.dtype, device=M.device)))


def pit_pinv_drift(Z_local, L, E_local, group=None) -> float:
    """pinv_drift for PIT: W E = T (sum_r Z_r^T E_r), T = L L^T replicated."""
    Z, E = _f64(Z_local, "Z", group), _f64(E_local, "E", group)
    L = L.detach().to(device=Z.device, dtype=torch.float64)
    M = (L @ L.T) @ all_reduce_sum(Z.T @ E, group)
    return float(torch.linalg.norm(M - torch.eye(M.shape[0], dtype=M.dtype, device=M.device)))


def relative_distance(A_local, B_local, group=None) -> float:
    """||A - B||_F / ||B||_F of two row-sharded matrices laid out alike (squared norms all-reduced)."""
    A, B = _f64(A_local, "A", group), _f64(B_local, "B", group)
    if A.shape != B.shape:
        raise PitcheckError(f"shape mismatch: {tuple(A.shape)} and {tuple(B.shape)} on this rank")
    sums = all_reduce_sum(torch.stack([((A - B) ** 2).sum(), (B ** 2).sum()]), group)
    num, den = math.sqrt(float(sums[0])), math.sqrt(float(sums[1]))
    if den == 0:
        if num == 0:
            return 0.0
        raise PitcheckError("the reference is zero: a relative distance is undefined")
    return num / den


def shard_distance(Z_local, Z_single_local, u: float | None = None, group=None) -> float:
    """||Z_sharded - Z_single||_F / ||Z_single||_F in units of u: the sharded result against the
    single-process one on the same inputs, each rank passing its rows of both. u defaults to that of
    Z_local's dtype."""
    if u is None:
        u = torch.finfo(Z_local.dtype).eps / 2
    return relative_distance(Z_local, Z_single_local, group) / unit_roundoff(u)


def replica_spread(t: torch.Tensor, group=None) -> float:
    """max over ranks of ||t_r - t_0||_F for a tensor every rank should hold identically (T, L, any
    replicated parameter): exactly 0.0 when the replicas agree bit for bit."""
    if not isinstance(t, torch.Tensor):
        raise PitcheckError(f"replica_spread needs a torch tensor, got {type(t).__name__}")
    _, size = rank_and_size(group)
    if size == 1:
        return 0.0
    local = t.detach()
    first = broadcast_copy(local, 0, group)
    diff = (local.to(torch.float64) - first.to(torch.float64))
    gap = float(torch.linalg.norm(diff.reshape(-1))) if diff.numel() else 0.0
    if not math.isfinite(gap):  # a NaN on one rank is the widest spread, not a silent NaN
        gap = math.inf
    return all_reduce_max(gap, group)
