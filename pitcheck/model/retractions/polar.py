"""The polar factor of Z + xi three ways: by the SVD (`polar`), from the Gram's eigendecomposition
(`polar-gram`) and by Newton-Schulz to convergence (`polar-ns`); their stacked forms beside them."""
from __future__ import annotations

import numpy as np

from ...numerics.arrays import ops_for
from .common import _sym
from .registry import RetractionError, register, stacked_form
from .stacked import StackedOps, none_failed, replace_failed, stacked_sym, take


@register("polar", "#2ca02c", "s", table_order=5, sharded="retract_polar")
def retract_polar(Z, xi, ops=None):
    """Polar factor U V^T of Z + xi from a thin SVD: the nearest orthonormal matrix."""
    ops = ops or ops_for(Z)
    U, _, Vt = ops.svd(Z + xi)
    return ops.matmul(U, Vt)


@register("polar-gram", "#17becf", "D", table_order=0, sharded="retract_polar_gram")
def retract_polar_gram(Z, xi, ops=None):
    """Y (Y^T Y)^{-1/2} with the D x D inverse square root from eigh of the Gram matrix."""
    ops = ops or ops_for(Z)
    Y = Z + xi
    w, Q = ops.eigh(_sym(ops.matmul(Y.T, Y)))
    # eigh's eigenvalues are accurate to about u ||G|| each: one below D u ||G|| is indistinguishable from
    # zero (or rounded negative) and would give inf or NaN. This guards against breakdown only: above it,
    # the result's orthonormality error still grows like u ||G|| / w_min (a Gram squares cond(Y))
    w_min, w_max = w.min(), w.max()
    if hasattr(w_min, "double"):  # a tensor's: compared in float64 on its device, one read or a deferred check
        w_min, w_max = w_min.double(), w_max.double()
    if not ops.all_true(w_min > Y.shape[1] * ops.dtype_unit_roundoff(w) * w_max):
        raise RetractionError(f"polar-gram: Gram matrix of Z + xi is singular to working precision "
                              f"(eigenvalues {float(w_min):.3g} .. {float(w_max):.3g})")
    return ops.matmul(Y, ops.matmul(Q / ops.sqrt(w), Q.T))


@register("polar-ns", "#bcbd22", "v", table_order=1, sharded="retract_polar_ns")
def retract_polar_ns(Z, xi, ops=None, max_iter: int = 50):
    """Newton-Schulz Y <- Y (3I - Y^T Y)/2 iterated to convergence (the polar factor of Z + xi).

    Converges only when every singular value of Z + xi lies in (0, sqrt(3)); from a near-manifold
    point it converges quadratically. Stops when ||Y^T Y - I||_F stops decreasing.
    """
    ops = ops or ops_for(Z)
    Y = Z + xi
    eye = ops.eye(Y.shape[1], like=Y)
    prev = float("inf")
    for _ in range(max_iter):
        G = ops.matmul(Y.T, Y)
        err = ops.norm(G - eye)
        if not err < 0.5 * prev:
            if err > 1e-2:
                raise RetractionError(f"polar-ns did not converge (||Y^T Y - I||_F = {err:.3g})")
            break
        prev = err
        if err > 1.0:
            raise RetractionError(f"polar-ns: point too far from the manifold (||Y^T Y - I||_F = {err:.3g})")
        Y = ops.matmul(Y, 1.5 * eye - 0.5 * G)
    return Y



def reproject(Z, ops=None):
    """Nearest orthonormal matrix (polar factor): the re-projection used by the drift guards."""
    return retract_polar(Z, 0 * Z, ops)



@stacked_form("polar")
def stacked_polar(Z, xi, ops: StackedOps):
    U, _, Vt = ops.svd(Z + xi)
    return ops.matmul(U, Vt), none_failed(Z)


@stacked_form("polar-gram")
def stacked_polar_gram(Z, xi, ops: StackedOps):
    Y = Z + xi
    gram = stacked_sym(ops.matmul(ops.t(Y), Y), ops)
    # an overflowed Gram makes eigh raise for the whole stack: its matrix is failed, the stack goes on
    overflowed = ~ops.finite(gram)
    w, Q = ops.eigh(replace_failed(gram, overflowed, ops))
    u = ops.base.dtype_unit_roundoff(w)
    w_np = w.detach().cpu().numpy() if ops.torch else w
    # retract_polar_gram's guard, per matrix (float(w.min()) there: the same comparison in float64)
    failed = overflowed | ~(w_np.min(-1).astype(np.float64) > Y.shape[-1] * u * w_np.max(-1).astype(np.float64))
    # a failed matrix's eigenvalues may be 0 or negative: its result is discarded (the mask), so numpy's
    # warnings about its square root and division would be noise
    with np.errstate(invalid="ignore", divide="ignore"):
        return ops.matmul(Y, ops.matmul(Q / ops.sqrt(w)[..., None, :], ops.t(Q))), failed



@stacked_form("polar-ns")
def stacked_polar_ns(Z, xi, ops: StackedOps, max_iter: int = 50):
    """retract_polar_ns per matrix: each matrix iterates until its own ||Y^T Y - I||_F stops halving, and
    only the still-active matrices are stepped (a stopped one keeps its Y as its loop returns it). `failed`:
    the matrices for which retract_polar_ns raises RetractionError (no convergence, or too far from the
    manifold). Each error is ops.norm of that one matrix, a Python float as there: a norm over the stack
    sums in another order (numpy's differs from the matrix's own at most shapes)."""
    Y = Z + xi
    B = Y.shape[0]
    eye = ops.eye(Y.shape[-1], like=Y)
    prev = np.full(B, np.inf)  # float64, as the one-matrix loop's Python floats
    failed = none_failed(Z)
    active = np.arange(B)
    for _ in range(max_iter):
        Ya = Y if len(active) == B else take(Y, active, ops)
        G = ops.matmul(ops.t(Ya), Ya)
        err = np.array([ops.base.norm(d) for d in G - eye], dtype=np.float64)
        stop = ~(err < 0.5 * prev[active])
        failed[active[stop & (err > 1e-2)]] = True  # did not converge
        go = ~stop
        prev[active[go]] = err[go]
        far = go & (err > 1.0)  # too far from the manifold
        failed[active[far]] = True
        go &= ~far
        if not go.any():
            break
        if go.all():
            Y_new = ops.matmul(Ya, 1.5 * eye - 0.5 * G)
        else:
            index = np.flatnonzero(go)
            Y_new = ops.matmul(take(Ya, index, ops), 1.5 * eye - 0.5 * take(G, index, ops))
        active = active[go]
        if len(active) == B:
            Y = Y_new
        else:
            Y[ops.torch.from_numpy(active).to(Y.device) if ops.torch else active] = Y_new
    return Y, failed
