"""Each metric on a case with a known value, on a case built to break it, and on one that must pass; then
every metric pinned on cases whose value is known in closed form.

Each pin has (a) an exact case that fixes the metric's normalisation (which norm, u and not eps = 2u,
which size scales it) and (b) a case showing it sees the defect it exists to see. Written to kill
mutants: tolerances are far below any change of a constant, norm or operator (see scripts/dev/mutation/).
"""
import math
import tracemalloc

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pitcheck import PitcheckError
from pitcheck.numerics import metrics, reference
from tests.helpers import orthonormal, pit_pair

U = 2.0**-53
U32, U64 = 2.0**-24, 2.0**-53


# ---- closed forms first (they kill most mutants fastest) -----------------------------------------


def _with_gram(M, V):
    """A V x D matrix Z with Z^T Z = I + M exactly up to float64 rounding: Z = Q R, R^T R = I + M."""
    D = M.shape[0]
    R = np.linalg.cholesky(np.eye(D) + M).T
    return orthonormal(V, D, seed=7) @ R


M_SYM = np.array([[0.3, 0.4], [0.4, 0.0]])  # ||M||_F = sqrt(0.41), ||M||_1 = 0.7, ||M||_2 = 0.577


# ---- orthonormality ---------------------------------------------------------------------------------
def test_orthonormality_loss_is_the_frobenius_norm_of_the_gram_defect():
    Z = _with_gram(M_SYM, V=5)
    assert metrics.orthonormality_loss(Z) == pytest.approx(math.sqrt(0.41), rel=1e-12)
    assert metrics.orthonormality_loss(orthonormal(9, 4)) < 1e-14


def test_orthonormality_ratio_is_the_one_norm_over_vocab_times_u_not_eps():
    """dqrt01: ||I - Z^T Z||_1 / (V u): the 1-norm (0.7, not F 0.64 or 2-norm 0.58), V (5, not D), u."""
    Z = _with_gram(M_SYM, V=5)
    assert metrics.orthonormality_ratio(Z, U32) == pytest.approx(0.7 / (5 * U32), rel=1e-12)
    assert metrics.orthonormality_ratio(Z, 0.25) == pytest.approx(0.7 / (5 * 0.25), rel=1e-12)


def test_orthonormality_ratio_of_a_householder_q_is_about_one():
    Z = orthonormal(200, 8)
    assert 0.01 < metrics.orthonormality_ratio(Z, U64) < 30


# ---- conditioning -------------------------------------------------------------------------------------
L3 = np.array([[2.0, 0.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.5, 0.5]])


def _cond2(A):
    s = np.linalg.svd(A, compute_uv=False)
    return s[0] / s[-1]


def test_cholesky_conditioning_on_a_diagonal_factor_is_exact():
    c = metrics.cholesky_conditioning(np.diag([2.0, 1.0, 0.5]), U32)
    assert c["cond_L"] == 4.0 and c["cond_T"] == 16.0 and c["min_diag_L"] == 0.5
    # Higham Thm 10.7: 20 n^{3/2} cond(T) u, n = 3, u = 2^-24 (not eps)
    assert c["breakdown_margin"] == pytest.approx(20 * 3**1.5 * 16 * U32, rel=1e-14)


def test_cholesky_conditioning_of_a_full_factor_squares_cond_L():
    c = metrics.cholesky_conditioning(L3, 0.01)
    k = _cond2(L3)
    assert c["cond_L"] == pytest.approx(k, rel=1e-12)
    assert c["cond_T"] == pytest.approx(_cond2(L3 @ L3.T), rel=1e-10)
    assert c["min_diag_L"] == 0.5
    assert c["breakdown_margin"] == pytest.approx(20 * 3**1.5 * k * k * 0.01, rel=1e-10)


def test_breakdown_margin_crosses_one_where_cholesky_may_fail():
    # cond(T) = 1e6 in fp32: 20 * 2^1.5 * 1e6 * 6e-8 = 3.4 > 1; in fp64 far below
    L = np.diag([1.0, 1e-3])
    assert metrics.cholesky_conditioning(L, U32)["breakdown_margin"] > 1
    assert metrics.cholesky_conditioning(L, U64)["breakdown_margin"] < 1e-6


def test_drift_bound_is_cond_T_times_loss_plus_u():
    Z = _with_gram(M_SYM, V=5)
    L = np.diag([2.0, 0.5])  # cond(T) = 16
    assert metrics.drift_bound(Z, L, U32) == pytest.approx(16 * (math.sqrt(0.41) + U32), rel=1e-12)
    # a singular T: no bound
    assert metrics.drift_bound(Z, np.diag([1.0, 0.0]), U32) == math.inf


# ---- triangular solves -----------------------------------------------------------------------------
L2 = np.array([[2.0, 0.0], [1.0, 1.0]])  # ||L||_1 = 3, ||L^T||_1 = 2, ||L||_2 = 2.29


