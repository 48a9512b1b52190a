"""pitcheck.model.gradients: the gradient models, seeded, shaped, and each doing what its name says (with a case it
must not do); each loss-derived model's output against a float64 central difference of the loss it claims
to be the gradient of (error in units of the difference's own truncation error); each synthetic model's
exact construction from its seeded stream (mirrored draw by draw); the parameters each model reads."""
import dataclasses
import math

import numpy as np
import pytest

from pitcheck.model import gradients as G
from pitcheck.infra.errors import PitcheckError
from pitcheck.model.gradients import (GRADIENT_MODELS, MODEL_PARAMETERS, AdversaryParams, check_adversary_params,
                                default_params, gradient, parse_adversary, register)
from pitcheck.numerics.metrics import drift_bound
from pitcheck.model.retractions import tangent_projection
from tests.helpers import pit_pair

U = 2.0**-53
PARAMS = AdversaryParams()


import pitcheck.sources.lm  # noqa: E402,F401  (registers "lm" whatever the collection order)

# adaptive picks among the others; lm has state (its body), tested in test_lm.py
STATELESS = [n for n in GRADIENT_MODELS if n not in ("adaptive", "lm")]


def test_the_stateful_lm_source_refuses_a_stateless_call():
    Z, L = pit_pair(40, 4, 2.0)
    with pytest.raises(PitcheckError, match="has state"):
        gradient("lm", Z, L, seed=0, step=0, params=PARAMS)


@pytest.mark.parametrize("name", STATELESS)
def test_models_are_seeded_and_shaped(name):
    Z, L = pit_pair(120, 6, 10.0)
    a = gradient(name, Z, L, seed=3, step=7, params=PARAMS)
    b = gradient(name, Z, L, seed=3, step=7, params=PARAMS)
    assert a[0].shape == Z.shape and a[1].shape == L.shape
    assert np.array_equal(a[0], b[0], equal_nan=True) and np.array_equal(a[1], b[1])


def test_different_steps_and_seeds_give_different_streams():
    Z, L = pit_pair(50, 4, 1.0)
    g0 = gradient("gaussian", Z, L, 0, 0, PARAMS)[0]
    assert not np.array_equal(g0, gradient("gaussian", Z, L, 0, 1, PARAMS)[0])
    assert not np.array_equal(g0, gradient("gaussian", Z, L, 1, 0, PARAMS)[0])


def test_dense_output_moves_every_row_and_sparse_input_only_the_batch():
    Z, L = pit_pair(500, 8, 10.0)
    dense = GRADIENT_MODELS["dense_output"](Z, L, np.random.default_rng(0), PARAMS, None)[0]
    sparse = GRADIENT_MODELS["sparse_input"](Z, L, np.random.default_rng(0), PARAMS, None)[0]
    assert (np.abs(dense).sum(axis=1) > 0).all()
    moved = (np.abs(sparse).sum(axis=1) > 0).sum()
    assert 0 < moved <= PARAMS.batch


def test_dense_output_is_the_cross_entropy_gradient():
    # finite-difference check of dLoss/dZ for the head logits (h T) Z^T
    rng_seed = 5
    Z, L = pit_pair(40, 4, 3.0)
    params = AdversaryParams(batch=3)
    GZ, _ = GRADIENT_MODELS["dense_output"](Z, L, np.random.default_rng(rng_seed), params, None)
    rng = np.random.default_rng(rng_seed)
    h = rng.standard_normal((3, 4))  # the model draws h first, then the targets
    w = 1.0 / np.arange(1, 41) ** params.zipf_exponent
    targets = rng.choice(40, size=3, p=w / w.sum())

    def loss(Zp):
        logit = ((h @ L) @ L.T) @ Zp.T
        logit -= logit.max(axis=1, keepdims=True)
        return np.mean(np.log(np.exp(logit).sum(axis=1)) - logit[np.arange(3), targets])

    E = np.zeros_like(Z)
    E[7, 2] = 1e-6
    fd = (loss(Z + E) - loss(Z - E)) / 2e-6
    assert fd == pytest.approx(GZ[7, 2], rel=1e-5, abs=1e-10)


