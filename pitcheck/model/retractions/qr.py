"""The Q factor of Z + xi with diag(R) > 0: Householder QR (`qr`), Cholesky-QR (`cholqr`) and
Cholesky-QR twice (`cholqr2`); their stacked forms beside them."""
from __future__ import annotations

import numpy as np

from ...numerics.arrays import ops_for
from .common import _contiguous, _plain_torch, _sym
from .registry import RetractionError, register, stacked_form
from .stacked import StackedOps, none_failed, replace_failed, stacked_sym


def _scale_columns_into_row_major(Q, scale):
    """Q * scale written straight into a row-major array: one pass over LAPACK's column-major Q instead
    of a scaled column-major copy and then a transposing one."""
    if hasattr(Q, "is_contiguous"):
        import torch

        return torch.mul(Q, scale, out=torch.empty(Q.shape, dtype=Q.dtype, device=Q.device))
    import numpy as np

    return np.multiply(Q, scale, out=np.empty(Q.shape, dtype=Q.dtype))


def _upper_inverse_right(Y, C, ops):
    """Y C^{-T} for a lower-triangular Cholesky factor C (Y R^{-1} with R = C^T): the D x D triangular
    inverse, then one GEMM (a V-sized triangular solve on a transposed operand is several times slower)."""
    eye = ops.eye(C.shape[0], like=C)
    Cinv = ops.solve_triangular(C, eye, lower=True)  # C^{-1}, lower
    return _contiguous(ops.matmul(Y, Cinv.T))


def _chol_gram(Y, ops, name):
    try:
        return ops.cholesky(_sym(ops.matmul(Y.T, Y)))
    except Exception as exc:  # LinAlgError (numpy) or torch's linalg error
        raise RetractionError(f"{name}: Gram matrix not positive definite ({type(exc).__name__})") from None


# From this many entries of Z, `qr` forms its Q as Y R^{-1} (geqrf's R, one GEMM) instead of by orgqr:
# measured on one CPU thread (fp32, ratios to the Z^T Z GEMM), torch's geqrf + the GEMM take 2.8-7.0 where
# geqrf + orgqr take 4.3-8.4 (2048 x 32 to 65536 x 32). Below it the grid's cells keep orgqr's bits (and
# the stacked forms theirs), where either costs a few library calls.
QR_BY_SOLVE_MIN_ELEMENTS = 2**16
# ... while ||R^T R - I||_F (= ||Y^T Y - I||_F to rounding) is at most this: then cond(Y) <= sqrt(3), and
# Y R^{-1}'s loss of orthogonality, about cond(Y) u, stays within twice Householder's (measured at
# 8192 x 128 fp32: 0.003 against orgqr's 0.004 in units of V u one step from the manifold; 0.025 against
# 0.004 at cond 10, 0.65 at 10^3). A Y further from orthonormal gets orgqr's Q.
QR_BY_SOLVE_MAX_GRAM_DEVIATION = 0.5


def _qr_by_solve_applies(Y, ops) -> bool:
    """Y R^{-1} is taken for a large CPU matrix in plain arithmetic (numpy's float64, torch's own dtype):
    emulated tf32 or half-precision matmuls would round the GEMM that forms Q, where orgqr's Q is full
    precision. CUDA keeps orgqr's Q: the solve was measured on a CPU only."""
    V, D = Y.shape
    if V * D < QR_BY_SOLVE_MIN_ELEMENTS or V < D:
        return False
    if getattr(ops, "name", "") == "numpy":
        return Y.dtype == np.float64
    return _plain_torch(ops) and Y.device.type == "cpu"


def _qr_by_solve(Y, ops):
    """The Q of Y's positive-diagonal Householder QR as Y R^{-1}, with R geqrf's (rows signed so that its
    diagonal is positive); None where Y is too far from orthonormal for that to keep Householder's
    orthogonality (see QR_BY_SOLVE_MAX_GRAM_DEVIATION)."""
    R = ops.householder_r(Y)
    R = R * ops.sign_nonzero(ops.diag(R))[:, None]
    eye = ops.eye(R.shape[0], like=R)
    deviation = ops.norm(ops.matmul(R.T, R) - eye)  # D^3, against the V D^2 of the factorisation
    if not deviation <= QR_BY_SOLVE_MAX_GRAM_DEVIATION:  # NaN too: orgqr's path sees what it always saw
        return None
    return ops.matmul(Y, ops.solve_triangular(R, eye, lower=False))


