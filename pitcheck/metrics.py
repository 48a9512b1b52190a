"""Interface metrics: raw values and, where a standard exists, LAPACK-style ratios in units of u = 2^-p.

All metrics take float64 copies of what a model actually computes with, and all cost O(V D^2):
nothing here forms a V x V matrix. The interface is written with E (V x D, the embedding rows) and
B = W^T (V x D, the head), so the same functions judge PIT, standard tying (B = E) and untied heads.
"""
from __future__ import annotations

import numpy as np

from .errors import PitcheckError

# Extended precision for residuals and reference solves: x86 long double carries p = 64 bits.
EXTENDED = np.longdouble
EXTENDED_BITS = np.finfo(np.longdouble).nmant + 1


def orthonormality_loss(Z: np.ndarray) -> float:
    """||Z^T Z - I||_F."""
    Z = np.asarray(Z, dtype=np.float64)
    return float(np.linalg.norm(Z.T @ Z - np.eye(Z.shape[1])))


def orthonormality_ratio(Z: np.ndarray, u: float) -> float:
    """LAPACK dqrt01's ratio ||I - Z^T Z||_1 / (V u); about 1 for Householder QR, pass below 30."""
    Z = np.asarray(Z, dtype=np.float64)
    return float(np.linalg.norm(np.eye(Z.shape[1]) - Z.T @ Z, 1) / (Z.shape[0] * u))


def cholesky_conditioning(L: np.ndarray, u: float) -> dict:
    """cond_2(L), cond_2(T) = cond_2(L)^2, min diag(L), and the breakdown margin 20 n^{3/2} cond(T) u.

    Cholesky of T in a precision with unit roundoff u is guaranteed to complete while the margin is
    below 1 (Higham, Accuracy and Stability, Thm 10.7); above it, breakdown is possible.
    """
    L = np.asarray(L, dtype=np.float64)
    s = np.linalg.svd(L, compute_uv=False)
    cond_L = float(s[0] / s[-1]) if s[-1] > 0 else float("inf")
    n = L.shape[0]
    return {
        "cond_L": cond_L,
        "cond_T": cond_L**2,
        "min_diag_L": float(np.min(np.diag(L))),
        "breakdown_margin": 20.0 * n**1.5 * cond_L**2 * u,
    }


def drift_bound(Z: np.ndarray, L: np.ndarray, u: float) -> float:
    """cond(T) (||Z^T Z - I||_F + u): the first-order bound on ||W E - I||_F (inf if T is singular)."""
    s = np.linalg.svd(np.asarray(L, dtype=np.float64), compute_uv=False)
    bound = (s[0] / s[-1]) ** 2 * (orthonormality_loss(Z) + u) if s[-1] > 0 else np.inf
    return float(bound) if np.isfinite(bound) else float("inf")


def _solve_lower_extended(L: np.ndarray, rhs: np.ndarray, transpose: bool) -> np.ndarray:
    """Substitution for L x = rhs (or L^T x = rhs) in extended precision; rhs is D x B."""
    Lx = L.astype(EXTENDED)
    A = Lx.T if transpose else Lx
    n = A.shape[0]
    x = np.zeros(rhs.shape, dtype=EXTENDED)
    order = range(n - 1, -1, -1) if transpose else range(n)
    for i in order:
        acc = rhs[i].astype(EXTENDED) - A[i] @ x
        x[i] = acc / A[i, i]
    return x


def reference_embedding(Z: np.ndarray, L: np.ndarray, ids) -> np.ndarray:
    """T^{-1} z_v for the given rows in extended precision (the yardstick for the forward error)."""
    rhs = np.asarray(Z, dtype=np.float64)[ids].T
    y = _solve_lower_extended(L, rhs, transpose=False)
    return _solve_lower_extended(L, y, transpose=True).T


def trisolve_errors(Z, L, E_rows, ids, u: float, cond_T: float | None = None) -> dict:
    """Forward and backward error of computed embedding rows E_rows = T^{-1} Z[ids].

    forward: max_v ||e_v - e*_v|| / ||e*_v|| against an extended-precision solve of the same Z, L;
      its ratio divides by cond(T) u (a solve's forward error is about cond * u).
    backward: max_v ||z_v - L L^T e_v||_1 / (||L||_1 ||L^T||_1 ||e_v||_1), residual in extended
      precision; its ratio divides by u (dtrt02's normalisation; a backward-stable pair of solves
      gives about 1, LAPACK passes below 30).
    """
    Z = np.asarray(Z, dtype=np.float64)
    L = np.asarray(L, dtype=np.float64)
    E_rows = np.asarray(E_rows, dtype=np.float64)
    ids = np.asarray(ids)
    if cond_T is None:
        cond_T = cholesky_conditioning(L, u)["cond_T"]
    exact = reference_embedding(Z, L, ids)
    fwd = np.linalg.norm((E_rows - exact).astype(np.float64), axis=1) / np.linalg.norm(
        exact.astype(np.float64), axis=1
    )
    Lx = L.astype(EXTENDED)
    resid = Z[ids].astype(EXTENDED) - (E_rows.astype(EXTENDED) @ Lx) @ Lx.T
    denom = np.linalg.norm(L, 1) * np.linalg.norm(L.T, 1) * np.abs(E_rows).sum(axis=1)
    bwd = np.abs(resid.astype(np.float64)).sum(axis=1) / denom
    forward, backward = float(fwd.max()), float(bwd.max())
    return {
        "trisolve_forward": forward,
        "trisolve_forward_ratio": forward / (cond_T * u),
        "trisolve_backward": backward,
        "trisolve_backward_ratio": backward / u,
        # resolved only while the forward-error bound cond(T) u stays small, and while the yardstick is
        # finer than u (long double is no wider than float64 on some platforms, e.g. ARM macOS)
        "trisolve_resolved": bool(cond_T * u <= 0.1 and 2.0**-EXTENDED_BITS <= u / 16),
    }