def test_sparse_input_scale_multiplies():
    Z, L = pit_pair(100, 4, 1.0)
    a = GRADIENT_MODELS["sparse_input"](Z, L, np.random.default_rng(1), PARAMS, None)[0]
    b = GRADIENT_MODELS["sparse_input"](Z, L, np.random.default_rng(1), AdversaryParams(input_scale=3.0), None)[0]
    assert np.allclose(b, 3 * a)


def test_normal_model_is_normal():
    Z, L = pit_pair(100, 5, 1.0)
    G = GRADIENT_MODELS["normal"](Z, L, np.random.default_rng(0), PARAMS, None)[0]
    assert np.linalg.norm(tangent_projection(Z, G)) < 1e-12 * np.linalg.norm(G)


def test_conditioning_attack_lowers_sigma_min_and_gaussian_does_not_target_it():
    Z, L = pit_pair(60, 6, 100.0)
    smin = np.linalg.svd(L, compute_uv=False)[-1]
    GL = GRADIENT_MODELS["conditioning"](Z, L, np.random.default_rng(0), PARAMS, None)[1]
    assert np.linalg.svd(L - 1e-3 * GL, compute_uv=False)[-1] < smin
    assert np.allclose(GL, np.tril(GL))


def test_spike_and_rank1_fire_at_their_rates():
    Z, L = pit_pair(30, 3, 1.0)
    fired = [np.any(gradient("spike", Z, L, 0, s, PARAMS)[0] != 0) for s in range(2000)]
    assert 5 <= sum(fired) <= 40  # p = 0.01 of 2000: 20 expected
    bursts = [gradient("rank1", Z, L, 0, s, PARAMS)[0] for s in range(300)]
    nonzero = [b for b in bursts if np.any(b)]
    assert 10 <= len(nonzero) <= 55  # p = 0.1 of 300
    assert all(np.linalg.matrix_rank(b) == 1 for b in nonzero[:5])


def test_heavy_tail_has_outliers_gaussian_does_not():
    Z, L = pit_pair(400, 8, 1.0)
    t = gradient("heavy_tail", Z, L, 0, 0, PARAMS)[0].ravel()
    g = gradient("gaussian", Z, L, 0, 0, PARAMS)[0].ravel()
    assert np.max(np.abs(t)) / np.median(np.abs(t)) > 50
    assert np.max(np.abs(g)) / np.median(np.abs(g)) < 10


def test_composition_is_the_sum():
    Z, L = pit_pair(80, 4, 1.0)
    both = gradient("gaussian,dense_output", Z, L, 2, 5, PARAMS)
    a = GRADIENT_MODELS["gaussian"](Z, L, np.random.default_rng([2, 5, 0]), PARAMS, None)
    b = GRADIENT_MODELS["dense_output"](Z, L, np.random.default_rng([2, 5, 1]), PARAMS, None)
    assert np.allclose(both[0], a[0] + b[0]) and np.allclose(both[1], a[1] + b[1])


def test_adaptive_picks_the_worst_candidate():
    Z, L = pit_pair(80, 4, 1.0)
    calls = []

    def probe(GZ, GL):
        calls.append(np.linalg.norm(GL))
        return np.linalg.norm(GL)  # a probe that prefers the largest L gradient

    GZ, GL = GRADIENT_MODELS["adaptive"](Z, L, np.random.default_rng(0), PARAMS, probe)
    assert len(calls) == 5 and np.linalg.norm(GL) == max(calls)


def test_unknown_model_is_a_clear_error():
    with pytest.raises(PitcheckError, match="unknown gradient model 'adverse'"):
        parse_adversary("gaussian,adverse")
    with pytest.raises(PitcheckError, match="empty"):
        parse_adversary(" , ")


