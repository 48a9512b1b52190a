"""Each metric on a case with a known value, on a case built to break it, and on one that must pass."""
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import pit_pair
from pitcheck import PitcheckError, metrics, reference

U = 2.0**-53


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