def pinv_drift(E: np.ndarray, B: np.ndarray) -> float:
    """||W E - I||_F with W = B^T; D x D, O(V D^2)."""
    return float(np.linalg.norm(B.T @ E - np.eye(E.shape[1])))


def penrose_residuals(E: np.ndarray, B: np.ndarray) -> dict:
    """Relative residuals of the four Penrose conditions for A = E^T (embed) and B = W^T (unembed).

    ABA = A, BAB = B, (AB)^T = AB, (BA)^T = BA, each as ||lhs - rhs||_F / ||rhs||_F. BA is V x V and is
    never formed: BA - (BA)^T = P Q^T with P = [B, A^T], Q = [A^T, -B], and with Q = Q1 R1 (thin QR),
    ||P Q^T||_F = ||P R1^T||_F, computed from small entries without cancellation.
    """
    D = E.shape[1]
    M = E.T @ B  # AB, D x D
    MmI = M - np.eye(D)
    r1 = np.linalg.norm(E @ MmI.T) / np.linalg.norm(E)  # ABA - A = (M - I) A
    r2 = np.linalg.norm(B @ MmI) / np.linalg.norm(B)  # BAB - B = B (M - I)
    r3 = np.linalg.norm(M - M.T) / np.linalg.norm(M)
    q = np.concatenate([E, -B], axis=1)
    _, R1 = np.linalg.qr(q)
    p = np.concatenate([B, E], axis=1)
    ba_norm = np.sqrt(abs(np.trace((E.T @ E) @ (B.T @ B))))  # ||B A||_F
    r4 = np.linalg.norm(p @ R1.T) / ba_norm
    return {"penrose_1": float(r1), "penrose_2": float(r2), "penrose_3": float(r3), "penrose_4": float(r4)}


def pinv_error(E: np.ndarray, B: np.ndarray) -> float:
    """||W - pinv(E)||_F / ||pinv(E)||_F with pinv(E) from a thin SVD of E (D x V, never V x V)."""
    U, s, Vt = np.linalg.svd(E, full_matrices=False)
    if s[-1] <= 0:
        return float("inf")
    pinv = (Vt.T / s) @ U.T
    return float(np.linalg.norm(B.T - pinv) / np.linalg.norm(pinv))


def interface_metrics(Z, L, E, u: float, factor_u: float | None = None, sample_rows: int = 256) -> dict:
    """Every tracked metric for a PIT model: Z and L as stored, E the embedding rows as computed.

    u is the unit roundoff errors are reported in; factor_u (default u) that of the precision T would
    be factorised in, which decides the Cholesky breakdown margin.
    """
    Z = np.asarray(Z, dtype=np.float64)
    L = np.asarray(L, dtype=np.float64)
    E = np.asarray(E, dtype=np.float64)
    if Z.shape != E.shape or L.shape != (Z.shape[1], Z.shape[1]):
        raise PitcheckError(f"shape mismatch: Z {Z.shape}, L {L.shape}, E {E.shape}")
    out = {"orthonormality": orthonormality_loss(Z), "orthonormality_ratio": orthonormality_ratio(Z, u)}
    out.update(cholesky_conditioning(L, u if factor_u is None else factor_u))
    ids = sample_ids(Z.shape[0], sample_rows)
    out.update(trisolve_errors(Z, L, E[ids], ids, u, out["cond_T"]))
    B = Z @ (L @ L.T)  # W^T = Z T
    out.update(head_metrics(E, B))
    return out


def head_metrics(E: np.ndarray, B: np.ndarray) -> dict:
    """The interface metrics any head has: pinv drift, the four Penrose residuals and pinv error."""
    out = {"pinv_drift": pinv_drift(E, B)}
    pen = penrose_residuals(E, B)
    out["penrose"] = max(pen.values())
    out.update(pen)
    out["pinv_error"] = pinv_error(E, B)
    return out


def sample_ids(vocab: int, count: int) -> np.ndarray:
    """Evenly spaced rows, first and last included: deterministic, the same at every step."""
    return np.unique(np.linspace(0, vocab - 1, min(count, vocab)).round().astype(np.int64))
