"""High-precision oracle: the PIT maps in mpmath at 50 significant digits, for small sizes.

A test helper (nothing in pitcheck/ imports it): certifies the float64 reference in units of u. Inputs
are float64 arrays, converted exactly; the oracle computes the exact-arithmetic answer for those inputs
(to 50 digits) and returns float64 values or mpmath matrices. mpmath has no pinv or matrix polar: both
are built from its SVD.
"""
from __future__ import annotations

import mpmath
import numpy as np

from pitcheck.infra.errors import PitcheckError

DIGITS = 50
MAX_VOCAB, MAX_DIM = 256, 32


def _check_size(V: int, D: int) -> None:
    if V > MAX_VOCAB or D > MAX_DIM:
        raise PitcheckError(f"the mpmath oracle is for V <= {MAX_VOCAB}, D <= {MAX_DIM}; got {V} x {D}")


def to_mp(a: np.ndarray) -> mpmath.matrix:
    a = np.atleast_2d(np.asarray(a, dtype=np.float64))
    with mpmath.workdps(DIGITS):
        return mpmath.matrix([[mpmath.mpf(float(x)) for x in row] for row in a])


def to_float(m: mpmath.matrix) -> np.ndarray:
    return np.array([[float(m[i, j]) for j in range(m.cols)] for i in range(m.rows)])


def _lower_solve(L: mpmath.matrix, B: mpmath.matrix, transpose: bool) -> mpmath.matrix:
    n, k = L.rows, B.cols
    X = mpmath.matrix(n, k)
    order = range(n - 1, -1, -1) if transpose else range(n)
    for c in range(k):
        for i in order:
            if transpose:
                acc = B[i, c] - mpmath.fsum(L[j, i] * X[j, c] for j in range(i + 1, n))
            else:
                acc = B[i, c] - mpmath.fsum(L[i, j] * X[j, c] for j in range(i))
            X[i, c] = acc / L[i, i]
    return X


def embed(Z: np.ndarray, L: np.ndarray, ids) -> np.ndarray:
    """T^{-1} z_v for the given rows, exactly (to 50 digits) for the float64 inputs."""
    _check_size(*Z.shape)
    with mpmath.workdps(DIGITS):
        Lm = to_mp(L)
        rhs = to_mp(np.asarray(Z)[np.asarray(ids)].T)
        y = _lower_solve(Lm, rhs, transpose=False)
        return to_float(_lower_solve(Lm, y, transpose=True).T)


def orthonormality_loss(Z: np.ndarray) -> float:
    _check_size(*Z.shape)
    with mpmath.workdps(DIGITS):
        Zm = to_mp(Z)
        G = Zm.T * Zm - mpmath.eye(Z.shape[1])
        return float(mpmath.mnorm(G, "f"))


def pinv_drift(Z: np.ndarray, L: np.ndarray, E: np.ndarray) -> float:
    """||T Z^T E - I||_F for given E, in exact arithmetic (the computed E's true drift)."""
    _check_size(*Z.shape)
    with mpmath.workdps(DIGITS):
        Lm = to_mp(L)
        M = (Lm * Lm.T) * (to_mp(Z).T * to_mp(E)) - mpmath.eye(Z.shape[1])
        return float(mpmath.mnorm(M, "f"))


def polar(Y: np.ndarray) -> np.ndarray:
    """Polar factor U V^T of a full-rank V x D matrix (the nearest orthonormal matrix), from mpmath's SVD."""
    _check_size(*Y.shape)
    with mpmath.workdps(DIGITS):
        U, S, Vt = mpmath.svd_r(to_mp(Y), full_matrices=False)
        return to_float(U * Vt)


def pinv(E: np.ndarray) -> np.ndarray:
    """Moore-Penrose pseudo-inverse (D x V) of a full-column-rank E, from mpmath's SVD."""
    _check_size(*E.shape)
    with mpmath.workdps(DIGITS):
        U, S, Vt = mpmath.svd_r(to_mp(E), full_matrices=False)
        Sinv = mpmath.diag([1 / s for s in S])
        return to_float(Vt.T * Sinv * U.T)


def cond2(A: np.ndarray) -> float:
    with mpmath.workdps(DIGITS):
        S = mpmath.svd_r(to_mp(A), compute_uv=False)
        return float(max(S) / min(S))
