"""Retractions on the Stiefel manifold {Z in R^{V x D}: Z^T Z = I}, registered by name.

Each retraction is `f(Z, xi, ops) -> Z_new` for a tangent step xi (Z^T xi skew), written once over the
common namespace in arrays.py, so numpy and torch run the same code. All cost O(V D^2): Cayley maps are
applied in low-rank form and never build the V x V skew matrix.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..numerics.arrays import ops_for
from ..infra.errors import PitcheckError


@dataclass(frozen=True)
class PlotStyle:
    """How a retraction is drawn in every figure: its line colour and its marker."""
    colour: str
    marker: str


@dataclass(frozen=True)
class Retraction:
    """One registered map: the function, how it is drawn, its place in tables and, for a map that does not
    land on the manifold, why it is only approximate (None for a retraction)."""
    name: str
    fn: Callable
    style: PlotStyle
    table_order: int
    approximate: str | None = None


# name -> record, in registration order (the order error messages list the names in)
RECORDS: dict[str, Retraction] = {}
# name -> function, and name -> why it is approximate: views of RECORDS under the names callers use
RETRACTIONS: dict[str, Callable] = {}
# maps that are not retractions (they do not land on the manifold): run and benchmarked for comparison
APPROXIMATE: dict[str, str] = {}


class RetractionError(PitcheckError):
    """A retraction could not produce a point (breakdown, no convergence); recorded as an event."""


def check_point(name: str, Z, xi, stacked: bool = False) -> None:
    """Z a V x D array with V >= D (stacked: B x V x D), xi of Z's shape; a PitcheckError naming the shape
    otherwise. With more columns than rows no matrix has orthonormal columns, and the maps would return
    something silently off the manifold. Reads shapes only: nothing added to a step's O(V D^2)."""
    shape = getattr(Z, "shape", None)
    rank = 3 if stacked else 2
    if shape is None or len(shape) != rank:
        got = f"a {' x '.join(map(str, shape))} array" if shape is not None else type(Z).__name__
        raise PitcheckError(f"{name}: Z must be a {'B x ' if stacked else ''}V x D array, got {got}")
    V, D = shape[-2], shape[-1]
    if V < D:
        raise PitcheckError(f"{name}: Z is {V} x {D}, more columns than rows: no V x D matrix has orthonormal "
                            "columns (need V >= D)")
    xi_shape = getattr(xi, "shape", None)
    if xi_shape is not None and len(xi_shape) and tuple(xi_shape) != tuple(shape):
        raise PitcheckError(f"{name}: xi is {' x '.join(map(str, xi_shape))}, Z {' x '.join(map(str, shape))}: "
                            "a step has Z's shape")


class CheckedMap:
    """A map behind check_point, once for every registered retraction (and stacked form) rather than in each.
    Its __defaults__ are the map's own, read and set through: a test plants a bug by setting them."""

    def __init__(self, name: str, fn: Callable, stacked: bool = False):
        functools.update_wrapper(self, fn)
        self.name, self.fn, self.stacked = name, fn, stacked

    def __call__(self, Z, xi, *args, **kwargs):
        check_point(self.name, Z, xi, self.stacked)
        return self.fn(Z, xi, *args, **kwargs)

    @property
    def __defaults__(self):
        return self.fn.__defaults__

    @__defaults__.setter
    def __defaults__(self, value):
        self.fn.__defaults__ = value

    def __reduce__(self):  # by name, as a function pickles (its module attribute is this wrapper)
        return _registered_map, (self.name,)


def _registered_map(name: str):
    return RETRACTIONS[name]


def register(name: str, colour: str, marker: str, table_order: int, approximate: str | None = None):
    def deco(fn):
        checked = CheckedMap(name, fn)
        RECORDS[name] = Retraction(name, checked, PlotStyle(colour, marker), table_order, approximate)
        RETRACTIONS[name] = checked
        if approximate is not None:
            APPROXIMATE[name] = approximate
        return checked

    return deco


def in_table_order(names) -> list[str]:
    """The registered names among `names`, in the order tables show them."""
    return sorted((n for n in names if n in RECORDS), key=lambda n: RECORDS[n].table_order)


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


