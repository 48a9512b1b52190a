"""Distributed retractions of a row-sharded Z (each rank holds a contiguous block of rows, zero padding
rows allowed): f(Z_local, xi_local, group=None, allreduce_dtype=None) -> the rank's block of the result.

Every Gram-based retraction is the single-process one of pitcheck.model.retractions with its V-long sums
(Y^T Y, Z^T xi, ||Y||_F^2) all-reduced over the ranks; the D x D algebra runs identically on every rank
(the all-reduce hands every rank the same bits, so control flow and breakdowns agree) and the apply step
is local. `qr` is TSQR: a local Householder QR, the ranks' R factors gathered and stacked, one small QR of
the stack, its Q block applied back, signs fixed so diag(R) > 0 as the single-process qr fixes them;
`polar` is TSQR followed by the SVD of the D x D R. Cayley's low-rank form needs three D x D Grams,
all-reduced as one packed buffer. None forms a V x V matrix or gathers Z.

Which map has a distributed form is its record's in pitcheck.model.retractions (`sharded=` names the
function here); SHARDED_RETRACTIONS is that view.

The result equals the single-process retraction to within rounding, not bitwise: the Gram's sum runs in a
different order (see tests/model/sharded/test_sharded.py for the bound and the measured distance).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist

from ...numerics.arrays import TorchOps
from ...infra.errors import PitcheckError
from ..retractions import (NS5_COEFFICIENTS, RECORDS, RetractionError, _add_products, _contiguous, _sym,
                           _upper_inverse_right)
from .comm import all_reduce_sum, allreduce_dtype as _check_dtype, rank_and_size

def get_sharded_retraction(name: str) -> Callable:
    """The distributed form of the registered map `name`."""
    try:
        return SHARDED_RETRACTIONS[name]
    except KeyError:
        raise PitcheckError(f"no distributed retraction {name!r}; choose from {', '.join(SHARDED_RETRACTIONS)}") from None


def gram(A: torch.Tensor, B: torch.Tensor | None = None, group=None, dtype=None) -> torch.Tensor:
    """A^T B (A^T A without B) summed over the ranks' row blocks: the D x D all-reduce every retraction uses."""
    local = A.T @ (A if B is None else B)
    return all_reduce_sum(local, group, dtype)


def global_norm(A: torch.Tensor, group=None, dtype=None) -> float:
    """||A||_F of the row-sharded matrix (the squared norms all-reduced)."""
    sq = all_reduce_sum((A * A).sum().reshape(1), group, dtype)
    return float(sq.sqrt().item())


def tangent_projection(Z, G, group=None, allreduce_dtype=None):
    """P_Z(G) = G - Z sym(Z^T G) for row-sharded Z and G (the single-process one's Z^T G all-reduced)."""
    return G - Z @ _sym(gram(Z, G, group, _check_dtype(allreduce_dtype)))


def retract_none(Z, xi, group=None, allreduce_dtype=None):
    return Z + xi


def _cholesky(G, name):
    try:
        return torch.linalg.cholesky(_sym(G))
    except Exception as exc:  # torch's linalg error: the same G on every rank, so every rank raises
        raise RetractionError(f"{name}: Gram matrix not positive definite ({type(exc).__name__})") from None


def retract_cholqr(Z, xi, group=None, allreduce_dtype=None):
    """Cholesky-QR with the Gram all-reduced; the apply Y R^{-1} is local."""
    dtype = _check_dtype(allreduce_dtype)
    Y = Z + xi
    C = _cholesky(gram(Y, None, group, dtype), "cholqr")
    return _contiguous(torch.linalg.solve_triangular(C, Y.T, upper=False).T)


def retract_cholqr2(Z, xi, group=None, allreduce_dtype=None):
    """Cholesky-QR twice: two all-reduced Grams, two local applies."""
    ops, dtype = TorchOps(), _check_dtype(allreduce_dtype)
    Y = Z + xi
    Y1 = _upper_inverse_right(Y, _cholesky(gram(Y, None, group, dtype), "cholqr2"), ops)
    return _upper_inverse_right(Y1, _cholesky(gram(Y1, None, group, dtype), "cholqr2 (second pass)"), ops)


def retract_polar_gram(Z, xi, group=None, allreduce_dtype=None):
    """Y (Y^T Y)^{-1/2} with the inverse square root from eigh of the all-reduced Gram."""
    ops = TorchOps()
    Y = Z + xi
    w, Q = torch.linalg.eigh(_sym(gram(Y, None, group, _check_dtype(allreduce_dtype))))
    w_min, w_max = float(w.min()), float(w.max())
    if not w_min > Y.shape[1] * ops.dtype_unit_roundoff(w) * w_max:
        raise RetractionError(f"polar-gram: Gram matrix of Z + xi is singular to working precision "
                              f"(eigenvalues {w_min:.3g} .. {w_max:.3g})")
    return Y @ ((Q / torch.sqrt(w)) @ Q.T)