def _zipf(V, count, s, rng):
    w = 1.0 / np.arange(1, V + 1) ** s
    return rng.choice(V, size=count, p=w / w.sum())


def _fd_error_in_truncation_units(loss, X, grad, delta):
    """max over entries of |grad - D(delta)| / (truncation + rounding), D the central difference.

    D(delta) - f' = c delta^2 + O(delta^4), so D(2 delta) - D(delta) = 3 c delta^2: a third of it is the
    truncation error of D(delta). Rounding adds about u |f| / delta. A right gradient scores about 1."""
    worst = 0.0
    f0 = abs(loss(X))
    for idx in np.ndindex(X.shape):
        def d(h):
            E = np.zeros_like(X)
            E[idx] = h
            return (loss(X + E) - loss(X - E)) / (2 * h)

        d1, d2 = d(delta), d(2 * delta)
        scale = abs(d2 - d1) / 3 + 8 * U * max(f0, 1.0) / delta
        worst = max(worst, abs(grad[idx] - d1) / scale)
    return worst


def _dense_setup(V=7, D=3, batch=4, seed=5, cond=3.0):
    Z, L = pit_pair(V, D, cond, seed=1)
    params = AdversaryParams(batch=batch)
    GZ, GL = GRADIENT_MODELS["dense_output"](Z, L, np.random.default_rng(seed), params, None)
    rng = np.random.default_rng(seed)
    h = rng.standard_normal((batch, D))  # the model draws h first, then the targets
    targets = _zipf(V, batch, params.zipf_exponent, rng)

    def loss(Zp, Lp):
        logit = ((h @ Lp) @ Lp.T) @ Zp.T
        m = logit.max(axis=1, keepdims=True)
        return np.mean(np.log(np.exp(logit - m).sum(axis=1)) + m[:, 0] - logit[np.arange(batch), targets])

    return Z, L, GZ, GL, loss


def test_dense_output_Z_gradient_is_the_cross_entropy_gradient_to_fd_truncation():
    Z, L, GZ, _, loss = _dense_setup()
    assert _fd_error_in_truncation_units(lambda X: loss(X, L), Z, GZ, 1e-3) < 3


def test_dense_output_L_gradient_is_the_cross_entropy_gradient_to_fd_truncation():
    """logit = h L L^T Z^T: G_L = (G_T + G_T^T) L. A sign flip or a missing symmetrisation is O(|G|) off;
    every entry of L (the formula holds for a full L; the engine uses the lower triangle)."""
    Z, L, _, GL, loss = _dense_setup()
    assert _fd_error_in_truncation_units(lambda X: loss(Z, X), L, GL, 1e-3) < 3
    Z, L, _, GL, loss = _dense_setup(V=9, D=4, batch=6, seed=11, cond=20.0)
    assert _fd_error_in_truncation_units(lambda X: loss(Z, X), L, GL, 1e-3) < 3


def _sparse_setup(V=8, D=3, batch=5, seed=7, scale=1.0):
    Z, L = pit_pair(V, D, 4.0, seed=2)
    params = AdversaryParams(batch=batch, input_scale=scale)
    GZ, GL = GRADIENT_MODELS["sparse_input"](Z, L, np.random.default_rng(seed), params, None)
    rng = np.random.default_rng(seed)
    ids = _zipf(V, batch, params.zipf_exponent, rng)
    upstream = rng.standard_normal((batch, D)) / math.sqrt(D)

    def loss(Zp, Lp):
        # sum over the batch of <upstream_k, e_{ids_k}>, e_v = T^{-1} z_v
        T = Lp @ Lp.T
        return scale * float(np.sum(upstream * np.linalg.solve(T, Zp[ids].T).T))

    return Z, L, GZ, GL, loss, ids