def _mp_reference(Z, L, E_rows, ids):
    """forward and backward errors of E_rows, computed at 40 digits from the definitions."""
    with mpmath.workdps(40):
        Lm = mpmath.matrix(L.tolist())
        T = Lm * Lm.T
        Tinv = T**-1
        fwd, bwd = [], []
        n1 = max(sum(abs(Lm[i, j]) for i in range(Lm.rows)) for j in range(Lm.cols))
        n1t = max(sum(abs(Lm[i, j]) for j in range(Lm.cols)) for i in range(Lm.rows))
        for k, v in enumerate(ids):
            z = mpmath.matrix(Z[v].tolist())
            e = mpmath.matrix(E_rows[k].tolist())
            ex = Tinv * z
            fwd.append(mpmath.norm(e - ex, 2) / mpmath.norm(ex, 2))
            r = z - T * e
            bwd.append(mpmath.norm(r, 1) / (n1 * n1t * mpmath.norm(e, 1)))
        return float(max(fwd)), float(max(bwd))


def test_trisolve_errors_pin_the_ratios_dtrt02_normalisation():
    Z = np.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
    ids = np.array([0, 1, 2])
    T = L2 @ L2.T
    exact = np.linalg.solve(T, Z.T).T
    E_rows = exact + np.array([[2.0**-30, 0.0], [0.0, -3 * 2.0**-31], [2.0**-32, 2.0**-32]])
    fwd, bwd = _mp_reference(Z, L2, E_rows, ids)
    u = 2.0**-20
    cond_T = _cond2(T)
    got = metrics.trisolve_errors(Z, L2, E_rows, ids, u)
    assert got["trisolve_forward"] == pytest.approx(fwd, rel=1e-6)
    assert got["trisolve_backward"] == pytest.approx(bwd, rel=1e-6)
    assert got["trisolve_forward_ratio"] == pytest.approx(fwd / (cond_T * u), rel=1e-6)
    assert got["trisolve_backward_ratio"] == pytest.approx(bwd / u, rel=1e-6)  # u, not eps
    assert got["trisolve_resolved"] is True
    # cond_T passed in is used as given
    got2 = metrics.trisolve_errors(Z, L2, E_rows, ids, u, cond_T=100.0)
    assert got2["trisolve_forward_ratio"] == pytest.approx(fwd / (100.0 * u), rel=1e-6)


def test_trisolve_backward_ratio_of_exact_solves_is_zero_and_of_float64_solves_about_one():
    Z = orthonormal(40, 4, seed=3)
    L = np.linalg.cholesky(np.diag([1.0, 2.0, 3.0, 4.0]) + 0.1)
    ids = np.arange(40)
    E = np.linalg.solve(L.T, np.linalg.solve(L, Z.T)).T
    got = metrics.trisolve_errors(Z, L, E, ids, U64)
    assert got["trisolve_backward_ratio"] < 30 and got["trisolve_forward_ratio"] < 30
    E_exact = metrics.reference_embedding(Z, L, ids).astype(np.float64)
    assert metrics.trisolve_errors(Z, L, E_exact, ids, U64)["trisolve_forward"] <= 2.0**-53


def test_trisolve_errors_see_a_one_row_solve_error_of_known_size():
    Z = orthonormal(30, 3, seed=5)
    L = np.diag([2.0, 1.0, 0.5])
    ids = np.array([0, 7, 29])
    E = Z[ids] / np.array([4.0, 1.0, 0.25])  # exact: T is diagonal with powers of two
    E_bad = E.copy()
    E_bad[1, 2] += 1e-9
    fwd, bwd = _mp_reference(Z, L, E_bad, ids)
    got = metrics.trisolve_errors(Z, L, E_bad, ids, U32)
    assert got["trisolve_forward"] == pytest.approx(fwd, rel=1e-6) and fwd > 1e-10
    assert got["trisolve_backward"] == pytest.approx(bwd, rel=1e-6)
    assert metrics.trisolve_errors(Z, L, E, ids, U32)["trisolve_forward"] == 0.0


def test_precision_cannot_resolve_threshold_is_cond_u_at_one_tenth():
    Z = orthonormal(8, 2)
    L = np.diag([1.0, 0.25])  # cond(T) = 16
    ids = np.array([0, 1])
    E = metrics.reference_embedding(Z, L, ids).astype(np.float64)
    assert metrics.trisolve_errors(Z, L, E, ids, 0.1 / 16)["trisolve_resolved"] is True
    assert metrics.trisolve_errors(Z, L, E, ids, 0.1 / 16 * 1.01)["trisolve_resolved"] is False
    assert metrics.trisolve_errors(Z, L, E, ids, 0.1 / 16 * 0.99)["trisolve_resolved"] is True
    # the extended-precision yardstick must be finer than u / 16
    tiny_u = 2.0 ** -(metrics.EXTENDED_BITS - 3)
    assert metrics.trisolve_errors(Z, L, E, ids, tiny_u)["trisolve_resolved"] is False
    assert metrics.trisolve_errors(Z, L, E, ids, 2.0 ** -(metrics.EXTENDED_BITS - 4))["trisolve_resolved"] is True


@pytest.mark.parametrize("L, cond_T", [(np.eye(3), None), (np.eye(2), 0.5), (np.eye(2), math.inf)],
                         ids=["L-3x3", "cond-below-1", "cond-inf"])
