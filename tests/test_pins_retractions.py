"""Pins of what distinguishes each retraction in pitcheck.retractions from its neighbours.

The exact polar factor (polar, polar-gram, polar-ns), the sign-fixed QR factor (qr, cholqr, cholqr2),
the Cayley map in closed form on a 2 x 1 case (a rotation with tan(theta/2) = t/2), the iteration count
of cayley-iter through its truncation error (O(t^4) for two iterations), Muon's ns5 through its scalar
recurrence, and the tangent projection on a non-symmetric Z^T G. numpy and torch (float64) both.
"""
import math

import numpy as np
import pytest
import torch

from pitcheck import retractions as R
from pitcheck.arrays import ops_for
from pitcheck.errors import PitcheckError


def _orthonormal(V, D, seed=0):
    q, r = np.linalg.qr(np.random.default_rng(seed).standard_normal((V, D)))
    return q * np.sign(np.diag(r))


def _tangent(Z, seed=1, scale=1.0):
    G = np.random.default_rng(seed).standard_normal(Z.shape)
    return scale * (G - Z @ (0.5 * (Z.T @ G + G.T @ Z)))


BACKENDS = ["numpy", "torch"]


def _as(backend, *xs):
    if backend == "numpy":
        return xs
    return tuple(torch.from_numpy(np.ascontiguousarray(x)) for x in xs)


def _np(x):
    return x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def _rot(theta):
    c, s = math.cos(theta), math.sin(theta)
    return np.array([[c, -s], [s, c]])


def _known_polar(V=7, seed=3, s=(1.2, 0.8)):
    """Y = U diag(s) Q^T with known factors: its polar factor is U Q^T."""
    U = _orthonormal(V, 2, seed)
    Q = _rot(0.3)
    Y = (U * np.array(s)) @ Q.T
    Z = _orthonormal(V, 2, seed + 10)
    return Z, Y - Z, U @ Q.T