@register("none", "#7f7f7f", "x", table_order=12)
def retract_none(Z, xi, ops=None):
    """Plain Euclidean step: nothing pulls Z back, so orthonormality drifts at second order."""
    return Z + xi


@register("polar", "#2ca02c", "s", table_order=5)
def retract_polar(Z, xi, ops=None):
    """Polar factor U V^T of Z + xi from a thin SVD: the nearest orthonormal matrix."""
    ops = ops or ops_for(Z)
    U, _, Vt = ops.svd(Z + xi)
    return ops.matmul(U, Vt)


@register("polar-gram", "#17becf", "D", table_order=0)
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


@register("polar-ns", "#bcbd22", "v", table_order=1)
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


def _sum_products(Z, pairs, matmul, fused=None):
    """Z + sum(A @ B for A, B in pairs): with fused = (first, accumulate), e.g. (addmm, addmm_), one fused
    call per product; else the namespace's matmul and adds. Shared with the stacked forms (baddbmm)."""
    if fused:
        first, accumulate = fused
        out = first(Z, *pairs[0])
        for A, B in pairs[1:]:
            accumulate(out, A, B)
        return out
    out = Z
    for A, B in pairs:
        out = out + matmul(A, B)
    return out


def _add_products(Z, pairs, ops):
    """Z + sum(A @ B for A, B in pairs), fused into addmm calls where that is exact."""
    fuse = _plain_torch(ops) and Z.dtype == pairs[0][0].dtype
    return _sum_products(Z, pairs, ops.matmul, (ops.torch.addmm, ops.torch.Tensor.addmm_) if fuse else None)


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


@register("qr", "#1f77b4", "o", table_order=4)
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


@register("cholqr", "#9467bd", "^", table_order=2)
def retract_cholqr(Z, xi, ops=None):
    """Cholesky-QR: Y R^{-1} with R^T R = Y^T Y; cheap, but loses orthogonality like cond(Y)^2 u."""
    ops = ops or ops_for(Z)
    Y = Z + xi
    C = _chol_gram(Y, ops, "cholqr")
    # Y R^{-1} with R = C^T is the solution of C X^T = Y^T
    return _contiguous(ops.solve_triangular(C, Y.T, lower=True).T)


@register("cholqr2", "#8c564b", "<", table_order=3)
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


@register("ns5", "#637939", "p", table_order=8,
          approximate="Muon's 5 quintic Newton-Schulz steps leave singular values in about [0.7, 1.2]")
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


@register("cayley", "#d62728", "P", table_order=6)
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


def reproject(Z, ops=None):
    """Nearest orthonormal matrix (polar factor): the re-projection used by the drift guards."""
    return retract_polar(Z, 0 * Z, ops)


# ---- Muon-era orthogonalisers and retraction-free methods (issue 20) ------------------------------

def _matmul_unit_roundoff(ops, x) -> float:
    """u of the products: the working dtype's, or the coarser format the policy's matmuls round to."""
    u = ops.dtype_unit_roundoff(x)
    low = getattr(ops, "matmul_dtype", None)
    if low is not None:
        u = max(u, float(ops.torch.finfo(low).eps) / 2)
    fmt = getattr(ops, "matmul_format", None)
    if fmt is not None:
        u = max(u, fmt.u)
    return u


# Polar Express (Amsel, Persson, Musco, Gower 2025, arXiv 2505.16932), Algorithm 1: the degree-5 odd
# polynomials p_t(x) = a x + b x^3 + c x^5 whose composition is the minimax (L-infinity) approximation
# of sign(x) on [l, 1] with l = 1e-3 (l_t cushioned up to u_t / 10 in the first steps), as printed in the
# paper and its repository (github.com/NoahAmsel/PolarExpress). The 8th polynomial is the Pade (Newton-
# Schulz degree-5) limit (15/8, -10/8, 3/8) that every later step repeats. Checked in the tests: each of
# steps 4-7 equioscillates on its interval, and the composition of the first T maps [1e-3, 1] into
# [1 - e_T, 1 + e_T] with e_5 = 0.124, e_6 = 1.2e-3, e_7 = 1.0e-9.
POLAR_EXPRESS_COEFFICIENTS = (
    (8.28721201814563, -23.595886519098837, 17.300387312530933),
    (4.107059111542203, -2.9478499167379106, 0.5448431082926601),
    (3.9486908534822946, -2.908902115962949, 0.5518191394370137),
    (3.3184196573706015, -2.488488024314874, 0.51004894012372),
    (2.300652019954817, -1.6689039845747493, 0.4188073119525673),
    (1.891301407787398, -1.2679958271945868, 0.37680408948524835),
    (1.8750014808534479, -1.2500016453999487, 0.3750001645474248),
    (1.875, -1.25, 0.375),
)
# the paper's bf16 safety factor: p(x / f) instead of p(x), so singular values rounded up to f stay in
# the range each polynomial was fitted on (the last, convergent one is left unscaled, as in the paper)
POLAR_EXPRESS_SAFETY = 1.01