@register("qr", "#1f77b4", "o", table_order=4, sharded="retract_qr")
def retract_qr(Z, xi, ops=None):
    """Q factor of Householder QR of Z + xi with signs fixed so diag(R) > 0 (unique, continuous).

    Large CPU matrices near the manifold form Q as Y R^{-1} from Householder's R (one GEMM, no orgqr):
    the same Q to rounding, as orthogonal (QR_BY_SOLVE_MIN_ELEMENTS, QR_BY_SOLVE_MAX_GRAM_DEVIATION)."""
    ops = ops or ops_for(Z)
    Y = Z + xi
    if _qr_by_solve_applies(Y, ops):
        Q = _qr_by_solve(Y, ops)
        if Q is not None:
            return Q
    Q, R = ops.qr(Y)
    return _scale_columns_into_row_major(Q, ops.sign_nonzero(ops.diag(R)))


@register("cholqr", "#9467bd", "^", table_order=2, sharded="retract_cholqr")
def retract_cholqr(Z, xi, ops=None):
    """Cholesky-QR: Y R^{-1} with R^T R = Y^T Y; cheap, but loses orthogonality like cond(Y)^2 u."""
    ops = ops or ops_for(Z)
    Y = Z + xi
    C = _chol_gram(Y, ops, "cholqr")
    # Y R^{-1} with R = C^T is the solution of C X^T = Y^T
    return _contiguous(ops.solve_triangular(C, Y.T, lower=True).T)


@register("cholqr2", "#8c564b", "<", table_order=3, sharded="retract_cholqr2")
def retract_cholqr2(Z, xi, ops=None):
    """Cholesky-QR twice (Yamamoto et al. 2015): Y R1^{-1}, then the same for that result.

    One step from the manifold cond(Z + xi) is far below u^{-1/2}, where the second pass brings the
    orthogonality to O(u) like Householder QR. Two Grams and two applies (each a GEMM with a D x D
    triangular inverse): about 4 GEMM units against Householder QR's lower BLAS-3 efficiency. The
    result is the QR factor of Z + xi (diag(R) > 0), so it agrees with `qr` up to rounding.
    """
    ops = ops or ops_for(Z)
    Y = Z + xi
    Y1 = _upper_inverse_right(Y, _chol_gram(Y, ops, "cholqr2"), ops)
    return _upper_inverse_right(Y1, _chol_gram(Y1, ops, "cholqr2 (second pass)"), ops)



@stacked_form("qr")
def stacked_qr(Z, xi, ops: StackedOps):
    if Z.shape[-2] * Z.shape[-1] >= QR_BY_SOLVE_MIN_ELEMENTS:  # retract_qr may form Q by a solve there
        stack = ops.torch.stack if ops.torch else np.stack
        return stack([retract_qr(z, x, ops.base) for z, x in zip(Z, xi)]), none_failed(Z)
    Q, R = ops.qr(Z + xi)
    # row-major, as _scale_columns_into_row_major writes it (a column-major Z is another checkpoint file)
    return ops.contiguous(Q * ops.sign_nonzero(ops.diagonal(R))[..., None, :]), none_failed(Z)


def _stacked_chol_gram(Y, ops: StackedOps):
    return ops.cholesky(stacked_sym(ops.matmul(ops.t(Y), Y), ops))


@stacked_form("cholqr")
def stacked_cholqr(Z, xi, ops: StackedOps):
    Y = Z + xi
    C, failed = _stacked_chol_gram(Y, ops)
    # a failed factor may be singular: a solve with it would raise for the whole stack
    C = replace_failed(C, failed, ops)
    return ops.contiguous(ops.t(ops.solve_triangular(C, ops.t(Y), lower=True))), failed


def _stacked_upper_inverse_right(Y, C, ops: StackedOps):
    eye = ops.eye(C.shape[-1], like=C)
    Cinv = ops.solve_triangular(C, eye.expand(C.shape) if ops.torch else np.broadcast_to(eye, C.shape), lower=True)
    return ops.contiguous(ops.matmul(Y, ops.t(Cinv)))


@stacked_form("cholqr2")
def stacked_cholqr2(Z, xi, ops: StackedOps):
    Y = Z + xi
    C, failed = _stacked_chol_gram(Y, ops)
    # a failed factor is garbage: its matrix is the unbatched engine's to redo; keep the stack finite
    C = replace_failed(C, failed, ops)
    Y1 = _stacked_upper_inverse_right(Y, C, ops)
    C1, failed1 = _stacked_chol_gram(Y1, ops)
    C1 = replace_failed(C1, failed1, ops)
    return _stacked_upper_inverse_right(Y1, C1, ops), failed | failed1
