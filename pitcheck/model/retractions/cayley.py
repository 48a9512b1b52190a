"""Cayley maps of the tangent step: the exact transform in low-rank form (`cayley`) and the fixed-point
iteration (`cayley-iter`); their stacked forms beside them."""
from __future__ import annotations

from ...numerics.arrays import ops_for
from .common import _add_products
from .registry import register, stacked_form
from .stacked import StackedOps, none_failed


def _cayley_generator(Z, xi, ops):
    # W = g Z^T - Z g^T with g = xi - Z (Z^T xi)/2 satisfies W Z = xi for tangent xi (Wen & Yin 2013),
    # so the Cayley curve (I - W/2)^{-1}(I + W/2) Z agrees with Z + xi to first order.
    return xi - 0.5 * ops.matmul(Z, ops.matmul(Z.T, xi))


@register("cayley", "#d62728", "P", table_order=6, sharded="retract_cayley")
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


@register("cayley-iter", "#ff7f0e", "X", table_order=7)
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


@stacked_form("cayley")
def stacked_cayley(Z, xi, ops: StackedOps):
    mm, t = ops.matmul, ops.t
    G, A, X = mm(t(Z), Z), mm(t(Z), xi), mm(t(xi), xi)
    GA = mm(G, A)
    Ztg = A - 0.5 * GA
    gtg = X - mm(t(A), A) + 0.25 * mm(t(A), GA)
    VtU = ops.cat([ops.cat([Ztg, G], 1), ops.cat([-gtg, -t(Ztg)], 1)], 0)
    VtZ = ops.cat([G, -t(Ztg)], 0)
    K, failed = ops.solve(ops.eye(VtU.shape[-1], like=VtU) - 0.5 * VtU, VtZ)
    D = Z.shape[-1]
    K1, K2 = K[:, :D], K[:, D:]
    return ops.add_products(Z, [(xi, K1), (Z, K2 - 0.5 * mm(A, K1))]), failed


@stacked_form("cayley-iter")
def stacked_cayley_iter(Z, xi, ops: StackedOps, iterations: int = 2):
    mm, t = ops.matmul, ops.t
    g = xi - 0.5 * mm(Z, mm(t(Z), xi))

    def apply_w(Y):
        return mm(g, mm(t(Z), Y)) - mm(Z, mm(t(g), Y))

    Y = Z + apply_w(Z)
    for _ in range(iterations):
        Y = Z + 0.5 * apply_w(Z + Y)
    return Y, none_failed(Z)