def polar_express_schedule(steps: int, safety: float = POLAR_EXPRESS_SAFETY) -> list[tuple[float, float, float]]:
    """The (a, b, c) of each of `steps` iterations: the published list with the safety factor applied to
    all but its last entry, that last entry repeated beyond eight steps."""
    if steps < 1:
        raise PitcheckError(f"polar-express needs at least one step (got {steps})")
    scaled = [(a / safety, b / safety**3, c / safety**5) for a, b, c in POLAR_EXPRESS_COEFFICIENTS[:-1]]
    scaled.append(POLAR_EXPRESS_COEFFICIENTS[-1])
    return scaled[:steps] + [scaled[-1]] * (steps - len(scaled))


@register("polar-express", "#8c6d31", "*", table_order=13,
          approximate="5 Polar Express steps leave singular values in [1 - 0.124, 1 + 0.124]")
def retract_polar_express(Z, xi, ops=None, steps: int = 5):
    """APPROXIMATE for the default 5 steps: Polar Express (arXiv 2505.16932, Algorithm 1) applied to
    Z + xi: scale by 1.01 ||Z + xi||_F, then X <- a_t X + X (b_t G + c_t G^2), G = X^T X, per step.

    Five steps is the paper's choice for Muon (its GPT-2 runs; "T = 5 or 6" recommended): singular
    values land within [1 - e, 1 + e], e = 0.124 on [1e-3, 1] (1.2e-3 after 6 steps). A point on the
    manifold is mapped to p(x) Z with x = 1 / (1.01 sqrt(D)), not to Z, so it is not a retraction;
    with 8 or more steps it converges (the last polynomial is Newton-Schulz's degree-5 Pade step).
    Cost: 2 GEMM units per step (the Gram and X B), plus D x D work.
    """
    ops = ops or ops_for(Z)
    X = Z + xi
    X = X / (ops.norm(X) * 1.01 + 1e-7)
    for a, b, c in polar_express_schedule(steps):
        G = ops.matmul(X.T, X)
        X = a * X + ops.matmul(X, b * G + c * ops.matmul(G, G))
    return _contiguous(X)


# Gram Newton-Schulz (Zhang, Amsel, Chen, Dao 2026; github.com/Dao-AILab/gram-newton-schulz): the same
# five Polar Express polynomials with a 1.05 safety factor, iterated on the D x D Gram matrix
GRAM_NS_SAFETY = 1.05
GRAM_NS_RESTARTS = (2,)


@register("gram-ns", "#843c39", "d", table_order=10,
          approximate="Gram Newton-Schulz: 5 Polar Express steps (safety 1.05), the same band as polar-express")