def test_sparse_input_gradients_are_those_of_its_linear_loss_to_fd_truncation():
    Z, L, GZ, GL, loss, ids = _sparse_setup(scale=2.5)
    assert _fd_error_in_truncation_units(lambda X: loss(X, L), Z, GZ, 1e-3) < 3
    assert _fd_error_in_truncation_units(lambda X: loss(Z, X), L, GL, 1e-3) < 3
    untouched = np.setdiff1d(np.arange(Z.shape[0]), ids)
    assert not GZ[untouched].any()


def test_factor_gradient_symmetrises():
    GT = np.array([[0.0, 1.0], [0.0, 0.0]])
    L = np.array([[2.0, 0.0], [1.0, 3.0]])
    np.testing.assert_array_equal(G._factor_gradient(GT, L), np.array([[1.0, 3.0], [2.0, 0.0]]))


# ---- the synthetic models, draw by draw -------------------------------------------------------------
def test_gaussian_is_standard_normal_over_root_size():
    Z, L = pit_pair(6, 2, 2.0)
    gz, gl = GRADIENT_MODELS["gaussian"](Z, L, np.random.default_rng(4), PARAMS, None)
    rng = np.random.default_rng(4)
    np.testing.assert_array_equal(gz, rng.standard_normal((6, 2)) / math.sqrt(12))
    np.testing.assert_array_equal(gl, rng.standard_normal((2, 2)) / 2.0)


def test_normal_model_is_scale_times_Z_times_a_symmetric_matrix():
    Z, L = pit_pair(6, 2, 2.0)
    params = AdversaryParams(normal_scale=3.0)
    gz, gl = GRADIENT_MODELS["normal"](Z, L, np.random.default_rng(4), params, None)
    S = np.random.default_rng(4).standard_normal((2, 2)) / 2.0
    np.testing.assert_allclose(gz, 3.0 * Z @ (S + S.T), rtol=1e-15, atol=1e-16)
    assert not gl.any() and gl.shape == L.shape


@pytest.mark.parametrize("name,prob", [("spike", "spike_probability"), ("rank1", "burst_probability")])
def test_bursts_fire_below_their_probability(name, prob):
    Z, L = pit_pair(6, 2, 2.0)
    draw = np.random.default_rng(9).random()  # the first draw decides
    fires = AdversaryParams(**{prob: np.nextafter(draw, 1.0)})
    quiet = AdversaryParams(**{prob: draw})
    gz, gl = GRADIENT_MODELS[name](Z, L, np.random.default_rng(9), quiet, None)
    assert not gz.any() and not gl.any() and gz.shape == Z.shape and gl.shape == L.shape
    gz, gl = GRADIENT_MODELS[name](Z, L, np.random.default_rng(9), fires, None)
    assert gz.any()


def test_spike_is_scale_times_gaussian():
    Z, L = pit_pair(6, 2, 2.0)
    params = AdversaryParams(spike_probability=1.0, spike_scale=7.0)
    gz, gl = GRADIENT_MODELS["spike"](Z, L, np.random.default_rng(3), params, None)
    rng = np.random.default_rng(3)
    rng.random()
    np.testing.assert_array_equal(gz, 7.0 * (rng.standard_normal((6, 2)) / math.sqrt(12)))
    np.testing.assert_array_equal(gl, 7.0 * (rng.standard_normal((2, 2)) / 2.0))


def test_rank1_is_a_unit_outer_product_in_the_span_of_Z():
    Z, L = pit_pair(6, 2, 2.0)
    params = AdversaryParams(burst_probability=1.0, burst_scale=5.0)
    gz, gl = GRADIENT_MODELS["rank1"](Z, L, np.random.default_rng(3), params, None)
    rng = np.random.default_rng(3)
    rng.random()
    c, d = rng.standard_normal(2), rng.standard_normal(2)
    np.testing.assert_allclose(gz, 5.0 * np.outer(Z @ (c / np.linalg.norm(c)), d / np.linalg.norm(d)), rtol=1e-14)
    assert np.linalg.norm(gz) == pytest.approx(5.0, rel=1e-14) and not gl.any()


