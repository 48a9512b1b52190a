"""Muon-era orthogonalisers and retraction-free methods: Polar Express and Gram Newton-Schulz
(approximate), randomized and shifted Cholesky QR (retractions, the Q factor as `qr`), and landing
(approximate: a field that pulls towards the manifold). None has a stacked or sharded form yet."""
from __future__ import annotations

from ...infra.errors import PitcheckError
from ...numerics.arrays import ops_for
from .common import _add_products, _contiguous, _sym
from .qr import _chol_gram, _upper_inverse_right
from .registry import RETRACTIONS, RetractionError, register  # noqa: F401 (RETRACTIONS: a test plants a map through this module)


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