def retract_gram_ns(Z, xi, ops=None, steps: int = 5, restarts=GRAM_NS_RESTARTS):
    """APPROXIMATE: Gram Newton-Schulz on Z + xi, equal in exact arithmetic to the same polynomials
    applied by X <- X (a I + b G + c G^2), but with every iteration on D x D matrices.

    After X = (Z + xi) / (||Z + xi||_F + 1e-7) and R = X^T X, each step forms K = b R + c R^2, the
    accumulated right factor Q <- Q (a I + K), and the next Gram R <- (a I + K) R (a I + K); the V x D
    X is touched again only at the end (X Q). In half precision the iterated R drifts from the Gram of
    X Q: rounding in R (relative to ||R|| = O(1)) swamps its small eigenvalues, which turn negative,
    and the polynomials amplify them. So at each iteration index in `restarts` (default: after the
    second) the iteration restarts from X <- X Q, R <- X^T X, Q <- I. Cost: 2 + len(restarts) * 2
    V-sized GEMMs in all (the initial Gram, the final X Q, and a product and a Gram per restart).
    """
    ops = ops or ops_for(Z)
    X = Z + xi
    X = X / (ops.norm(X) + 1e-7)
    eye = ops.eye(X.shape[1], like=X)
    R = ops.matmul(X.T, X)
    Q = None
    schedule = polar_express_schedule(steps, GRAM_NS_SAFETY)
    for i, (a, b, c) in enumerate(schedule):
        if i in restarts and Q is not None:
            X = ops.matmul(X, Q)
            R, Q = ops.matmul(X.T, X), None
        K = b * R + c * ops.matmul(R, R)
        Q = a * eye + K if Q is None else a * Q + ops.matmul(Q, K)
        if i + 1 < len(schedule) and i + 1 not in restarts:
            RK = a * R + ops.matmul(R, K)
            R = a * RK + ops.matmul(K, RK)
    return _contiguous(ops.matmul(X, Q))


# Dion's randomized Cholesky QR (Ahn et al. 2025, arXiv 2504.05295): a Gaussian sketch with 1.25 x
# oversampling. The sketch is a fixed function of its shape (this seed, one draw per (k, V)), never a
# draw from the global generators: a run re-executed or resumed from a checkpoint computes exactly the
# same Z, and the training stream's random numbers are not shifted by it. The Q factor is the unique one
# with diag(R) > 0 whatever the sketch, so the sketch changes only rounding, not the map.
RCQR_OVERSAMPLE = 1.25
RCQR_SEED = 20250405
_SKETCHES: dict = {}


def _gaussian_sketch(k: int, V: int, like, ops):
    """k x V Gaussian sketch with N(0, 1/k) entries, the same for every call with this shape."""
    import numpy as np

    key = (k, V, ops.name, str(like.dtype), str(getattr(like, "device", "")))
    S = _SKETCHES.get(key)
    if S is None:
        S = np.random.default_rng([RCQR_SEED, k, V]).standard_normal((k, V)) / k**0.5
        if ops.name == "torch":
            S = ops.torch.from_numpy(S).to(dtype=like.dtype, device=like.device)
        else:
            S = S.astype(like.dtype)
        if len(_SKETCHES) >= 4:  # a few shapes at a time: each is 1.25 x the size of Z
            _SKETCHES.pop(next(iter(_SKETCHES)))
        _SKETCHES[key] = S
    return S


@register("rcqr", "#e377c2", ">", table_order=14)
def retract_rcqr(Z, xi, ops=None, oversample: float = RCQR_OVERSAMPLE):
    """Randomized Cholesky QR of Y = Z + xi: QR of the k x D sketch S Y (k = ceil(1.25 D)) gives R1
    with Y R1^{-1} well conditioned (S is a subspace embedding), then one Cholesky-QR pass. R1's rows
    are sign-fixed so diag(R1) > 0: the result is the Q factor with diag(R) > 0, the same map as `qr`.

    Cost: the sketch product (1.25 GEMM units), two triangular applies and one Gram (3 units).
    """
    import math

    ops = ops or ops_for(Z)
    Y = Z + xi
    V, D = Y.shape
    k = max(D, math.ceil(oversample * D))
    _, R1 = ops.qr(ops.matmul(_gaussian_sketch(k, V, Y, ops), Y))
    R1 = R1 * ops.sign_nonzero(ops.diag(R1))[:, None]
    d = ops.diag(R1)
    if not float(d.min()) > D * ops.dtype_unit_roundoff(d) * float(d.max()):
        raise RetractionError(f"rcqr: sketch of Z + xi is rank deficient (diag(R) {float(d.min()):.3g} .. "
                              f"{float(d.max()):.3g})")
    Y1 = _upper_inverse_right(Y, R1.T, ops)
    return _upper_inverse_right(Y1, _chol_gram(Y1, ops, "rcqr (Cholesky pass)"), ops)


# Fukaya, Kannan, Nakatsukasa, Yamamoto, Yanagisawa (2020), "Shifted Cholesky QR for computing the QR
# factorization of ill-conditioned matrices", SIAM J. Sci. Comput. 42(1): shift s = 11 (m n + n (n+1))
# u ||X||_2^2 makes the first Cholesky succeed for cond(X) up to O(u^-1)
SHIFTED_CHOLQR_CONSTANT = 11