def retract_polar_ns(Z, xi, group=None, allreduce_dtype=None, max_iter: int = 50):
    """Newton-Schulz to convergence, one Gram all-reduce per iteration; the stopping test reads the
    all-reduced Gram, so every rank stops at the same iteration."""
    dtype = _check_dtype(allreduce_dtype)
    Y = Z + xi
    eye = torch.eye(Y.shape[1], dtype=Y.dtype, device=Y.device)
    prev = float("inf")
    for _ in range(max_iter):
        G = gram(Y, None, group, dtype)
        err = float(torch.linalg.norm(G - eye))
        if not err < 0.5 * prev:
            if err > 1e-2:
                raise RetractionError(f"polar-ns did not converge (||Y^T Y - I||_F = {err:.3g})")
            break
        prev = err
        if err > 1.0:
            raise RetractionError(f"polar-ns: point too far from the manifold (||Y^T Y - I||_F = {err:.3g})")
        Y = Y @ (1.5 * eye - 0.5 * G)
    return Y


def retract_ns5(Z, xi, group=None, allreduce_dtype=None, steps: int = 5):
    """APPROXIMATE (see pitcheck.model.retractions.retract_ns5): the Frobenius norm and each X^T X all-reduced,
    as Emerging-Optimizers' distributed Newton-Schulz all-reduces X X^T."""
    dtype = _check_dtype(allreduce_dtype)
    a, b, c = NS5_COEFFICIENTS
    X = Z + xi
    X = X / (global_norm(X, group, dtype) + 1e-7)
    for _ in range(steps):
        A = gram(X, None, group, dtype)
        X = a * X + X @ (b * A + c * (A @ A))
    return _contiguous(X)


def retract_cayley(Z, xi, group=None, allreduce_dtype=None):
    """Exact Cayley transform in low-rank form (pitcheck.model.retractions.retract_cayley) with Z^T Z, Z^T xi
    and xi^T xi all-reduced in one packed 3 x D x D buffer; the apply [Z, xi] K is local."""
    dtype = _check_dtype(allreduce_dtype)
    packed = all_reduce_sum(torch.stack([Z.T @ Z, Z.T @ xi, xi.T @ xi]), group, dtype)
    G, A, X = packed[0], packed[1], packed[2]
    GA = G @ A
    Ztg = A - 0.5 * GA
    gtg = X - A.T @ A + 0.25 * (A.T @ GA)
    VtU = torch.cat([torch.cat([Ztg, G], 1), torch.cat([-gtg, -Ztg.T], 1)], 0)
    VtZ = torch.cat([G, -Ztg.T], 0)
    K = torch.linalg.solve(torch.eye(VtU.shape[0], dtype=VtU.dtype, device=VtU.device) - 0.5 * VtU, VtZ)
    D = Z.shape[1]
    K1, K2 = K[:D], K[D:]
    return _add_products(Z, [(xi, K1), (Z, K2 - 0.5 * (A @ K1))], TorchOps())


def tsqr(Y: torch.Tensor, group=None, allreduce_dtype=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Q (this rank's rows) and R (D x D, on every rank) of the row-sharded Y = Q R, diag(R) > 0.

    Each rank factors its block (Q_r R_r, R_r with min(rows, D) rows); the R_r are all-gathered (in
    allreduce_dtype if given) and stacked in rank order; the QR of that stack gives R and, block by
    block, the small Q_s applied back: Q_r Q_s[r]. Every rank factors the same stack, so R agrees.
    """
    dtype = _check_dtype(allreduce_dtype)
    D = Y.shape[1]
    Q_local, R_local = torch.linalg.qr(Y)
    k = R_local.shape[0]  # min(local rows, D)
    _, size = rank_and_size(group)
    if size > 1:
        padded = Y.new_zeros((D, D))
        padded[:k] = R_local
        padded = padded.to(dtype) if dtype is not None else padded
        parts = [torch.empty_like(padded) for _ in range(size)]
        dist.all_gather(parts, padded, group=group)
        counts = [torch.zeros(1, dtype=torch.int64, device=Y.device) for _ in range(size)]
        dist.all_gather(counts, torch.tensor([k], dtype=torch.int64, device=Y.device), group=group)
        counts = [int(c.item()) for c in counts]
        stack = torch.cat([p[:c].to(Y.dtype) for p, c in zip(parts, counts)], 0)
        rank, _ = rank_and_size(group)
        offset = sum(counts[:rank])
    else:
        stack, offset = R_local, 0
    if stack.shape[0] < D:
        raise RetractionError(f"qr: the sharded matrix has {stack.shape[0]} rows in all, fewer than D = {D}")
    Q_stack, R = torch.linalg.qr(stack)
    Q = Q_local @ Q_stack[offset:offset + k]
    sign = torch.where(torch.diagonal(R) < 0, -1.0, 1.0).to(R.dtype)
    return _contiguous(Q * sign), sign[:, None] * R


def retract_qr(Z, xi, group=None, allreduce_dtype=None):
    """The Q of TSQR of Z + xi with diag(R) > 0: the single-process qr's result up to rounding."""
    return tsqr(Z + xi, group, allreduce_dtype)[0]


def retract_polar(Z, xi, group=None, allreduce_dtype=None):
    """Polar factor of Z + xi: TSQR, then Q (U V^T) from the SVD U S V^T of the D x D R."""
    Q, R = tsqr(Z + xi, group, allreduce_dtype)
    U, _, Vt = torch.linalg.svd(R)
    return Q @ (U @ Vt)


# name -> distributed form: the ones the registry's records name (pitcheck.model.retractions), in its order
SHARDED_RETRACTIONS: dict[str, Callable] = {name: globals()[r.sharded] for name, r in RECORDS.items() if r.sharded}