def test_heavy_tail_is_student_t_with_one_and_a_half_degrees_over_root_size():
    Z, L = pit_pair(6, 2, 2.0)
    gz, gl = GRADIENT_MODELS["heavy_tail"](Z, L, np.random.default_rng(3), PARAMS, None)
    rng = np.random.default_rng(3)
    np.testing.assert_array_equal(gz, rng.standard_t(1.5, (6, 2)) / math.sqrt(12))
    np.testing.assert_array_equal(gl, rng.standard_t(1.5, (2, 2)) / 2.0)


def test_conditioning_is_the_unit_lower_part_of_the_smallest_singular_pair():
    Z, L = pit_pair(6, 3, 50.0)
    params = AdversaryParams(attack_scale=2.0)
    gz, gl = GRADIENT_MODELS["conditioning"](Z, L, np.random.default_rng(0), params, None)
    U_, s, Vt = np.linalg.svd(L)
    want = np.tril(np.outer(U_[:, -1], Vt[-1]))
    np.testing.assert_allclose(gl, 2.0 * want / np.linalg.norm(want), rtol=1e-13)
    assert not gz.any()


def test_nonfinite_plants_one_bad_entry_at_its_probability():
    Z, L = pit_pair(6, 2, 2.0)
    params = AdversaryParams(nonfinite_probability=1.0)
    gz, gl = GRADIENT_MODELS["nonfinite"](Z, L, np.random.default_rng(3), params, None)
    rng = np.random.default_rng(3)
    want = rng.standard_normal((6, 2)) / math.sqrt(12)
    rng.standard_normal((2, 2))
    rng.random()
    bad = rng.choice([np.nan, np.inf, -np.inf])  # an assignment's value is evaluated before its target
    i, j = rng.integers(6), rng.integers(2)
    want[i, j] = bad
    np.testing.assert_array_equal(gz, want)
    assert np.isfinite(gl).all()
    never = GRADIENT_MODELS["nonfinite"](Z, L, np.random.default_rng(3), AdversaryParams(nonfinite_probability=0.0), None)
    assert np.isfinite(never[0]).all()


def test_zipf_ids_follow_the_power_law_weights():
    rng = np.random.default_rng(0)
    ids = G._zipf_ids(5, 4, 2.0, rng)
    np.testing.assert_array_equal(ids, _zipf(5, 4, 2.0, np.random.default_rng(0)))


def test_gradient_streams_are_seeded_by_seed_step_index_and_stream():
    Z, L = pit_pair(6, 2, 2.0)
    gz, gl = gradient("gaussian,heavy_tail", Z, L, 3, 4, PARAMS)
    a = GRADIENT_MODELS["gaussian"](Z, L, np.random.default_rng([3, 4, 0]), PARAMS, None)
    b = GRADIENT_MODELS["heavy_tail"](Z, L, np.random.default_rng([3, 4, 1]), PARAMS, None)
    np.testing.assert_array_equal(gz, a[0] + b[0])
    np.testing.assert_array_equal(gl, a[1] + b[1])
    s = gradient(["gaussian"], Z, L, 3, 4, PARAMS, stream=2)
    np.testing.assert_array_equal(s[0], GRADIENT_MODELS["gaussian"](Z, L, np.random.default_rng([3, 4, 0, 2]),
                                                                     PARAMS, None)[0])
    s0 = gradient(["gaussian"], Z, L, 3, 4, PARAMS, stream=0)
    np.testing.assert_array_equal(s0[0], a[0])
    # the inputs are not written into
    assert gz is not Z and np.array_equal(Z, pit_pair(6, 2, 2.0)[0])


