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
    if not float(w.min()) > 0:
        raise RetractionError("polar-gram: Gram matrix of Z + xi is singular to working precision")
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


@register("qr")
def retract_qr(Z, xi, ops=None):
    """Q factor of Householder QR of Z + xi with signs fixed so diag(R) > 0 (unique, continuous)."""
    ops = ops or ops_for(Z)
    Q, R = ops.qr(Z + xi)
    return Q * ops.sign_nonzero(ops.diag(R))


@register("cholqr")
def retract_cholqr(Z, xi, ops=None):
    """Cholesky-QR: Y R^{-1} with R^T R = Y^T Y; cheap, but loses orthogonality like cond(Y)^2 u."""
    ops = ops or ops_for(Z)
    Y = Z + xi
    try:
        C = ops.cholesky(_sym(ops.matmul(Y.T, Y)))
    except Exception as exc:  # LinAlgError (numpy) or torch's linalg error
        raise RetractionError(f"cholqr: Gram matrix not positive definite ({type(exc).__name__})") from None
    # Y R^{-1} with R = C^T is the solution of C X^T = Y^T
    return ops.solve_triangular(C, Y.T, lower=True).T


def _cayley_generator(Z, xi, ops):
    # W = g Z^T - Z g^T with g = xi - Z (Z^T xi)/2 satisfies W Z = xi for tangent xi (Wen & Yin 2013),
    # so the Cayley curve (I - W/2)^{-1}(I + W/2) Z agrees with Z + xi to first order.
    return xi - 0.5 * ops.matmul(Z, ops.matmul(Z.T, xi))


@register("cayley")
def retract_cayley(Z, xi, ops=None):
    """Exact Cayley transform in low-rank form: Z + U (I - V^T U / 2)^{-1} V^T Z, U = [g, Z], V = [Z, -g].

    Orthogonal in exact arithmetic but never corrects earlier error: rounding error accumulates.
    V^T U is assembled from the three D x D Grams Z^T g, Z^T Z, g^T g; one 2D x 2D solve.
    """
    ops = ops or ops_for(Z)
    g = _cayley_generator(Z, xi, ops)
    ZtZ, Ztg, gtg = ops.matmul(Z.T, Z), ops.matmul(Z.T, g), ops.matmul(g.T, g)
    # V^T U = [[Z^T g, Z^T Z], [-g^T g, -g^T Z]], V^T Z = [Z^T Z; -g^T Z]
    VtU = ops.cat([ops.cat([Ztg, ZtZ], 1), ops.cat([-gtg, -Ztg.T], 1)], 0)
    VtZ = ops.cat([ZtZ, -Ztg.T], 0)
    K = ops.solve(ops.eye(VtU.shape[0], like=VtU) - 0.5 * VtU, VtZ)
    D = Z.shape[1]
    return Z + ops.matmul(g, K[:D]) + ops.matmul(Z, K[D:])


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
