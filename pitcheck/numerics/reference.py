"""Reference PIT in float64 numpy/scipy.

Z is the V x D orthonormal token memory, L the lower-triangular Cholesky factor of T = L L^T with a
positive diagonal. Embedding rows are e_v = T^{-1} z_v by two triangular solves; logits are (h T) Z^T.
E = Z T^{-1} (V x D) and W = T Z^T (D x V) are formed only by the helpers that say so.
"""
from __future__ import annotations

import numpy as np
import scipy.linalg

from ..infra.errors import PitcheckError


def check_shapes(vocab: int, dim: int) -> None:
    if dim < 1 or vocab < 1:
        raise PitcheckError(f"vocab and dim must be positive (got V={vocab}, D={dim})")
    if vocab < dim:
        raise PitcheckError(f"V={vocab} < D={dim}: a V x D memory cannot have orthonormal columns")


def random_memory(vocab: int, dim: int, rng: np.random.Generator) -> np.ndarray:
    """Orthonormal V x D memory: sign-fixed QR of a Gaussian (Haar-distributed)."""
    check_shapes(vocab, dim)
    q, r = np.linalg.qr(rng.standard_normal((vocab, dim)))
    return q * np.where(np.diag(r) < 0, -1.0, 1.0)


def table_svd(table: np.ndarray, what: str = "teacher embedding") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The thin SVD P, s, Q^T of a V x D embedding table in float64, refused in one line where it is not a
    finite 2-D table of full rank (then its polar factor and pseudo-inverse are not unique)."""
    table = np.asarray(table, dtype=np.float64)
    if table.ndim != 2:
        raise PitcheckError(f"{what} must be 2-D (V x D), got shape {table.shape}")
    check_shapes(*table.shape)
    if not np.isfinite(table).all():
        raise PitcheckError(f"{what} has non-finite entries")
    p, s, qt = np.linalg.svd(table, full_matrices=False)
    if not s[-1] > s[0] * table.shape[0] * np.finfo(np.float64).eps:
        raise PitcheckError(f"{what} is rank deficient (singular values {s[0]:.3g} ... {s[-1]:.3g}): its polar "
                            "factor and pseudo-inverse are not unique")
    return p, s, qt


def polar_memory(teacher: np.ndarray) -> np.ndarray:
    """Memory from a teacher embedding E0 = P S Q^T: its polar factor P Q^T (nearest orthonormal)."""
    p, _, qt = table_svd(teacher)
    return p @ qt


def spd_with_condition(dim: int, cond: float, rng: np.random.Generator) -> np.ndarray:
    """SPD T = Q diag(s) Q^T with eigenvalues geometrically spaced from 1 to 1/cond (randsvd mode 3)."""
    if cond < 1:
        raise PitcheckError(f"a condition number is >= 1, got {cond}")
    q, r = np.linalg.qr(rng.standard_normal((dim, dim)))
    q = q * np.where(np.diag(r) < 0, -1.0, 1.0)
    s = cond ** (-np.arange(dim) / max(dim - 1, 1))
    t = (q * s) @ q.T
    return 0.5 * (t + t.T)


def cholesky_factor(t: np.ndarray) -> np.ndarray:
    """Lower Cholesky factor of an SPD matrix, with a clear error if T is not SPD."""
    t = np.asarray(t, dtype=np.float64)
    if t.ndim != 2 or t.shape[0] != t.shape[1]:
        raise PitcheckError(f"T must be square, got shape {t.shape}")
    if not np.isfinite(t).all():
        raise PitcheckError("T has non-finite entries")
    if not np.allclose(t, t.T, rtol=0, atol=1e-12 * np.abs(t).max()):
        raise PitcheckError("T is not symmetric")
    try:
        return np.linalg.cholesky(t)
    except np.linalg.LinAlgError:
        raise PitcheckError("T is not positive definite: Cholesky broke down") from None


def softplus_inverse(y: np.ndarray) -> np.ndarray:
    """Raw diagonal parameter r with softplus(r) = y; L's diagonal must be positive."""
    y = np.asarray(y, dtype=np.float64)
    if not np.all(y > 0):
        raise PitcheckError("L has a non-positive diagonal entry: T = L L^T is singular or not SPD")
    return y + np.log(-np.expm1(-y))


def check_ids(ids, vocab: int) -> np.ndarray:
    ids = np.asarray(ids)
    if ids.dtype.kind not in "iu":
        raise PitcheckError(f"token ids must be integers, got dtype {ids.dtype}")
    if ids.size and (ids.min() < 0 or ids.max() >= vocab):
        raise PitcheckError(f"token id out of range [0, {vocab}): min {ids.min()}, max {ids.max()}")
    return ids


def embed(Z: np.ndarray, L: np.ndarray, ids) -> np.ndarray:
    """Embedding rows e_v = T^{-1} z_v for the given token ids, by two triangular solves."""
    ids = check_ids(ids, Z.shape[0])
    diag = np.diag(L)
    # a zero or non-finite pivot would make the solves divide by zero or spread NaN: say so instead
    if L.shape != (Z.shape[1], Z.shape[1]) or not (np.isfinite(L).all() and (diag > 0).all()):
        raise PitcheckError(f"L must be a finite {Z.shape[1]} x {Z.shape[1]} factor with a positive diagonal")
    rhs = Z[ids].T  # D x B
    y = scipy.linalg.solve_triangular(L, rhs, lower=True, check_finite=False)
    return scipy.linalg.solve_triangular(L, y, lower=True, trans="T", check_finite=False).T


def embedding_matrix(Z: np.ndarray, L: np.ndarray) -> np.ndarray:
    """E = Z T^{-1} (V x D): every row embedded. O(V D^2)."""
    return embed(Z, L, np.arange(Z.shape[0]))


def logits(Z: np.ndarray, L: np.ndarray, h: np.ndarray) -> np.ndarray:
    """logits = (h T) Z^T with T applied as (h L) L^T; h is B x D."""
    h = np.asarray(h, dtype=np.float64)
    if h.ndim != 2 or h.shape[1] != Z.shape[1]:
        raise PitcheckError(f"hidden states must be B x {Z.shape[1]}, got shape {h.shape}")
    return ((h @ L) @ L.T) @ Z.T


def head_matrix(Z: np.ndarray, L: np.ndarray) -> np.ndarray:
    """W = T Z^T (D x V); for metrics only, PIT never forms it."""
    return (L @ L.T) @ Z.T