def test_trisolve_errors_refuse_mismatched_shapes_and_bad_cond(L, cond_T):
    Z = orthonormal(6, 2)
    with pytest.raises(PitcheckError):
        metrics.trisolve_errors(Z, L, Z[:2].copy(), [0, 1], U32, cond_T=cond_T)


def test_trisolve_errors_take_a_given_cond_T():
    Z, L = orthonormal(6, 2), np.eye(2)
    E = Z[:2].copy()
    assert metrics.trisolve_errors(Z, L, E, [0, 1], U32, cond_T=1.0)["trisolve_forward"] == 0.0


def test_reference_embedding_solves_with_L_then_L_transpose():
    Z = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    got = metrics.reference_embedding(Z, L2, [0, 1, 2]).astype(np.float64)
    T = L2 @ L2.T  # [[4, 2], [2, 2]]: T^{-1} = [[0.5, -0.5], [-0.5, 1]]
    np.testing.assert_array_equal(got, np.array([[0.5, -0.5], [-0.5, 1.0], [0.0, 0.5]]))
    np.testing.assert_allclose(got @ T, Z, rtol=0, atol=1e-18)


# ---- pinv drift and Penrose ------------------------------------------------------------------------
def test_pinv_drift_is_the_frobenius_norm_of_WE_minus_I():
    Z = orthonormal(7, 3)
    c = 1 + 2.0**-20
    assert metrics.pinv_drift(c * Z, Z) == pytest.approx(2.0**-20 * math.sqrt(3), rel=1e-6)
    S = np.array([[1.0, 0.5, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    # W E - I = S - I: one off-diagonal 0.5
    assert metrics.pinv_drift(Z @ S, Z) == pytest.approx(0.5, rel=1e-12)


def _exact_pit(V=6):
    Z = np.zeros((V, 3))
    Z[:3] = np.eye(3)
    L = np.diag([2.0, 1.0, 0.5])  # T = diag(4, 1, 1/4): T^{-1} exact
    return Z, L, Z / np.array([4.0, 1.0, 0.25])


def test_interface_metrics_judge_the_embedding_rows_as_computed_not_the_exact_ones():
    """The issue's survivor: pinv_drift and Penrose computed from the exact E = Z T^{-1} cannot see a
    solve error. Here E is off by d in one entry: W E - I = T Z^T Delta has the single entry 4 d."""
    Z, L, E = _exact_pit()
    d = 2.0**-20
    E_bad = E.copy()
    E_bad[0, 1] += d
    clean = metrics.interface_metrics(Z, L, E, U64)
    assert clean["pinv_drift"] == 0.0 and clean["penrose"] == 0.0
    bad = metrics.interface_metrics(Z, L, E_bad, U64)
    assert bad["pinv_drift"] == pytest.approx(4 * d, rel=1e-12)
    # ABA - A: E (M - I)^T = d e_0 e_1^T, ||E||_F^2 = 1/16 + 1 + 16 + d^2
    assert bad["penrose_1"] == pytest.approx(d / math.sqrt(17.0625 + d * d), rel=1e-9)
    assert bad["penrose"] == max(bad[f"penrose_{i}"] for i in range(1, 5))
    assert bad["trisolve_forward"] > 0


def test_interface_metrics_breakdown_margin_uses_the_factor_precision():
    """The issue's survivor: the breakdown margin must use factor_u (where T is factorised)."""
    Z, L, E = _exact_pit()
    m = metrics.interface_metrics(Z, L, E, U64, factor_u=U32)
    assert m["breakdown_margin"] == pytest.approx(20 * 3**1.5 * 16 * U32, rel=1e-14)
    assert m["orthonormality_ratio"] == 0.0 and m["cond_T"] == 16.0
    m64 = metrics.interface_metrics(Z, L, E, U64)
    assert m64["breakdown_margin"] == pytest.approx(20 * 3**1.5 * 16 * U64, rel=1e-14)


def test_interface_metrics_report_orthonormality_in_units_of_u():
    Z, L, E = _exact_pit(V=5)
    Z = Z.copy()
    Z[3, 0] = 2.0**-10  # Z^T Z - I = 2^-20 e_0 e_0^T
    m = metrics.interface_metrics(Z, L, Z / np.array([4.0, 1.0, 0.25]), U32, sample_rows=2)
    assert m["orthonormality"] == 2.0**-20
    assert m["orthonormality_ratio"] == pytest.approx(2.0**-20 / (5 * U32), rel=1e-14)
    assert metrics.interface_metrics(Z, L, Z / np.array([4.0, 1.0, 0.25]), U32, sample_rows=1)["cond_T"] == 16.0


def _off_manifold_pit():
    Z, L, E = _exact_pit(V=5)
    Z = Z.copy()
    Z[3, 0] = 2.0**-10
    return Z, L, E


def test_interface_metrics_refuse_mismatched_shapes():
    Z, L, E = _off_manifold_pit()
    with pytest.raises(PitcheckError):
        metrics.interface_metrics(Z, L, E[:4], U32)
    with pytest.raises(PitcheckError):
        metrics.interface_metrics(Z, np.eye(2), Z[:, :2], U32)


@pytest.mark.parametrize("bad", [0, -1, True, 2.5])
def test_interface_metrics_refuse_a_sample_size_that_is_not_a_positive_integer(bad):
    Z, L, E = _off_manifold_pit()
    with pytest.raises(PitcheckError):
        metrics.interface_metrics(Z, L, E[:5], U32, sample_rows=bad)


def test_penrose_residuals_closed_form_for_a_shear():
    """E = Z S, B = Z with S = [[1, a], [0, 1]]: AB = S^T, each residual in closed form."""
    a = 0.5
    Z = orthonormal(6, 2, seed=2)
    S = np.array([[1.0, a], [0.0, 1.0]])
    r = metrics.penrose_residuals(Z @ S, Z)
    nS = math.sqrt(2 + a * a)
    assert r["penrose_1"] == pytest.approx(a / nS, rel=1e-12)
    assert r["penrose_2"] == pytest.approx(a / math.sqrt(2), rel=1e-12)
    assert r["penrose_3"] == pytest.approx(math.sqrt(2) * a / nS, rel=1e-12)
    assert r["penrose_4"] == pytest.approx(math.sqrt(2) * a / nS, rel=1e-12)


def test_penrose_fourth_condition_alone_and_the_maximum_keeps_it():
    """The issue's survivor: the overall maximum must include (BA)^T = BA. Here D = 1, e^T b = 1, so
    conditions 1-3 hold exactly and ||b e^T - e b^T||_F / ||b e^T||_F = 1."""
    e = np.array([[1.0], [0.0], [0.0]])
    b = np.array([[1.0], [1.0], [0.0]])
    r = metrics.penrose_residuals(e, b)
    assert r == {"penrose_1": 0.0, "penrose_2": 0.0, "penrose_3": 0.0, "penrose_4": pytest.approx(1.0, rel=1e-14)}
    h = metrics.head_metrics(e, b)
    assert h["penrose"] == pytest.approx(1.0, rel=1e-14)
    assert h["pinv_drift"] == 0.0


def test_penrose_residuals_of_zero_maps_are_zero():
    z = np.zeros((4, 2))
    assert metrics.penrose_residuals(z, z) == {f"penrose_{i}": 0.0 for i in range(1, 5)}
    with pytest.raises(PitcheckError):
        metrics.penrose_residuals(np.ones((4, 2)), np.ones((4, 3)))


def _svd_references(E, B):
    """penrose_4 from the explicit V x V product and pinv_error from an SVD pseudo-inverse (small V)."""
    BA = B @ E.T
    U, sv, Vt = np.linalg.svd(E, full_matrices=False)
    pinv = (Vt.T / sv) @ U.T
    return (np.linalg.norm(BA - BA.T) / np.linalg.norm(BA),
            np.linalg.norm(B.T - pinv) / np.linalg.norm(pinv))


@pytest.mark.parametrize("cond", [10.0, 1e5, 1e7, 1e9])
def test_head_metrics_agree_with_svd_references_on_both_qr_paths(cond, monkeypatch):
    """Up to CHOLQR2_MAX_COND = 1e6 Cholesky QR twice, above it Householder QR (at 1e7 the Gram's
    Cholesky still succeeds, so only the threshold sends it there; at 1e9 the Cholesky fails): both
    must give the explicit V x V and SVD values, for a head off the pseudo-inverse and the exact one."""
    rng = np.random.default_rng(7)
    V, D = 40, 5
    U, _ = np.linalg.qr(rng.standard_normal((V, D)))
    W, _ = np.linalg.qr(rng.standard_normal((D, D)))
    E = (U * np.geomspace(1.0, 1.0 / cond, D)) @ W.T
    householder = []
    real_qr = np.linalg.qr
    monkeypatch.setattr(np.linalg, "qr", lambda *a, **k: householder.append(1) or real_qr(*a, **k))
    exact = np.linalg.pinv(E).T
    off = exact + 1e-3 * np.linalg.norm(exact) * rng.standard_normal((V, D))
    for B in (off, exact):
        h = metrics.head_metrics(E, B)
        p4, err = _svd_references(E, B)
        if B is off:
            assert h["penrose_4"] == pytest.approx(p4, rel=1e-6) and h["pinv_error"] == pytest.approx(err, rel=1e-6)
        else:  # both at rounding level: the exact pseudo-inverse computed in float64
            assert h["penrose_4"] < 1e-13 * cond and h["pinv_error"] < 1e-13 * cond
    assert bool(householder) == (cond > metrics.CHOLQR2_MAX_COND)


def test_head_metrics_refuse_a_head_too_large_for_float64():
    E = orthonormal(40, 3)
    with pytest.raises(PitcheckError, match="QR"):  # the QR overflows, not the Penrose products
        metrics.pinv_error(E, np.full((40, 3), 1e308))  # Q^T B overflows; R is fine
    with pytest.raises(PitcheckError, match="too large"):
        metrics.head_metrics(E, np.full((40, 3), 1e308))
    # E^T E overflows, so Householder QR takes over and still gives the values; pinv(E) = diag(1/s) E^T
    s = np.array([1e160, 1.0, 0.5])
    assert metrics.pinv_error(E * s, E / s) < 1e-15
    assert metrics.pinv_error(E * s, 1.25 * E / s) == pytest.approx(0.25, rel=1e-12)


def test_penrose_residuals_of_a_wide_embedding():
    # V < D: the fourth condition is still defined (pinv_error is not: E has no left inverse)
    E = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    B = np.array([[1.0, 0.0, 0.0], [0.5, 1.0, 0.0]])
    BA = B @ E.T
    r = metrics.penrose_residuals(E, B)
    assert r["penrose_4"] == pytest.approx(np.linalg.norm(BA - BA.T) / np.linalg.norm(BA), rel=1e-14)
    for pinv_metric in (metrics.pinv_error, metrics.head_metrics):
        with pytest.raises(PitcheckError, match=r"V >= D.*\(2, 3\)"):  # the condition and the shape
            pinv_metric(E, B)


def test_pinv_error_is_relative_to_the_pseudo_inverse():
    Z = orthonormal(6, 2, seed=4)
    S = np.array([[2.0, 1.0], [0.0, 0.5]])
    E = Z @ S
    B = Z @ np.linalg.inv(S).T  # W = S^{-1} Z^T = pinv(E)
    assert metrics.pinv_error(E, B) < 1e-15
    assert metrics.pinv_error(E, 1.25 * B) == pytest.approx(0.25, rel=1e-12)
    assert metrics.pinv_error(E, 0 * B) == pytest.approx(1.0, rel=1e-15)


@pytest.mark.parametrize("E, B", [(np.eye(4, 2) * [1.0, 0.0], np.ones((4, 2))), (np.ones((2, 3)), np.ones((2, 3)))],
                         ids=["rank-deficient", "V<D"])
def test_pinv_error_refuses_an_embedding_without_a_left_inverse(E, B):
    with pytest.raises(PitcheckError):
        metrics.pinv_error(E, B)


def test_head_metrics_keys_and_values_of_an_exact_pair():
    Z = orthonormal(6, 2, seed=4)
    S = np.array([[2.0, 1.0], [0.0, 0.5]])
    h = metrics.head_metrics(Z @ S, Z @ np.linalg.inv(S).T)
    assert set(h) == {"pinv_drift", "penrose", "penrose_1", "penrose_2", "penrose_3", "penrose_4", "pinv_error"}
    assert max(h.values()) < 1e-14


# ---- helpers ------------------------------------------------------------------------------------------
def test_sample_ids_are_evenly_spaced_with_both_ends():
    np.testing.assert_array_equal(metrics.sample_ids(10, 4), [0, 3, 6, 9])
    np.testing.assert_array_equal(metrics.sample_ids(3, 10), [0, 1, 2])
    np.testing.assert_array_equal(metrics.sample_ids(5, 1), [0])


def test_ratio_zero_over_zero_is_zero_and_x_over_zero_an_error():
    assert metrics._ratio(0.0, 0.0) == 0.0
    assert metrics._ratio(3.0, 2.0) == 1.5
    with pytest.raises(PitcheckError):
        metrics._ratio(1.0, 0.0)


def test_measure_guarded_gives_nan_for_failed_parts_with_the_reason():
    def bad():
        raise PitcheckError("undefined here")

    out = metrics.measure_guarded([(["a", "b"], bad), (["c"], lambda: {"c": 1.0})], unmeasured=["earlier"])
    assert math.isnan(out["a"]) and math.isnan(out["b"]) and out["c"] == 1.0
    assert out["unmeasured"] == ["earlier", "undefined here"]
    assert metrics.measure_guarded([(["c"], lambda: {"c": 2.0})]) == {"c": 2.0, "unmeasured": []}


@pytest.mark.parametrize("L, strict", [
    (np.ones((2, 3)), True), (np.array([[1.0, 1.0], [0.0, 1.0]]), True),  # not square; upper
    (np.diag([1.0, 0.0]), True), (np.diag([1.0, -1e-300]), False),  # zero pivot (strict); negative pivot
    (np.tril(np.ones((3, 2))), True), (np.tril(np.ones((2, 3))), True),  # lower trapezoids
], ids=["2x3", "upper", "zero-pivot", "negative-pivot", "trapezoid-3x2", "trapezoid-2x3"])
def test_as_factor_refuses_what_is_not_a_square_lower_factor_with_a_positive_diagonal(L, strict):
    with pytest.raises(PitcheckError):
        metrics.as_factor(L, strict=strict)


@pytest.mark.parametrize("bad", [0, 1, -0.5, float("nan"), "x"])
def test_unit_roundoff_refuses_what_is_not_in_0_1(bad):
    with pytest.raises(PitcheckError):
        metrics.unit_roundoff(bad)


def test_input_checks_of_the_factor_and_u():
    np.testing.assert_array_equal(metrics.as_factor(np.diag([1.0, 0.0]), strict=False), np.diag([1.0, 0.0]))
    assert metrics.unit_roundoff(0.5) == 0.5
    assert metrics.unit_roundoff(1 - 2.0**-53) == 1 - 2.0**-53


def test_as_factor_refuses_a_non_square_lower_trapezoid():
    with pytest.raises(PitcheckError, match="square"):
        metrics.as_factor(np.tril(np.ones((3, 2))))


def test_interface_metrics_sample_256_rows_by_default():
    """The solve errors are measured on sample_ids(V, 256): an error in a row outside that sample is
    not seen, one inside it is."""
    V = 300
    Z = np.zeros((V, 2))
    Z[:, 0] = 1 / math.sqrt(V)
    Z[0, 1] = 1.0
    L = np.eye(2)
    inside = set(metrics.sample_ids(V, 256).tolist())
    outside_255 = sorted(inside - set(metrics.sample_ids(V, 255).tolist()))[0]
    outside_256 = sorted(set(range(V)) - inside)[0]
    E = Z.copy()
    E[outside_255, 0] += 1e-9
    assert metrics.interface_metrics(Z, L, E, U32)["trisolve_forward"] > 1e-8
    E = Z.copy()
    E[outside_256, 0] += 1e-9
    assert metrics.interface_metrics(Z, L, E, U32)["trisolve_forward"] == 0.0
    with pytest.raises(PitcheckError, match="square"):
        metrics.as_factor(np.tril(np.ones((2, 3))))


def test_extended_precision_bits_are_the_long_double_significand():
    assert 2.0**-metrics.EXTENDED_BITS == float(np.finfo(np.longdouble).eps) / 2


def test_interface_metrics_refuse_a_factor_of_the_wrong_size_with_the_shapes():
    Z = orthonormal(6, 2)
    with pytest.raises(PitcheckError, match=r"Z \(6, 2\), L \(3, 3\), E \(6, 2\)"):  # all three shapes
        metrics.interface_metrics(Z, np.eye(3), Z, U32)


def test_drift_bound_of_a_single_column():
    Z = np.array([[0.5], [0.0]])  # Z^T Z - I = -3/4
    assert metrics.drift_bound(Z, np.array([[0.5]]), U32) == pytest.approx(0.75 + U32, rel=1e-15)


def test_a_failed_svd_is_a_pitcheck_error(monkeypatch):
    def broken(*a, **k):
        raise np.linalg.LinAlgError("SVD did not converge")

    monkeypatch.setattr(np.linalg, "svd", broken)
    with pytest.raises(PitcheckError, match="SVD"):
        metrics.cholesky_conditioning(np.eye(2), U32)
    # the QR behind the head metrics only estimates cond(E) by an SVD: without it, Householder QR
    Q = orthonormal(4, 2)
    assert metrics.pinv_error(Q, Q) < 1e-15


def test_as_matrix_accepts_ml_dtypes_floats_and_refuses_other_void_types():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    a = metrics.as_matrix(np.ones((2, 2), dtype=ml_dtypes.bfloat16), "Z")
    assert a.dtype == np.float64 and (a == 1).all()
    with pytest.raises(PitcheckError, match="real numeric"):
        metrics.as_matrix(np.zeros((2, 2), dtype="V8"), "Z")
    with pytest.raises(PitcheckError, match="real numeric"):
        metrics.as_matrix(np.array([["a", "b"]]), "Z")


def test_trisolve_errors_refuse_a_factor_smaller_than_D():
    Z = orthonormal(6, 2)
    with pytest.raises(PitcheckError, match="shape mismatch"):
        metrics.trisolve_errors(Z, np.eye(1), Z[:2], [0, 1], U32)


def test_as_factor_accepts_a_large_square_factor():
    # shapes compared by value: 300 is not a cached small int
    assert metrics.as_factor(np.eye(300)).shape == (300, 300)


def test_drift_bound_uses_the_extreme_singular_values_of_L():
    Z3 = np.zeros((5, 3))
    Z3[:2, :2] = np.linalg.cholesky(np.eye(2) + M_SYM).T
    Z3[2, 2] = 1.0  # Z3^T Z3 - I = blkdiag(M, 0)
    L = np.diag([2.0, 1.0, 0.5])  # cond(T) = 16, not (2/1)^2 or (1/0.5)^2
    assert metrics.drift_bound(Z3, L, U32) == pytest.approx(16 * (math.sqrt(0.41) + U32), rel=1e-12)


# ---- each metric on a known case, a case built to break it and one that must pass ---------------
def test_orthonormality_loss_known_value():
    Z, _ = pit_pair(50, 6, 1.0)
    delta = 1e-3
    Z[:, 2] *= 1 + delta  # Z^T Z - I has the single entry (1 + delta)^2 - 1
    assert metrics.orthonormality_loss(Z) == pytest.approx(2 * delta + delta**2, rel=1e-9)


def test_orthonormality_ratio_passes_householder_and_fails_gram_schmidt(rng):
    # randsvd: cond 1e7 with mixed singular vectors (column scaling alone would not hurt Gram-Schmidt)
    U1, _ = np.linalg.qr(rng.standard_normal((200, 12)))
    V1, _ = np.linalg.qr(rng.standard_normal((12, 12)))
    A = (U1 * np.logspace(0, -7, 12)) @ V1.T
    Q, _ = np.linalg.qr(A)
    assert metrics.orthonormality_ratio(Q, U) < 30
    # classical Gram-Schmidt loses orthogonality like cond^2 u
    G = np.zeros_like(A)
    for j in range(A.shape[1]):
        v = A[:, j] - G[:, :j] @ (G[:, :j].T @ A[:, j])
        G[:, j] = v / np.linalg.norm(v)
    assert metrics.orthonormality_ratio(G, U) > 30


def test_cholesky_conditioning_known_values():
    L = np.diag([2.0, 1e-3, 1.0])
    c = metrics.cholesky_conditioning(L, U)
    assert c["cond_L"] == pytest.approx(2e3)
    assert c["cond_T"] == pytest.approx(4e6)
    assert c["min_diag_L"] == 1e-3
    assert c["breakdown_margin"] == pytest.approx(20 * 3**1.5 * 4e6 * U)
    # the same T is out of reach of bf16's Cholesky guarantee
    assert metrics.cholesky_conditioning(L, 2.0**-8)["breakdown_margin"] > 1


@pytest.mark.parametrize("cond", [1.0, 1e4, 1e10])
def test_trisolve_errors_pass_the_reference_solve(cond):
    Z, L = pit_pair(300, 16, cond)
    ids = metrics.sample_ids(300, 64)
    r = metrics.trisolve_errors(Z, L, reference.embed(Z, L, ids), ids, U)
    assert r["trisolve_backward_ratio"] < 30
    assert r["trisolve_forward_ratio"] < 2 * 16
    assert r["trisolve_resolved"]


def test_trisolve_errors_fail_a_perturbed_solve():
    Z, L = pit_pair(300, 16, 1e4)
    ids = metrics.sample_ids(300, 64)
    E = reference.embed(Z, L, ids)
    rng = np.random.default_rng(0)
    bad = E * (1 + 1e-10 * rng.standard_normal(E.shape))
    r = metrics.trisolve_errors(Z, L, bad, ids, U)
    assert r["trisolve_backward_ratio"] > 30
    assert r["trisolve_forward"] == pytest.approx(1e-10, rel=0.8)


def test_trisolve_says_when_the_yardstick_is_too_coarse(monkeypatch):
    Z, L = pit_pair(100, 8, 10.0)
    ids = metrics.sample_ids(100, 10)
    E = reference.embed(Z, L, ids)
    assert metrics.trisolve_errors(Z, L, E, ids, U)["trisolve_resolved"]
    monkeypatch.setattr(metrics, "EXTENDED_BITS", 53)  # a platform whose long double is float64
    assert not metrics.trisolve_errors(Z, L, E, ids, U)["trisolve_resolved"]


def test_trisolve_says_when_precision_cannot_resolve():
    Z, L = pit_pair(100, 8, 1e8)
    ids = metrics.sample_ids(100, 10)
    r = metrics.trisolve_errors(Z, L, reference.embed(Z, L, ids), ids, u=2.0**-8)  # bf16: cond u >> 0.1
    assert not r["trisolve_resolved"]


def test_pinv_drift_and_penrose_pass_exact_pit_and_fail_standard_tying():
    Z, L = pit_pair(400, 12, 100.0)
    E = reference.embedding_matrix(Z, L)
    B = Z @ (L @ L.T)
    cond_T = 100.0
    assert metrics.pinv_drift(E, B) < 12 * cond_T * U * 10
    pen = metrics.penrose_residuals(E, B)
    assert max(pen.values()) < 12 * cond_T * U * 10
    assert metrics.pinv_error(E, B) < 12 * cond_T * U * 10
    # standard tying W = E^T: W E = E^T E = T^{-2}, far from I; known drift ||T^{-2} - I||_F
    T = L @ L.T
    Tinv = np.linalg.inv(T)
    assert metrics.pinv_drift(E, E) == pytest.approx(np.linalg.norm(Tinv @ Tinv - np.eye(12)), rel=1e-8)
    assert max(metrics.penrose_residuals(E, E).values()) > 0.1
    assert metrics.pinv_error(E, E) > 0.1


def test_penrose_residuals_match_explicit_v_by_v_computation():
    rng = np.random.default_rng(3)
    E = rng.standard_normal((40, 5))
    B = np.linalg.pinv(E).T + 1e-3 * rng.standard_normal((40, 5))
    A = E.T
    BA = B @ A  # small V: the explicit V x V is fine here, as the yardstick
    explicit = [
        np.linalg.norm(A @ B @ A - A) / np.linalg.norm(A),
        np.linalg.norm(B @ A @ B - B) / np.linalg.norm(B),
        np.linalg.norm((A @ B).T - A @ B) / np.linalg.norm(A @ B),
        np.linalg.norm(BA.T - BA) / np.linalg.norm(BA),
    ]
    got = metrics.penrose_residuals(E, B)
    assert np.allclose([got[f"penrose_{i}"] for i in range(1, 5)], explicit, rtol=1e-10)


def test_penrose_4_has_no_cancellation():
    # exact PIT at T = I: BA is the projector Z Z^T; the Gram formula would floor at sqrt(u)
    Z, L = pit_pair(500, 8, 1.0)
    assert metrics.penrose_residuals(Z, Z)["penrose_4"] < 1e-14


def test_pinv_error_known_value():
    Z, L = pit_pair(200, 6, 1.0)  # T = Q diag(1..1) Q^T = I: pinv(Z) = Z^T
    W = Z.T.copy()
    W[0] *= 1.01
    assert metrics.pinv_error(Z, W.T) == pytest.approx(0.01 * np.linalg.norm(W[0] / 1.01) / np.sqrt(6), rel=1e-6)


def test_interface_metrics_reject_shape_mismatch():
    Z, L = pit_pair(30, 4, 1.0)
    with pytest.raises(PitcheckError, match="shape mismatch"):
        metrics.interface_metrics(Z, L, Z[:10], U)


def test_interface_metrics_never_form_a_v_by_v_matrix():
    V, D = 65536, 16
    Z, L = pit_pair(V, D, 10.0)
    E = reference.embedding_matrix(Z, L)
    tracemalloc.start()
    metrics.interface_metrics(Z, L, E, U)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 40 * V * D * 8  # a V x V float64 would be 34 GB


@settings(max_examples=25, deadline=None)
@given(vocab=st.integers(4, 300), dim=st.integers(1, 12), log_cond=st.floats(0, 8), seed=st.integers(0, 2**31))
def test_metrics_of_exact_pit_stay_within_conditioning_bounds(vocab, dim, log_cond, seed):
    dim = min(dim, vocab)
    Z, L = pit_pair(vocab, dim, 10.0**log_cond, seed)
    m = metrics.interface_metrics(Z, L, reference.embedding_matrix(Z, L), U)
    assert m["orthonormality_ratio"] < 30
    assert m["trisolve_backward_ratio"] < 30
    bound = 10 * m["cond_T"] * (m["orthonormality"] + dim * U) * np.sqrt(dim)
    assert m["pinv_drift"] < bound and m["penrose"] < bound


def test_drift_bound_known_value_and_singular_transform():
    Z, _ = pit_pair(50, 3, 1.0)
    Z[:, 0] *= 1 + 1e-6  # orthonormality loss 2e-6 + 1e-12
    L = np.diag([2.0, 1.0, 1.0])  # cond(T) = 4
    assert metrics.drift_bound(Z, L, U) == pytest.approx(4 * (2e-6 + 1e-12 + U), rel=1e-8)
    # and the bound bounds: the exact PIT drift of this pair stays below it
    E = reference.embedding_matrix(Z, L)
    assert metrics.pinv_drift(E, Z @ (L @ L.T)) <= metrics.drift_bound(Z, L, U)
    assert metrics.drift_bound(Z, np.diag([1.0, 0.0, 1.0]), U) == float("inf")


def test_condition_number_of_a_tall_float32_matrix_with_known_singular_values():
    rng = np.random.default_rng(7)
    U = np.linalg.qr(rng.standard_normal((3000, 40)))[0]
    V = np.linalg.qr(rng.standard_normal((40, 40)))[0]
    s = np.geomspace(91.0, 1.0, 40)
    A = ((U * s) @ V.T).astype(np.float32)  # rounding to float32 moves each singular value by O(u)
    assert metrics.condition_number(A) == pytest.approx(91.0, rel=1e-4)
    assert metrics.condition_number(A.T) == pytest.approx(91.0, rel=1e-4)  # wide: the same numbers
    A[5, 3] = np.nan
    assert metrics.condition_number(A) == math.inf


def test_condition_number_falls_back_where_divide_and_conquer_fails(monkeypatch):
    """gesdd did not converge on SmolLM2's 49152 x 576 table: the QR-iteration SVD answers instead."""
    def no_convergence(*args, **kwargs):
        raise np.linalg.LinAlgError("SVD did not converge")

    monkeypatch.setattr(np.linalg, "svd", no_convergence)
    A = np.diag([4.0, 2.0, 0.5])[:, :3]
    assert metrics.condition_number(np.vstack([A, np.zeros((5, 3))])) == pytest.approx(8.0, rel=1e-14)


def test_ratios_is_ratio_elementwise_bit_for_bit():
    """trisolve_errors' per-row ratios in one pass: the values (and the refusal) of _ratio row by row."""
    from pitcheck.numerics.metrics import _ratio, _ratios

    num = np.array([1.0, 0.0, 0.0, 3e-300, np.inf, 2.0, 0.0, 5.0])
    den = np.array([3.0, 0.0, np.nan, 7e-10, np.inf, 1e-310, 4.0, 6.0])
    expected = np.array([_ratio(n, d) for n, d in zip(num, den)])
    np.testing.assert_array_equal(_ratios(num, den), expected)  # NaN where inf / inf, as there
    for bad_den in (0.0, np.nan, -1.0):
        with pytest.raises(PitcheckError, match="reference is zero"):
            _ratios(np.array([1.0, 1.0]), np.array([1.0, bad_den]))