def test_adaptive_picks_the_first_of_equal_candidates_and_mirrors_their_streams():
    Z, L = pit_pair(8, 2, 3.0)
    # a probe that cannot tell them apart: the first candidate (gaussian) is kept
    got = GRADIENT_MODELS["adaptive"](Z, L, np.random.default_rng(6), PARAMS, lambda gz, gl: 1.0)
    first = GRADIENT_MODELS["gaussian"](Z, L, np.random.default_rng(np.random.default_rng(6).integers(2**63)),
                                        PARAMS, None)
    np.testing.assert_array_equal(got[0], first[0])
    np.testing.assert_array_equal(got[1], first[1])


def test_adaptive_without_a_probe_judges_the_drift_bound_at_Z_plus_G():
    Z, L = pit_pair(8, 2, 3.0)
    L = 4 * L  # the conditioning candidate's unit step keeps L's diagonal positive
    params = AdversaryParams(burst_probability=1.0)
    got = GRADIENT_MODELS["adaptive"](Z, L, np.random.default_rng(6), params, None)
    rng = np.random.default_rng(6)
    best, best_err = None, -np.inf
    for name in G.ADAPTIVE_CANDIDATES:
        g = GRADIENT_MODELS[name](Z, L, np.random.default_rng(rng.integers(2**63)), params, None)
        err = drift_bound(Z - g[0], L - np.tril(g[1]), 2.0**-53)
        if err > best_err:
            best, best_err = g, err
    np.testing.assert_array_equal(got[0], best[0])
    assert G.ADAPTIVE_CANDIDATES == ("gaussian", "dense_output", "rank1", "normal", "conditioning")
    assert G.FP64_U == 2.0**-53


# ---- parameters ----------------------------------------------------------------------------------------
def test_default_adversary_params():
    assert AdversaryParams() == AdversaryParams(32, 1.1, 1.0, 0.01, 100.0, 0.1, 10.0, 100.0, 1.0, 0.05)
    check_adversary_params(AdversaryParams())
    check_adversary_params(AdversaryParams(batch=1, spike_probability=1.0, burst_probability=0.0,
                                           nonfinite_probability=1, input_scale=0))
    check_adversary_params(AdversaryParams(batch=np.int64(3), zipf_exponent=np.float32(2.0), spike_scale=5))


@pytest.mark.parametrize("kw,word", [
    (dict(batch=0), "positive integer"), (dict(batch=2.0), "positive integer"), (dict(batch=True), "positive integer"),
    (dict(input_scale=-1.0), "--input-scale"), (dict(input_scale=float("nan")), "--input-scale"),
    (dict(spike_scale=float("inf")), "spike_scale"), (dict(zipf_exponent="1"), "zipf_exponent"),
    (dict(burst_scale=True), "burst_scale"),
    (dict(spike_probability=1.5), "probability"), (dict(burst_probability=1.0 + 1e-12), "probability"),
    (dict(nonfinite_probability=2), "probability"),
])
def test_bad_adversary_params_are_one_line_errors(kw, word):
    with pytest.raises(PitcheckError, match=word):
        check_adversary_params(AdversaryParams(**kw))


def test_a_scale_above_one_is_no_probability_error():
    check_adversary_params(AdversaryParams(spike_scale=1.5, attack_scale=2.0, normal_scale=1e6))


def test_parse_adversary_strips_and_keeps_order():
    assert G.parse_adversary(" dense_output , spike,") == ["dense_output", "spike"]
    with pytest.raises(PitcheckError, match="empty"):
        G.parse_adversary("")
    with pytest.raises(PitcheckError, match="'nope'"):
        G.parse_adversary("nope")


def test_adaptive_without_a_probe_takes_a_step_to_a_singular_T_as_the_worst():
    Z, L = pit_pair(8, 2, 3.0)  # L's diagonal below 1: the unit-norm conditioning step crosses zero
    gz, gl = GRADIENT_MODELS["adaptive"](Z, L, np.random.default_rng(6), PARAMS, None)
    assert gl.shape == L.shape