# ---- tangent projection --------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_tangent_projection_symmetrises_a_non_symmetric_ZtG(backend):
    """Z = [I; 0], Z^T G = [[0, 1], [0, 0]]: sym = [[0, 1/2], [1/2, 0]], so P(G) = [[0, 1/2], [-1/2, 0], g]."""
    Z = np.array([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
    G = np.array([[0.0, 1.0], [0.0, 0.0], [3.0, -2.0]])
    P = _np(R.tangent_projection(*_as(backend, Z, G)))
    np.testing.assert_array_equal(P, [[0.0, 0.5], [-0.5, 0.0], [3.0, -2.0]])
    A = Z.T @ P
    np.testing.assert_array_equal(A, -A.T)  # tangent: Z^T P skew


def test_tangent_projection_is_idempotent_and_keeps_tangent_vectors():
    Z = _orthonormal(9, 3)
    G = np.random.default_rng(5).standard_normal((9, 3))
    P = R.tangent_projection(Z, G)
    np.testing.assert_allclose(R.tangent_projection(Z, P), P, atol=1e-14)
    xi = _tangent(Z)
    np.testing.assert_allclose(R.tangent_projection(Z, xi), xi, atol=1e-14)


# ---- polar family --------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["polar", "polar-gram", "polar-ns"])
def test_polar_retractions_give_the_exact_polar_factor(name, backend):
    Z, xi, expected = _known_polar()
    got = _np(R.get_retraction(name)(*_as(backend, Z, xi)))
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-13)


def test_reproject_is_the_polar_factor():
    _, _, expected = _known_polar()
    Z, xi, _ = _known_polar()
    np.testing.assert_allclose(R.reproject(Z + xi), expected, atol=1e-13)


def test_polar_ns_converges_quadratically_to_full_precision_near_the_manifold():
    Z, xi, expected = _known_polar(s=(1.0 + 1e-3, 1.0 - 2e-3))
    got = R.retract_polar_ns(Z, xi)
    np.testing.assert_allclose(got, expected, rtol=0, atol=2e-15)
    # one Newton-Schulz step from a point with singular values 1 + d gives 1 - 3d^2/2 + O(d^3)
    d = 1e-3
    Y = (1 + d) * _orthonormal(6, 2)
    one = R.retract_polar_ns(Y, 0 * Y, max_iter=1)
    np.testing.assert_allclose(np.linalg.svd(one, compute_uv=False), (1 + d) * (1.5 - 0.5 * (1 + d) ** 2),
                               rtol=0, atol=1e-15)


def test_polar_ns_refuses_a_point_too_far_from_the_manifold():
    # ||Y^T Y - I||_F = sqrt(2) (s^2 - 1): 0.976 at s = 1.3 (runs), 1.163 at s = 1.35 (refused)
    U = _orthonormal(5, 2)
    np.testing.assert_allclose(R.retract_polar_ns(1.3 * U, 0 * U), U, atol=1e-14)
    with pytest.raises(R.RetractionError, match="too far"):
        R.retract_polar_ns(1.35 * U, 0 * U)


def test_polar_ns_that_stalls_far_from_the_manifold_is_an_error():
    U = _orthonormal(5, 2)
    # singular values (1, 0.3): ||G - I||_F = 0.91, then 0.81 after one step: not halved, still > 1e-2
    with pytest.raises(R.RetractionError, match="did not converge"):
        R.retract_polar_ns(U * np.array([1.0, 0.3]), 0 * U)


def test_polar_gram_refuses_a_singular_gram_matrix():
    Y = np.array([[1.0, 0.0], [0.0, 0.0], [0.0, 0.0]])  # eigh gives an exact 0
    with pytest.raises(R.RetractionError):
        R.retract_polar_gram(Y, 0 * Y)


@pytest.mark.parametrize("dtype", [np.float64, torch.float64, torch.float32])
@pytest.mark.parametrize("seed", range(6))
def test_polar_gram_refuses_a_gram_matrix_singular_only_to_rounding(seed, dtype):
    """Two equal columns: the Gram's zero eigenvalue comes out of eigh as +-(a few u) ||G||, rounded
    either way; neither sign may reach the inverse square root (a negative one gives NaN, a positive one
    amplifies rounding error to O(1) in the result)."""
    Y = np.random.default_rng(seed).standard_normal((40, 4))
    Y[:, 3] = Y[:, 1]
    Y = Y if dtype is np.float64 else torch.from_numpy(Y).to(dtype)
    with pytest.raises(R.RetractionError, match="singular to working precision"):
        R.retract_polar_gram(Y, 0 * Y)


def test_polar_gram_singularity_threshold_is_d_u_not_v_u():
    """V = 1000, D = 2, float64: Gram eigenvalue ratio 1e-14 lies above D u = 2.2e-16 (and above the
    Gram's rounding, ~sqrt(V) u = 3.5e-15), below V u = 1.1e-13: accepted; ratio 1e-17 is refused."""
    U = _orthonormal(1000, 2, seed=5)
    for s2, singular in ((1e-7, False), (10**-8.5, True)):
        Y = (U * np.array([1.0, s2])) @ _rot(0.4).T
        if singular:
            with pytest.raises(R.RetractionError, match="singular to working precision"):
                R.retract_polar_gram(Y, 0 * Y)
        else:
            assert np.isfinite(R.retract_polar_gram(Y, 0 * Y)).all()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_polar_gram_accepts_an_ill_conditioned_but_resolved_gram_matrix(dtype):
    """cond(G) = 1e3 is far from singular in either precision: the exact polar factor comes back."""
    Z, xi, expected = _known_polar(V=9, s=(1.0, 10**-1.5))
    Y = torch.from_numpy(Z + xi).to(dtype)
    out = R.retract_polar_gram(Y, 0 * Y).double().numpy()
    # the Gram route's error is about u cond(G) = 1e3 u
    assert np.abs(out - expected).max() < 1e4 * float(torch.finfo(dtype).eps) / 2


# ---- QR family -----------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["qr", "cholqr", "cholqr2", "rcqr", "cholqr3-shifted"])
def test_qr_retractions_give_the_sign_fixed_q_factor(name, backend):
    """Y = [[-2, 1], [0, 3], [0, 0]] = Q R with diag(R) > 0: Q = [[-1, 0], [0, 1], [0, 0]] exactly."""
    Y = np.array([[-2.0, 1.0], [0.0, 3.0], [0.0, 0.0]])
    got = _np(R.get_retraction(name)(*_as(backend, Y, 0 * Y)))
    np.testing.assert_allclose(got, [[-1.0, 0.0], [0.0, 1.0], [0.0, 0.0]], rtol=0, atol=1e-15)


@pytest.mark.parametrize("name", ["qr", "cholqr", "cholqr2", "rcqr", "cholqr3-shifted"])
def test_qr_retractions_agree_on_a_generic_point(name):
    Z = _orthonormal(12, 3)
    Y = Z + _tangent(Z, scale=0.3)
    Q = R.get_retraction(name)(Z, Y - Z)
    Rf = Q.T @ Y
    np.testing.assert_allclose(np.tril(Rf, -1), 0, atol=1e-13)
    assert (np.diag(Rf) > 0).all()
    np.testing.assert_allclose(Q.T @ Q, np.eye(3), atol=1e-14)


@pytest.mark.parametrize("name", ["cholqr", "cholqr2"])
def test_cholesky_qr_refuses_a_rank_deficient_point(name):
    Y = np.array([[1.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    with pytest.raises(R.RetractionError):
        R.get_retraction(name)(Y, 0 * Y)


def test_cholqr2_reaches_householder_orthogonality_where_cholqr_does_not():
    rng = np.random.default_rng(0)
    Y = _orthonormal(200, 8) * np.logspace(0, -5, 8)  # cond 1e5
    Y = Y @ np.linalg.qr(rng.standard_normal((8, 8)))[0]
    e1 = np.linalg.norm(R.retract_cholqr(Y, 0 * Y).T @ R.retract_cholqr(Y, 0 * Y) - np.eye(8))
    Q2 = R.retract_cholqr2(Y, 0 * Y)
    e2 = np.linalg.norm(Q2.T @ Q2 - np.eye(8))
    assert e2 < 1e-14 < 1e-8 < e1


# ---- Cayley family -------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_cayley_is_the_exact_cayley_rotation_in_closed_form(backend):
    """Z = (1, 0), xi = (0, t): W = [[0, -t], [t, 0]], (I - W/2)^{-1}(I + W/2) Z is the rotation with
    tan(theta/2) = t/2: ((1 - t^2/4), t) / (1 + t^2/4). At t = 1: (0.6, 0.8)."""
    Z = np.array([[1.0], [0.0]])
    xi = np.array([[0.0], [1.0]])
    got = _np(R.retract_cayley(*_as(backend, Z, xi)))
    np.testing.assert_allclose(got, [[0.6], [0.8]], rtol=0, atol=1e-15)
    t = 0.3
    got = _np(R.retract_cayley(*_as(backend, Z, t * xi)))
    np.testing.assert_allclose(got, np.array([[1 - t * t / 4], [t]]) / (1 + t * t / 4), rtol=0, atol=1e-15)


def _dense_cayley(Z, xi):
    g = xi - 0.5 * Z @ (Z.T @ xi)
    W = g @ Z.T - Z @ g.T
    eye = np.eye(Z.shape[0])
    return np.linalg.solve(eye - W / 2, (eye + W / 2) @ Z), W


@pytest.mark.parametrize("backend", BACKENDS)
def test_cayley_matches_the_dense_cayley_transform(backend):
    Z = _orthonormal(8, 3)
    xi = _tangent(Z, scale=0.4)
    dense, W = _dense_cayley(Z, xi)
    np.testing.assert_allclose(W @ Z, xi, atol=1e-14)  # the generator reproduces xi
    got = _np(R.retract_cayley(*_as(backend, Z, xi)))
    np.testing.assert_allclose(got, dense, rtol=0, atol=1e-13)
    # a non-tangent step (Z^T xi with a symmetric part) still follows the same low-rank formula
    xi2 = xi + 0.1 * Z
    np.testing.assert_allclose(_np(R.retract_cayley(*_as(backend, Z, xi2))), _dense_cayley(Z, xi2)[0],
                               rtol=0, atol=1e-13)


@pytest.mark.parametrize("backend", BACKENDS)
def test_cayley_iter_two_iterations_in_closed_form(backend):
    """Z = (1, 0), xi = (0, t): Y0 = (1, t), Y1 = (1 - t^2/2, t), Y2 = (1 - t^2/2, t - t^3/4),
    Y3 = (1 - t^2/2 + t^4/8, t - t^3/4): exact in binary at t = 1/2."""
    Z = np.array([[1.0], [0.0]])
    xi = np.array([[0.0], [0.5]])
    got = _np(R.retract_cayley_iter(*_as(backend, Z, xi)))
    np.testing.assert_array_equal(got, [[0.875], [0.46875]])
    np.testing.assert_array_equal(_np(R.retract_cayley_iter(*_as(backend, Z, xi), iterations=1)), [[0.875], [0.5]])
    np.testing.assert_array_equal(_np(R.retract_cayley_iter(*_as(backend, Z, xi), iterations=3)),
                                  [[0.875 + 0.0078125], [0.46875]])


def test_cayley_iter_truncation_error_is_fourth_order_for_two_iterations():
    """The fixed point is the Cayley map; its error after k iterations is (W/2)^k O(W^2) = O(t^(k+2)):
    halving t divides the error by 2^4 = 16 for the default two iterations (8 for one, 32 for three)."""
    Z = _orthonormal(10, 3, seed=2)
    xi = _tangent(Z, seed=4)

    def err(t, **kw):
        return np.linalg.norm(R.retract_cayley_iter(Z, t * xi, **kw) - _dense_cayley(Z, t * xi)[0])

    t = 0.02
    assert err(t) / err(t / 2) == pytest.approx(16, rel=0.05)
    assert err(t, iterations=1) / err(t / 2, iterations=1) == pytest.approx(8, rel=0.05)
    assert err(t, iterations=3) / err(t / 2, iterations=3) == pytest.approx(32, rel=0.05)


def test_cayley_with_a_zero_step_is_the_identity():
    Z = _orthonormal(9, 3)
    for name in ("cayley", "cayley-iter", "none"):
        np.testing.assert_array_equal(R.get_retraction(name)(Z, 0 * Z), Z)


# ---- none, ns5, registry -------------------------------------------------------------------------
def test_none_is_the_euclidean_step():
    Z = _orthonormal(5, 2)
    xi = _tangent(Z)
    np.testing.assert_array_equal(R.retract_none(Z, xi), Z + xi)


@pytest.mark.parametrize("backend", BACKENDS)
def test_ns5_is_muons_scalar_recurrence_on_an_orthonormal_point(backend):
    """On X = Z (orthonormal, D = 4) every singular value is s0 = 1 / (||Z||_F + 1e-7) = 1 / (2 + 1e-7),
    and each step maps s to a s + b s^3 + c s^5 with (a, b, c) = (3.4445, -4.7750, 2.0315)."""
    Z = _orthonormal(11, 4)
    s = 1 / (2 + 1e-7)
    for _ in range(5):
        s = 3.4445 * s - 4.7750 * s**3 + 2.0315 * s**5
    got = _np(R.retract_ns5(*_as(backend, Z, 0 * Z)))
    np.testing.assert_allclose(got, s * Z, rtol=0, atol=1e-13)
    assert abs(s - 1) > 0.05  # not a retraction: it does not even fix a point on the manifold
    assert "ns5" in R.APPROXIMATE and R.NS5_COEFFICIENTS == (3.4445, -4.7750, 2.0315)


def test_ns5_orthogonalises_the_step_taken_not_another():
    # ns5(Z, xi) is the map applied to Z + xi: the same as starting from Z + xi with no step
    Z = _orthonormal(11, 4)
    xi = 0.3 * _tangent(Z)
    np.testing.assert_allclose(R.retract_ns5(Z, xi), R.retract_ns5(Z + xi, 0 * Z), rtol=0, atol=1e-14)
    assert np.abs(R.retract_ns5(Z, xi) - R.retract_ns5(Z - xi, 0 * Z)).max() > 1e-3


def test_registry_names_and_unknown_names():
    assert {"none", "polar", "polar-gram", "polar-ns", "qr", "cholqr", "cholqr2", "ns5", "cayley",
            "cayley-iter"} <= set(R.RETRACTIONS)
    assert R.get_retraction("qr") is R.retract_qr
    with pytest.raises(PitcheckError, match="unknown retraction"):
        R.get_retraction("householder")
    assert issubclass(R.RetractionError, PitcheckError)


def test_torch_results_are_row_major_and_match_numpy():
    Z = _orthonormal(9, 3)
    xi = _tangent(Z, scale=0.2)
    for name in ("qr", "cholqr", "cholqr2", "cayley", "ns5"):
        got = R.get_retraction(name)(*_as("torch", Z, xi))
        assert got.is_contiguous()
        np.testing.assert_allclose(got.numpy(), R.get_retraction(name)(Z, xi), atol=1e-13)
        assert R.get_retraction(name)(Z, xi).flags["C_CONTIGUOUS"]
    ops = ops_for(torch.zeros(1))
    assert R._plain_torch(ops) and not R._plain_torch(ops_for(np.zeros(1)))


def test_reproject_of_a_matrix_with_zero_entries():
    Y = np.array([[2.0, 0.0], [0.0, 3.0], [0.0, 0.0]])
    np.testing.assert_array_equal(R.reproject(Y), [[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])


def test_polar_ns_stops_once_the_error_stops_halving():
    """Quadratic convergence from 1e-3: about four Newton-Schulz steps, then one check that finds no
    more progress; it must not keep iterating at the rounding floor up to max_iter."""
    from pitcheck.arrays import NumpyOps

    class Counting(NumpyOps):
        calls = 0

        def matmul(self, a, b):
            Counting.calls += 1
            return a @ b

    Z, xi, expected = _known_polar(s=(1.0 + 1e-3, 1.0 - 2e-3))
    got = R.retract_polar_ns(Z, xi, ops=Counting())
    np.testing.assert_allclose(got, expected, atol=2e-15)
    assert 4 <= Counting.calls <= 14  # two matmuls per step


# ---- issue 20: polar-express, gram-ns, rcqr, cholqr3-shifted, landing ------------------------------
def _pe(c, x):
    return c[0] * x + c[1] * x**3 + c[2] * x**5


def test_polar_express_coefficients_are_the_papers_minimax_polynomials():
    """Each published polynomial from the 4th on equioscillates on its interval [l_t, u_t] (error +-E_t,
    the minimax property), the interval of the next being [1 - E_t, 1 + E_t]; the composition of the first
    T maps [1e-3, 1] into [1 - e_T, 1 + e_T] with e_5 = 0.1236, e_6 = 1.185e-3, e_7 = 1.040e-9 (as claimed:
    l = 1e-3, superexponential convergence), and the last is the Pade step (15, -10, 3) / 8."""
    raw = R.POLAR_EXPRESS_COEFFICIENTS
    assert len(raw) == 8 and raw[-1] == (1.875, -1.25, 0.375)
    lo, hi = 1e-3, 1.0
    for t, c in enumerate(raw[:7]):
        x = np.linspace(max(lo, hi / 10), hi, 100001)
        err = _pe(c, x) - 1
        if t >= 3:
            assert err.max() == pytest.approx(-err.min(), rel=1e-6), t
        image = _pe(c, np.linspace(lo, hi, 100001))
        lo, hi = image.min(), image.max()
    x = np.geomspace(1e-3, 1, 20001)
    for T, e in ((5, 0.12356), (6, 1.1849e-3), (7, 1.0398e-9)):
        y = x
        for c in raw[:T]:
            y = _pe(c, y)
        assert np.abs(y - 1).max() == pytest.approx(e, rel=2e-3), T


def test_polar_express_schedule_applies_the_safety_factor_and_repeats_the_last_step():
    s = R.polar_express_schedule(10)
    a, b, c = R.POLAR_EXPRESS_COEFFICIENTS[1]
    assert s[1] == (a / 1.01, b / 1.01**3, c / 1.01**5)
    assert s[7:] == [(1.875, -1.25, 0.375)] * 3 and len(s) == 10
    assert R.polar_express_schedule(3, 1.05)[0][0] == R.POLAR_EXPRESS_COEFFICIENTS[0][0] / 1.05
    assert len(R.polar_express_schedule(1)) == 1
    with pytest.raises(PitcheckError, match="step"):
        R.polar_express_schedule(0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_polar_express_is_its_scalar_recurrence_on_an_orthonormal_point(backend):
    """On X = Z (orthonormal, D = 4) every singular value is s0 = 1 / (1.01 ||Z||_F + 1e-7) = 1 / (2.02 + 1e-7),
    mapped through the five scaled polynomials."""
    Z = _orthonormal(11, 4)
    s = 1 / (2.02 + 1e-7)
    for a, b, c in R.polar_express_schedule(5):
        s = a * s + b * s**3 + c * s**5
    got = _np(R.retract_polar_express(*_as(backend, Z, 0 * Z)))
    np.testing.assert_allclose(got, s * Z, rtol=0, atol=1e-13)
    assert 0.01 < abs(s - 1) < 0.124  # inside the paper's band, not on the manifold


def test_polar_express_converges_with_enough_steps():
    # from the 8th step on it is Newton-Schulz's degree-5 Pade iteration: the exact polar factor in float64
    Z, xi, expected = _known_polar(s=(1.2, 0.8))
    np.testing.assert_allclose(R.retract_polar_express(Z, xi, steps=10), expected, rtol=0, atol=1e-14)
    assert np.abs(R.retract_polar_express(Z, xi) - expected).max() > 1e-3


def _rot4():
    return np.linalg.qr(np.random.default_rng(7).standard_normal((4, 4)))[0]


def _plain_polar_express(Y, safety, steps=5):
    X = Y / (np.linalg.norm(Y) + 1e-7)
    for a, b, c in R.polar_express_schedule(steps, safety):
        G = X.T @ X
        X = a * X + X @ (b * G + c * G @ G)
    return X


@pytest.mark.parametrize("restarts", [(2,), (), (1, 3)])
def test_gram_ns_is_the_polar_express_iteration_on_the_gram_matrix(restarts):
    """In float64 the Gram form equals the same five polynomials (safety 1.05, scaled by ||Y||_F + 1e-7)
    applied to Y directly, wherever it restarts."""
    Y = _orthonormal(30, 4) @ np.diag([1.0, 0.5, 0.1, 0.02]) @ _rot4()
    got = R.retract_gram_ns(Y, 0 * Y, restarts=restarts)
    np.testing.assert_allclose(got, _plain_polar_express(Y, 1.05), rtol=0, atol=1e-13)
    assert R.GRAM_NS_RESTARTS == (2,) and R.GRAM_NS_SAFETY == 1.05


def test_gram_ns_restart_is_what_keeps_half_precision_stable():
    """bf16 products, singular values 1 .. 1e-2: with the restart after the second iteration the result's
    singular values stay in the band (measured 0.84 .. 1.15); without it the Gram drifts from X Q and a
    spurious direction is amplified (measured max 2.6e3)."""
    from pitcheck.arrays import TorchOps

    U = np.linalg.qr(np.random.default_rng(1).standard_normal((400, 16)))[0]
    W = np.linalg.qr(np.random.default_rng(2).standard_normal((16, 16)))[0]
    Y = torch.from_numpy(U @ np.diag(np.geomspace(1, 1e-2, 16)) @ W.T).float()
    ops = TorchOps(matmul_dtype=torch.bfloat16, native=False)

    def band(**kw):
        s = np.linalg.svd(R.retract_gram_ns(Y, 0 * Y, ops, **kw).double().numpy(), compute_uv=False)
        return s.min(), s.max()

    lo, hi = band()
    assert 0.8 < lo and hi < 1.2, (lo, hi)
    assert band(restarts=())[1] > 10


@pytest.mark.parametrize("backend", BACKENDS)
def test_rcqr_returns_an_orthonormal_input_unchanged(backend):
    Z = _orthonormal(4, 2, seed=3)
    np.testing.assert_allclose(_np(R.retract_rcqr(*_as(backend, Z, 0 * Z))), Z, rtol=0, atol=1e-15)


def test_rcqr_sketch_is_fixed_per_shape_and_leaves_the_global_generators_alone():
    """The same input gives bit-identical output on every call (a re-run or a resumed run computes the
    same Z); the global numpy and torch streams are not advanced; numpy and torch draw the same sketch."""
    Z = _orthonormal(50, 5)
    xi = _tangent(Z, scale=0.2)
    R._SKETCHES.clear()
    np_state, torch_state = np.random.get_state()[1].copy(), torch.get_rng_state().clone()
    first = R.retract_rcqr(Z, xi)
    R._SKETCHES.clear()  # drawn again, not just cached
    np.testing.assert_array_equal(R.retract_rcqr(Z, xi), first)
    np.testing.assert_array_equal(np.random.get_state()[1], np_state)
    assert torch.equal(torch.get_rng_state(), torch_state)
    S = R._gaussian_sketch(7, 50, Z, ops_for(Z))
    assert S.shape == (7, 50) and abs(np.mean(S**2) * 7 - 1) < 0.2  # N(0, 1/k) entries, k = ceil(1.25 * 5)
    St = R._gaussian_sketch(7, 50, torch.from_numpy(Z), ops_for(torch.zeros(1)))
    np.testing.assert_array_equal(St.numpy(), S)
    assert not np.array_equal(R._gaussian_sketch(7, 51, Z, ops_for(Z))[:, :50], S)  # one draw per shape


def test_rcqr_sketch_cache_keeps_a_few_shapes():
    R._SKETCHES.clear()
    Z = np.zeros((20, 2))
    for V in range(10, 16):
        R._gaussian_sketch(3, V, Z, ops_for(Z))
    assert len(R._SKETCHES) == 4 and min(k[1] for k in R._SKETCHES) == 12


def test_rcqr_refuses_a_rank_deficient_point():
    Y = np.array([[1.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    with pytest.raises(R.RetractionError, match="rcqr"):
        R.retract_rcqr(Y, 0 * Y)


def test_cholqr3_shifted_handles_what_breaks_cholqr2():
    """cond(Y) = 1e10 in float64: cond^2 u > 1, cholqr2's Cholesky breaks down; the shifted first pass
    succeeds and two more passes give O(u) orthogonality and the sign-fixed QR factor."""
    rng = np.random.default_rng(5)
    Q, _ = np.linalg.qr(rng.standard_normal((500, 20)))
    Y = Q @ np.diag(np.geomspace(1, 1e-10, 20)) @ np.linalg.qr(rng.standard_normal((20, 20)))[0]
    with pytest.raises(R.RetractionError):
        R.retract_cholqr2(Y, 0 * Y)
    got = R.retract_cholqr3_shifted(Y, 0 * Y)
    assert np.linalg.norm(got.T @ got - np.eye(20)) < 1e-14
    Rf = got.T @ Y
    assert np.abs(np.tril(Rf, -1)).max() < 1e-13 and (np.diag(Rf) > 0).all()


@pytest.mark.parametrize("policy", ["fp64", "bf16"])
def test_cholqr3_shift_is_fukayas(policy):
    """s = 11 (V D + D (D + 1)) u ||G||_F, with u that of the products: 2^-53, or bf16's 2^-8."""
    from pitcheck.arrays import NumpyOps, TorchOps

    seen = []
    base = NumpyOps if policy == "fp64" else TorchOps

    class Spy(base):
        def cholesky(self, x):
            seen.append(ops_for(x).to_numpy(x))
            return super().cholesky(x)

    ops = Spy() if policy == "fp64" else Spy(matmul_dtype=torch.bfloat16, native=False)
    Z = _orthonormal(40, 3)
    Y = Z + _tangent(Z, scale=0.3)
    if policy == "bf16":
        Y = torch.from_numpy(Y).float()
        b = Y.to(torch.bfloat16).double().numpy()
        G = b.T @ b
        u = 2.0**-8
    else:
        G = Y.T @ Y
        u = 2.0**-53
    shift = 11 * (40 * 3 + 3 * 4) * u * np.linalg.norm(G)
    R.retract_cholqr3_shifted(Y, 0 * Y, ops)
    assert len(seen) == 3
    # G's own rounding (u relative to its diagonal) is 4e-5 of the float64 shift
    np.testing.assert_allclose(np.diag(seen[0] - G), shift, rtol=1e-3)


def test_cholqr3_shifted_reports_breakdown():
    Y = np.array([[1.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    # the shift rescues the first pass; the rank deficiency breaks the second
    with pytest.raises(R.RetractionError, match="cholqr3-shifted .second pass"):
        R.retract_cholqr3_shifted(Y, 0 * Y)


@pytest.mark.parametrize("backend", BACKENDS)
def test_landing_in_closed_form_on_a_scaled_orthonormal_point(backend):
    """Z = s U: Z^T Z - I = (s^2 - 1) I, so Z + 0 - mu Z (Z^T Z - I) = s (1 - mu (s^2 - 1)) U, mu = lambda eta."""
    U = _orthonormal(6, 2)
    s = 1.25
    got = _np(R.retract_landing(*_as(backend, s * U, 0 * U)))
    np.testing.assert_allclose(got, s * (1 - 0.5 * (s * s - 1)) * U, rtol=0, atol=1e-15)
    got = _np(R.retract_landing(*_as(backend, s * U, 0 * U), attraction=2.0, step=0.125))
    np.testing.assert_allclose(got, s * (1 - 0.25 * (s * s - 1)) * U, rtol=0, atol=1e-15)
    xi = _tangent(U, scale=0.1)
    np.testing.assert_allclose(_np(R.retract_landing(*_as(backend, s * U, xi))),
                               s * (1 - 0.5 * (s * s - 1)) * U + xi, rtol=0, atol=1e-15)


@pytest.mark.parametrize("mu", [0.0, -0.5, 1.0, 2.0])
def test_landing_refuses_an_attraction_that_does_not_contract(mu):
    U = _orthonormal(6, 2)
    with pytest.raises(PitcheckError, match="landing"):
        R.retract_landing(U, 0 * U, attraction=1.0, step=mu)


def test_issue_20_names_are_registered_and_labelled():
    assert {"polar-express", "gram-ns", "rcqr", "cholqr3-shifted", "landing"} <= set(R.RETRACTIONS)
    assert {"polar-express", "gram-ns", "landing"} <= set(R.APPROXIMATE)
    assert not {"rcqr", "cholqr3-shifted"} & set(R.APPROXIMATE)
    assert R.LANDING_ATTRACTION == 1.0 and R.LANDING_STEP == 0.5 and R.RCQR_OVERSAMPLE == 1.25