@register("cholqr3-shifted", "#393b79", "h", table_order=9)
def retract_cholqr3_shifted(Z, xi, ops=None):
    """Shifted Cholesky QR3: Y R1^{-1} with R1^T R1 = Y^T Y + s I, then Cholesky-QR twice (cholqr2).

    s = 11 (V D + D (D + 1)) u ||G||_F with G = Y^T Y (||G||_F bounds ||Y||_2^2 from above, so the
    shift is at least the paper's) and u that of the products (a bf16-matmul policy shifts by bf16's).
    The shift keeps the first Cholesky positive definite where cond(Y)^2 u > 1 would break cholqr2;
    the first pass then has cond about sqrt(||Y||^2 / s), which two unshifted passes bring to O(u).
    The result is the Q factor with diag(R) > 0, as `qr`. Cost: three Grams and three applies.
    """
    ops = ops or ops_for(Z)
    Y = Z + xi
    V, D = Y.shape
    G = _sym(ops.matmul(Y.T, Y))
    shift = SHIFTED_CHOLQR_CONSTANT * (V * D + D * (D + 1)) * _matmul_unit_roundoff(ops, Y) * ops.norm(G)
    try:
        C = ops.cholesky(G + shift * ops.eye(D, like=G))
    except Exception as exc:
        raise RetractionError(f"cholqr3-shifted: shifted Gram not positive definite ({type(exc).__name__})") from None
    Y1 = _upper_inverse_right(Y, C, ops)
    Y2 = _upper_inverse_right(Y1, _chol_gram(Y1, ops, "cholqr3-shifted (second pass)"), ops)
    return _upper_inverse_right(Y2, _chol_gram(Y2, ops, "cholqr3-shifted (third pass)"), ops)


# Landing (Ablin & Peyre 2022, AISTATS; Ablin, Vary, Gao, Absil 2024 for Stiefel): no retraction, a
# field that pulls towards the manifold. Defaults: attraction lambda = 1, step eta = 1/2, so lambda eta =
# 1/2, where the linear part of the distance's recurrence vanishes (see retract_landing)
LANDING_ATTRACTION = 1.0
LANDING_STEP = 0.5


@register("landing", "#7b4173", "8", table_order=11,
          approximate="retraction-free: ||Z^T Z - I||_F settles near ||xi||_F^2 / (2 lambda eta), never 0")
def retract_landing(Z, xi, ops=None, attraction: float = LANDING_ATTRACTION, step: float = LANDING_STEP):
    """APPROXIMATE, not a retraction: the landing update Z + xi - eta lambda grad N(Z), with
    N(Z) = ||Z^T Z - I||_F^2 / 4, grad N(Z) = Z (Z^T Z - I), lambda = `attraction`, eta = `step`.

    The tangent step xi (the optimizer's, already scaled by its learning rate) plays the landing
    field's relative-gradient part; the attraction is evaluated at Z, as in the paper, so on the
    manifold the update is exactly Z + xi (first-order agreement holds trivially), and it never lands.
    With E = Z^T Z - I and mu = lambda eta, E_next = (1 - 2 mu) E + xi^T xi + O(||E||^2 + ||E|| ||xi||)
    (Z^T xi is skew for a tangent xi). Each xi^T xi is PSD with norm at most tau^2 = max ||xi||_F^2, so
    for 0 < mu <= 1/2 the distance ||Z^T Z - I||_F stays below the level tau^2 / (2 mu) to leading
    order: the paper's safe-step result (the iterates stay in the level set {N <= eps} for step sizes
    below a bound) in this setting. mu must lie in (0, 1) for the recurrence to contract at all.
    Cost: 2 GEMM units (the Gram and Z E).
    """
    mu = attraction * step
    if not 0 < mu < 1:
        raise PitcheckError(f"landing: attraction * step must lie in (0, 1) (got {mu:g})")
    ops = ops or ops_for(Z)
    E = _sym(ops.matmul(Z.T, Z)) - ops.eye(Z.shape[1], like=Z)
    return _add_products(Z + xi, [(Z, -mu * E)], ops)