def test_dense_output_is_stable_at_large_logits():
    """Logits in the thousands: the softmax must subtract the row maximum (exp would overflow)."""
    from scipy.special import softmax

    Z, L = pit_pair(7, 3, 3.0, seed=1)
    L = 40.0 * L
    params = AdversaryParams(batch=4)
    GZ, GL = GRADIENT_MODELS["dense_output"](Z, L, np.random.default_rng(5), params, None)
    rng = np.random.default_rng(5)
    h = rng.standard_normal((4, 3))
    targets = _zipf(7, 4, params.zipf_exponent, rng)
    hT = h @ L @ L.T
    assert np.abs(hT @ Z.T).max() > 800
    p = softmax(hT @ Z.T, axis=1)
    p[np.arange(4), targets] -= 1
    np.testing.assert_allclose(GZ, (p / 4).T @ hT, rtol=1e-9, atol=1e-12)
    assert np.isfinite(GL).all()


def test_nonfinite_fires_below_its_probability_only():
    Z, L = pit_pair(6, 2, 2.0)
    rng = np.random.default_rng(3)
    rng.standard_normal((6, 2))
    rng.standard_normal((2, 2))
    draw = rng.random()
    at = GRADIENT_MODELS["nonfinite"](Z, L, np.random.default_rng(3), AdversaryParams(nonfinite_probability=draw), None)
    assert np.isfinite(at[0]).all()
    above = AdversaryParams(nonfinite_probability=np.nextafter(draw, 1.0))
    assert not np.isfinite(GRADIENT_MODELS["nonfinite"](Z, L, np.random.default_rng(3), above, None)[0]).all()


def test_adaptive_without_a_probe_asks_the_drift_bound_at_the_trial_point(monkeypatch):
    Z, L = pit_pair(8, 2, 3.0)
    L = 4 * L
    seen = []

    def bound(Zt, Lt, u):
        seen.append((Zt, Lt, u))
        return float(len(seen) == 2)  # the second candidate (dense_output) is the worst

    monkeypatch.setattr(G, "drift_bound", bound)
    got = GRADIENT_MODELS["adaptive"](Z, L, np.random.default_rng(6), PARAMS, None)
    rng = np.random.default_rng(6)
    cands = [GRADIENT_MODELS[n](Z, L, np.random.default_rng(rng.integers(2**63)), PARAMS, None)
             for n in G.ADAPTIVE_CANDIDATES]
    assert len(seen) == 5
    for (Zt, Lt, u), g in zip(seen, cands):
        np.testing.assert_array_equal(Zt, Z - g[0])
        np.testing.assert_array_equal(Lt, L - np.tril(g[1]))
        assert u == 2.0**-53
    np.testing.assert_array_equal(got[0], cands[1][0])


def test_adaptive_keeps_a_candidate_whatever_the_probes_values():
    """The running best starts at -inf: a probe that scores every candidate 0 (or below) still picks one."""
    Z, L = pit_pair(8, 2, 3.0)
    for score in (0.0, -5.0):
        got = GRADIENT_MODELS["adaptive"](Z, L, np.random.default_rng(6), PARAMS, lambda gz, gl, s=score: s)
        assert got is not None and got[0].shape == Z.shape


def test_nonfinite_plants_nan_inf_and_minus_inf():
    Z, L = pit_pair(6, 2, 2.0)
    params = AdversaryParams(nonfinite_probability=1.0)
    kinds = set()
    for seed in range(40):
        gz = GRADIENT_MODELS["nonfinite"](Z, L, np.random.default_rng(seed), params, None)[0]
        bad = gz[~np.isfinite(gz)]
        assert bad.size == 1
        kinds.add("nan" if np.isnan(bad[0]) else ("+inf" if bad[0] > 0 else "-inf"))
    assert kinds == {"nan", "+inf", "-inf"}


def test_adversary_params_are_frozen():
    import dataclasses

    with pytest.raises(dataclasses.FrozenInstanceError):
        AdversaryParams().batch = 3


