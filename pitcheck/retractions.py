"""Retractions on the Stiefel manifold {Z in R^{V x D}: Z^T Z = I}, registered by name.

Each retraction is `f(Z, xi, ops) -> Z_new` for a tangent step xi (Z^T xi skew), written once over the
common namespace in arrays.py, so numpy and torch run the same code. All cost O(V D^2): Cayley maps are
applied in low-rank form and never build the V x V skew matrix.
"""
from __future__ import annotations

from typing import Callable

from .arrays import ops_for
from .errors import PitcheckError

RETRACTIONS: dict[str, Callable] = {}


class RetractionError(PitcheckError):
    """A retraction could not produce a point (breakdown, no convergence); recorded as an event."""


def register(name: str):
    def deco(fn):
        RETRACTIONS[name] = fn
        return fn

    return deco


def get_retraction(name: str) -> Callable:
    try:
        return RETRACTIONS[name]
    except KeyError:
        raise PitcheckError(f"unknown retraction {name!r}; choose from {', '.join(RETRACTIONS)}") from None


def _sym(a):
    return 0.5 * (a + a.T)


def tangent_projection(Z, G, ops=None):
    """P_Z(G) = G - Z sym(Z^T G): the embedded-metric projection onto the tangent space at Z."""
    ops = ops or ops_for(Z)
    return G - ops.matmul(Z, _sym(ops.matmul(Z.T, G)))


@register("none")
def retract_none(Z, xi, ops=None):
    """Plain Euclidean step: nothing pulls Z back, so orthonormality drifts at second order."""
    return Z + xi


@register("polar")
def retract_polar(Z, xi, ops=None):
    """Polar factor U V^T of Z + xi from a thin SVD: the nearest orthonormal matrix."""
    ops = ops or ops_for(Z)
    U, _, Vt = ops.svd(Z + xi)
    return ops.matmul(U, Vt)


@register("polar-gram")
def retract_polar_gram(Z, xi, ops=None):
    """Y (Y^T Y)^{-1/2} with the D x D inverse square root from eigh of the Gram matrix."""
    ops = ops or ops_for(Z)
    Y = Z + xi
    w, Q = ops.eigh(_sym(ops.matmul(Y.T, Y)))
    # eigh's eigenvalues are accurate to about u ||G|| each: one below D u ||G|| is indistinguishable from
    # zero (or rounded negative) and would give inf or NaN. This guards against breakdown only: above it,
    # the result's orthonormality error still grows like u ||G|| / w_min (a Gram squares cond(Y))
    w_min, w_max = float(w.min()), float(w.max())
    if not w_min > Y.shape[1] * ops.dtype_unit_roundoff(w) * w_max:
        raise RetractionError(f"polar-gram: Gram matrix of Z + xi is singular to working precision "
                              f"(eigenvalues {w_min:.3g} .. {w_max:.3g})")
    return ops.matmul(Y, ops.matmul(Q / ops.sqrt(w), Q.T))


@register("polar-ns")
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


def _contiguous(x):
    """x in row-major (C) order: LAPACK hands back column-major factors, and every later elementwise
    update of a column-major Z is a strided pass (a default step a third slower)."""
    if hasattr(x, "is_contiguous"):
        return x.contiguous()
    import numpy as np

    return np.ascontiguousarray(x)


def _scale_columns_into_row_major(Q, scale):
    """Q * scale written straight into a row-major array: one pass over LAPACK's column-major Q instead
    of a scaled column-major copy and then a transposing one."""
    if hasattr(Q, "is_contiguous"):
        import torch

        return torch.mul(Q, scale, out=torch.empty(Q.shape, dtype=Q.dtype, device=Q.device))
    import numpy as np

    return np.multiply(Q, scale, out=np.empty(Q.shape, dtype=Q.dtype))


def _plain_torch(ops) -> bool:
    """True for torch Ops that do no reduced-precision emulation: fused kernels (addmm) are then exact
    substitutes for the namespace's matmul followed by an add."""
    return getattr(ops, "name", "") == "torch" and ops.matmul_format is None and ops.matmul_dtype is None


def _add_products(Z, pairs, ops):
    """Z + sum(A @ B for A, B in pairs), fused into addmm calls where that is exact."""
    if _plain_torch(ops) and Z.dtype == pairs[0][0].dtype:
        torch = ops.torch
        out = torch.addmm(Z, *pairs[0])
        for A, B in pairs[1:]:
            out.addmm_(A, B)
        return out
    out = Z
    for A, B in pairs:
        out = out + ops.matmul(A, B)
    return out


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


