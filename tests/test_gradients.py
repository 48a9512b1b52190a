"""Gradient models: seeded, shaped, and each doing what its name says (with a case it must not do)."""
import numpy as np
import pytest

from tests.helpers import pit_pair
from pitcheck import PitcheckError
from pitcheck.gradients import GRADIENT_MODELS, AdversaryParams, gradient, parse_adversary
from pitcheck.retractions import tangent_projection

PARAMS = AdversaryParams()


import pitcheck.lm  # noqa: E402,F401  (registers "lm" whatever the collection order)

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