# ---- the parameters each model reads, from the registry ------------------------------------------------
@pytest.mark.parametrize("name,params", [
    ("gaussian", {}), ("heavy_tail", {}), ("lm", {}),
    ("dense_output", {"batch": 32, "zipf_exponent": 1.1}),
    ("sparse_input", {"batch": 32, "zipf_exponent": 1.1, "input_scale": 1.0}),
    ("normal", {"normal_scale": 100.0}),
    ("spike", {"spike_probability": 0.01, "spike_scale": 100.0}),
    ("rank1", {"burst_probability": 0.1, "burst_scale": 10.0}),
    ("conditioning", {"attack_scale": 1.0}),
    ("nonfinite", {"nonfinite_probability": 0.05}),
    ("adaptive", {"batch": 32, "zipf_exponent": 1.1, "burst_probability": 0.1, "burst_scale": 10.0,
                  "normal_scale": 100.0, "attack_scale": 1.0}),
])
def test_each_models_default_parameters(name, params):
    assert default_params(name) == params
    assert list(default_params(name)) == list(params)  # in the order the model declares them


class _Only:
    """AdversaryParams that let a model read only the fields it declares."""

    def __init__(self, allowed):
        self.allowed, self.defaults = allowed, AdversaryParams()

    def __getattr__(self, name):
        assert name in self.allowed, f"reads {name}, which it does not declare"
        return getattr(self.defaults, name)


@pytest.mark.parametrize("name", [n for n in GRADIENT_MODELS if n != "lm"])
def test_a_model_reads_only_the_parameters_it_declares(name):
    Z, L = pit_pair(30, 3, 2.0)
    for seed in range(40):  # the bursts and the planted entries fire in some of them
        GRADIENT_MODELS[name](Z, L, np.random.default_rng(seed), _Only(MODEL_PARAMETERS[name]), None)


def test_every_parameter_is_read_by_some_model():
    read = {f for params in MODEL_PARAMETERS.values() for f in params}
    assert read == {f.name for f in dataclasses.fields(AdversaryParams)}


def test_registering_a_parameter_that_does_not_exist_is_refused():
    with pytest.raises(PitcheckError, match="reads no such parameter: spike_rate"):
        register("bogus", ("spike_scale", "spike_rate"))
    assert "bogus" not in GRADIENT_MODELS
    with pytest.raises(PitcheckError, match="unknown gradient model 'bogus'"):
        default_params("bogus")


def test_zipf_ids_from_cached_probabilities_are_the_uncached_draws():
    """The cached p (V powers a call were a third of a small step's id draw) draws the ids the
    formula recomputed each call draws, from the same generator state; and nobody can write into it."""
    from pitcheck.model.gradients import _zipf_ids, _zipf_probabilities

    for V, s in ((7, 1.0), (2048, 1.1), (50000, 1.3)):
        w = 1.0 / np.arange(1, V + 1) ** s
        want = np.random.default_rng(3).choice(V, size=257, p=w / w.sum())
        rng = np.random.default_rng(3)
        assert np.array_equal(_zipf_ids(V, 257, s, rng), want)
        assert np.array_equal(_zipf_ids(V, 257, s, np.random.default_rng(3)), want)  # the cached call
        with pytest.raises(ValueError):
            _zipf_probabilities(V, s)[0] = 1.0


def test_an_overflowed_state_gives_nonfinite_gradients_without_numpy_warnings():
    # a run records them as an event (a skipped step); numpy's warnings would be noise on its progress bar
    import warnings

    from pitcheck.model.gradients import AdversaryParams, gradient
    from pitcheck.numerics.reference import random_memory

    Z = random_memory(32, 4, np.random.default_rng(0))
    L = 1e200 * np.eye(4)  # T = L L^T overflows: the logits are inf - inf
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        GZ, GL = gradient(["dense_output", "sparse_input"], Z, L, 0, 0, AdversaryParams())
    assert not (np.isfinite(GZ).all() and np.isfinite(GL).all())