@register("qr")
def retract_qr(Z, xi, ops=None):
    """Q factor of Householder QR of Z + xi with signs fixed so diag(R) > 0 (unique, continuous)."""
    ops = ops or ops_for(Z)
    Q, R = ops.qr(Z + xi)
    return _scale_columns_into_row_major(Q, ops.sign_nonzero(ops.diag(R)))


@register("cholqr")
def retract_cholqr(Z, xi, ops=None):
    """Cholesky-QR: Y R^{-1} with R^T R = Y^T Y; cheap, but loses orthogonality like cond(Y)^2 u."""
    ops = ops or ops_for(Z)
    Y = Z + xi
    C = _chol_gram(Y, ops, "cholqr")
    # Y R^{-1} with R = C^T is the solution of C X^T = Y^T
    return _contiguous(ops.solve_triangular(C, Y.T, lower=True).T)


@register("cholqr2")
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


# Muon's quintic Newton-Schulz coefficients (Jordan et al. 2024): fast, not convergent
NS5_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
# maps that are not retractions (they do not land on the manifold): run and benchmarked for comparison
APPROXIMATE = {"ns5": "Muon's 5 quintic Newton-Schulz steps leave singular values in about [0.7, 1.2]"}


@register("ns5")
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


def _cayley_generator(Z, xi, ops):
    # W = g Z^T - Z g^T with g = xi - Z (Z^T xi)/2 satisfies W Z = xi for tangent xi (Wen & Yin 2013),
    # so the Cayley curve (I - W/2)^{-1}(I + W/2) Z agrees with Z + xi to first order.
    return xi - 0.5 * ops.matmul(Z, ops.matmul(Z.T, xi))


@register("cayley")
def retract_cayley(Z, xi, ops=None):
    """Exact Cayley transform in low-rank form: Z + U (I - V^T U / 2)^{-1} V^T Z, U = [g, Z], V = [Z, -g].

    Orthogonal in exact arithmetic but never corrects earlier error: rounding error accumulates.
    With g = xi - Z A / 2 (A = Z^T xi), every D x D block of V^T U and V^T Z follows from the three
    Grams Z^T Z, Z^T xi, xi^T xi, and the result Z + g K1 + Z K2 = Z + xi K1 + Z (K2 - A K1 / 2) is one
    apply of [Z, xi]: five V-sized GEMMs in all, g never formed, no V x 2D copies.
    """
    ops = ops or ops_for(Z)
    G, A, X = ops.matmul(Z.T, Z), ops.matmul(Z.T, xi), ops.matmul(xi.T, xi)
    GA = ops.matmul(G, A)
    Ztg = A - 0.5 * GA  # Z^T g
    gtg = X - ops.matmul(A.T, A) + 0.25 * ops.matmul(A.T, GA)  # g^T g (xi^T Z = A^T)
    # V^T U = [[Z^T g, Z^T Z], [-g^T g, -g^T Z]], V^T Z = [Z^T Z; -g^T Z]
    VtU = ops.cat([ops.cat([Ztg, G], 1), ops.cat([-gtg, -Ztg.T], 1)], 0)
    VtZ = ops.cat([G, -Ztg.T], 0)
    K = ops.solve(ops.eye(VtU.shape[0], like=VtU) - 0.5 * VtU, VtZ)
    D = Z.shape[1]
    K1, K2 = K[:D], K[D:]
    return _add_products(Z, [(xi, K1), (Z, K2 - 0.5 * ops.matmul(A, K1))], ops)


@register("cayley-iter")
def retract_cayley_iter(Z, xi, ops=None, iterations: int = 2):
    """Li, Fuxin & Todorovic (2020) fixed-point Cayley: Y <- Z + W (Z + Y)/2, two iterations.

    W = g Z^T - Z g^T is applied factored (W Y = g (Z^T Y) - Z (g^T Y)). The truncation leaves
    O(||W||^3) error per step, which accumulates even in float64.
    """
    ops = ops or ops_for(Z)
    g = _cayley_generator(Z, xi, ops)

    def apply_w(Y):
        return ops.matmul(g, ops.matmul(Z.T, Y)) - ops.matmul(Z, ops.matmul(g.T, Y))

    Y = Z + apply_w(Z)
    for _ in range(iterations):
        Y = Z + 0.5 * apply_w(Z + Y)
    return Y


def reproject(Z, ops=None):
    """Nearest orthonormal matrix (polar factor): the re-projection used by the drift guards."""
    return retract_polar(Z, 0 * Z, ops)
