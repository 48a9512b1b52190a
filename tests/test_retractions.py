"""Every registered retraction: lands on the manifold, agrees with Z + t xi to first order, O(V D^2)."""
import tracemalloc

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pitcheck import PitcheckError, metrics, oracle, reference
from pitcheck.retractions import (RETRACTIONS, RetractionError, get_retraction, reproject,
                                  tangent_projection)

U = 2.0**-53
ON_MANIFOLD = [name for name in RETRACTIONS if name not in ("none", "cayley-iter")]


def _point_and_step(V=300, D=12, seed=0):
    rng = np.random.default_rng(seed)
    Z = reference.random_memory(V, D, rng)
    xi = tangent_projection(Z, rng.standard_normal((V, D)))
    return Z, xi / np.linalg.norm(xi)


def test_tangent_projection_is_tangent_and_idempotent():
    Z, xi = _point_and_step()
    S = Z.T @ xi
    assert np.linalg.norm(S + S.T) < 1e-14  # Z^T xi skew
    assert np.allclose(tangent_projection(Z, xi), xi, atol=1e-15)


@pytest.mark.parametrize("name", ON_MANIFOLD)
def test_retraction_lands_on_manifold(name):
    Z, xi = _point_and_step()
    Y = RETRACTIONS[name](Z, 0.3 * xi)
    assert metrics.orthonormality_ratio(Y, U) < 30


@pytest.mark.parametrize("name", ["none", "cayley-iter"])
def test_check_catches_retractions_that_leave_the_manifold(name):
    # the same check must fail these: none drifts at second order, cayley-iter truncates at third
    Z, xi = _point_and_step()
    Y = RETRACTIONS[name](Z, 0.3 * xi)
    assert metrics.orthonormality_ratio(Y, U) > 30


def _first_order_slope(fn, Z, xi):
    ts = np.array([1e-2, 5e-3, 2.5e-3, 1.25e-3])
    errs = np.array([np.linalg.norm(fn(Z, t * xi) - Z - t * xi) for t in ts])
    return np.polyfit(np.log(ts), np.log(errs), 1)[0], errs


@pytest.mark.parametrize("name", [n for n in RETRACTIONS if n != "none"])
def test_first_order_agreement(name):
    # R(Z, t xi) = Z + t xi + O(t^2): the remainder's log-log slope is 2
    Z, xi = _point_and_step()
    slope, errs = _first_order_slope(RETRACTIONS[name], Z, xi)
    assert 1.8 < slope < 3.2, (slope, errs)


def test_first_order_check_fails_a_wrong_map():
    # a map that moves along xi at half speed agrees only to zeroth order: slope 1
    Z, xi = _point_and_step()
    slope, _ = _first_order_slope(lambda Z, x: RETRACTIONS["qr"](Z, 0.5 * x), Z, xi)
    assert slope < 1.2


def test_polar_is_the_nearest_orthonormal_matrix():
    rng = np.random.default_rng(2)
    Z = reference.random_memory(60, 6, rng)
    xi = 0.02 * rng.standard_normal(Z.shape)  # not tangent: polar of any full-rank Y
    Y = Z + xi
    exact = oracle.polar(Y)
    for name in ("polar", "polar-gram", "polar-ns"):
        got = RETRACTIONS[name](Z, xi)
        assert np.linalg.norm(got - exact) < 60 * 6 * U * np.linalg.cond(Y), name
    # and nearer than any other orthonormal candidate, the QR factor among them
    q = RETRACTIONS["qr"](Z, xi)
    assert np.linalg.norm(Y - exact) < np.linalg.norm(Y - q)


@pytest.mark.parametrize("name", list(RETRACTIONS))
def test_numpy_and_torch_run_the_same_retraction(name):
    Z, xi = _point_and_step(200, 8, 4)
    a = RETRACTIONS[name](Z, 0.1 * xi)
    b = RETRACTIONS[name](torch.from_numpy(Z), torch.from_numpy(0.1 * xi)).numpy()
    assert np.linalg.norm(a - b) < 100 * U * np.linalg.norm(a)


def test_polar_ns_refuses_far_points():
    Z, xi = _point_and_step()
    with pytest.raises(RetractionError):
        RETRACTIONS["polar-ns"](Z, 50 * xi)


def test_cholqr_reports_breakdown():
    Z = np.zeros((20, 3))
    Z[:, 0] = 1.0
    with pytest.raises(RetractionError):
        RETRACTIONS["cholqr"](Z, np.zeros_like(Z))


def test_unknown_retraction_is_a_clear_error():
    with pytest.raises(PitcheckError, match="unknown retraction 'householder'"):
        get_retraction("householder")


def test_reproject_restores_the_manifold():
    Z, xi = _point_and_step()
    drifted = Z + 0.3 * xi
    assert metrics.orthonormality_ratio(reproject(drifted), U) < 30


@pytest.mark.parametrize("name", ["cayley", "cayley-iter", "polar-gram", "qr"])
def test_no_v_by_v_array_at_a_large_vocabulary(name):
    V, D = 65536, 32
    Z, xi = _point_and_step(V, D, 1)
    tracemalloc.start()
    Y = RETRACTIONS[name](Z, 0.1 * xi)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 20 * V * D * 8  # a V x V float64 would be 34 GB
    assert metrics.orthonormality_loss(Y) < 1e-3


@settings(max_examples=20, deadline=None)
@given(vocab=st.integers(2, 200), dim=st.integers(1, 10), scale=st.floats(1e-6, 0.5), seed=st.integers(0, 2**31),
       name=st.sampled_from(ON_MANIFOLD))
def test_retractions_land_on_manifold_for_any_shape(vocab, dim, scale, seed, name):
    dim = min(dim, vocab)
    if name == "cholqr" and vocab == dim:
        dim = max(1, dim - 1)
    Z, xi = _point_and_step(vocab, dim, seed)
    Y = RETRACTIONS[name](Z, scale * xi)
    assert Y.shape == Z.shape
    assert metrics.orthonormality_ratio(Y, U) < 30
