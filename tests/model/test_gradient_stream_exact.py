"""The gradient stream is the same bits after its throughput work: every committed result
depends on it. The pre-change code of the touched models is kept here, written plainly (rng.choice with p,
scipy.linalg.cho_solve, np.sqrt(np.prod(shape)), a zeros-started sum), and pitcheck.model.gradients must match it
bit for bit (signed zeros included: the bytes are compared) over thousands of (seed, step) pairs, at several
shapes, a non-identity factor and non-default parameters, and must leave each component's rng where the old
code left it (the draws after it do not shift). Non-finite input must still raise where it raised."""
import numpy as np
import pytest
import scipy.linalg

import pitcheck.sources.lm  # noqa: F401  (registers "lm", which the all-models check leaves out)
from pitcheck.model import gradients as G
from pitcheck.model.gradients import GRADIENT_MODELS, AdversaryParams, gradient


# ---- the reference: the pre-change code ----------------------------------------------------------------

def ref_gaussian_entries(shape, rng):
    return rng.standard_normal(shape) / np.sqrt(np.prod(shape))


def ref_zipf_ids(vocab, count, exponent, rng):
    weights = 1.0 / np.arange(1, vocab + 1) ** exponent
    return rng.choice(vocab, size=count, p=weights / weights.sum())


def ref_factor_gradient(GT, L):
    return (GT + GT.T) @ L


def ref_gaussian(Z, L, rng, params, probe):
    return ref_gaussian_entries(Z.shape, rng), ref_gaussian_entries(L.shape, rng)


def ref_dense_output(Z, L, rng, params, probe):
    V, D = Z.shape
    h = rng.standard_normal((params.batch, D))
    hT = (h @ L) @ L.T
    logit = hT @ Z.T
    logit -= logit.max(axis=1, keepdims=True)
    prob = np.exp(logit)
    prob /= prob.sum(axis=1, keepdims=True)
    targets = ref_zipf_ids(V, params.batch, params.zipf_exponent, rng)
    prob[np.arange(params.batch), targets] -= 1.0
    dlogit = prob / params.batch
    GZ = dlogit.T @ hT
    GT = h.T @ (dlogit @ Z)
    return GZ, ref_factor_gradient(GT, L)


def ref_sparse_input(Z, L, rng, params, probe):
    V, D = Z.shape
    ids = ref_zipf_ids(V, params.batch, params.zipf_exponent, rng)
    upstream = rng.standard_normal((params.batch, D)) / np.sqrt(D)
    Tinv_g = scipy.linalg.cho_solve((L, True), upstream.T).T
    e = scipy.linalg.cho_solve((L, True), Z[ids].T).T
    GZ = np.zeros_like(Z)
    np.add.at(GZ, ids, Tinv_g)
    GT = -Tinv_g.T @ e
    return params.input_scale * GZ, params.input_scale * ref_factor_gradient(0.5 * (GT + GT.T), L)


REFERENCE_MODELS = {"gaussian": ref_gaussian, "dense_output": ref_dense_output, "sparse_input": ref_sparse_input}


def ref_gradient(names, Z, L, seed, step, params, stream=0):
    GZ = np.zeros_like(Z)
    GL = np.zeros_like(L)
    for index, name in enumerate(names):
        rng = np.random.default_rng([seed, step, index] + ([stream] if stream else []))
        gz, gl = REFERENCE_MODELS[name](Z, L, rng, params, None)
        GZ += gz
        GL += gl
    return GZ, GL


# ---- the checks ----------------------------------------------------------------------------------------

def assert_same_bits(new, old):
    assert new.dtype == old.dtype and new.shape == old.shape
    assert np.array_equal(new, old, equal_nan=True)
    assert new.tobytes() == old.tobytes()  # signed zeros and NaN payloads too


def model_pair(V, D, seed):
    """A table and a non-identity Cholesky factor (lower triangular, positive diagonal) of size D."""
    r = np.random.default_rng([9_001, V, D, seed])
    Z = r.standard_normal((V, D)) / np.sqrt(V)
    L = np.tril(r.standard_normal((D, D))) * 0.3
    L[np.diag_indices(D)] = np.exp(r.uniform(-1.0, 1.0, D))
    return Z, L


SPECS = [["gaussian"], ["dense_output"], ["sparse_input"], ["dense_output", "sparse_input"]]
PARAMS = [AdversaryParams(), AdversaryParams(batch=7, zipf_exponent=0.6, input_scale=0.37),
          AdversaryParams(batch=64, zipf_exponent=2.5, input_scale=3.0)]
# (V, D, how many (seed, step) pairs): the default compare grid's shape gets the most
SHAPES = [(128, 8, 2000), (32, 4, 2000), (2048, 32, 200), (1, 4, 500), (16, 1, 500)]


@pytest.mark.parametrize("V,D,pairs", SHAPES, ids=[f"{v}x{d}" for v, d, _ in SHAPES])
def test_gradient_is_bit_identical_to_the_pre_change_stream(V, D, pairs):
    Z, L = model_pair(V, D, 0)
    pick = np.random.default_rng([V, D])
    for k in range(pairs):
        seed, step = int(pick.integers(2**31)), int(pick.integers(10**7))
        names = SPECS[k % len(SPECS)]
        params = PARAMS[(k // len(SPECS)) % len(PARAMS)]
        stream = 1 if k % 7 == 3 else 0
        new = gradient(names, Z, L, seed, step, params, stream=stream)
        old = ref_gradient(names, Z, L, seed, step, params, stream=stream)
        for a, b in zip(new, old):
            assert_same_bits(a, b)


@pytest.mark.parametrize("name", list(REFERENCE_MODELS))
@pytest.mark.parametrize("V,D", [(128, 8), (32, 4), (1, 4), (16, 1)])
def test_each_model_leaves_its_rng_where_the_old_code_left_it(name, V, D):
    Z, L = model_pair(V, D, 1)
    for k in range(200):
        params = PARAMS[k % len(PARAMS)]
        rng_new, rng_old = np.random.default_rng([5, k]), np.random.default_rng([5, k])
        new = GRADIENT_MODELS[name](Z, L, rng_new, params, None)
        old = REFERENCE_MODELS[name](Z, L, rng_old, params, None)
        for a, b in zip(new, old):
            assert_same_bits(a, b)
        assert rng_new.bit_generator.state == rng_old.bit_generator.state
        assert rng_new.random() == rng_old.random()


@pytest.mark.parametrize("exponent", [0.0, 0.6, 1.1, 2.5, 40.0])
@pytest.mark.parametrize("vocab", [1, 2, 7, 128, 50_000])
def test_zipf_ids_are_choices_draws_and_consume_the_same_uniforms(vocab, exponent):
    for k in range(50):
        count = 1 + k % 40
        rng_new, rng_old = np.random.default_rng([7, vocab, k]), np.random.default_rng([7, vocab, k])
        new = G._zipf_ids(vocab, count, exponent, rng_new)
        old = ref_zipf_ids(vocab, count, exponent, rng_old)
        assert_same_bits(new, old)
        assert rng_new.random() == rng_old.random()


# PCG64 (numpy's default bit generator): state <- state * MULTIPLIER + inc, then the 64-bit output is the
# state's two halves xor-ed and rotated right by its top 6 bits; random() is the output's top 53 bits / 2^53
PCG64_MULTIPLIER = 0x2360ED051FC65DA44385DF649FCCF645


def rng_whose_next_random_is(u):
    """A Generator whose next random() is exactly u (a multiple of 2^-53 in [0, 1)): the state one step
    before a state whose output is u's bits, found by running the step and the output backwards."""
    mask64, mask128 = (1 << 64) - 1, (1 << 128) - 1
    output = int(u * 2**53) << 11
    rng = np.random.default_rng(0)
    state = rng.bit_generator.state
    high = 0x0123456789ABCDEF
    rotation = high >> 58
    low = high ^ (((output << rotation) | (output >> (64 - rotation))) & mask64 if rotation else output)
    target = (high << 64) | low
    state["state"]["state"] = ((target - state["state"]["inc"]) * pow(PCG64_MULTIPLIER, -1, 1 << 128)) & mask128
    rng.bit_generator.state = state
    assert rng.bit_generator.random_raw() == output  # the construction is right ...
    rng.bit_generator.state = state
    return rng


# (7, 0.0), (128, 1.1), (1000, 0.6) and (2048, 2.5) have p.cumsum()[-1] != 1, so choice's renormalisation
# moves CDF entries there
@pytest.mark.parametrize("vocab,exponent", [(2, 0.0), (8, 0.0), (7, 0.0), (128, 1.1), (1000, 0.6), (2048, 2.5)])
def test_zipf_ids_agree_with_choice_on_every_uniform_next_to_a_cdf_entry(vocab, exponent):
    """Where the search's side and the CDF's last bits matter: a uniform on or beside a CDF entry (a 2^-53
    event per draw, so random streams never show it). The rng is put on each drawable uniform (a multiple
    of 2^-53) within two steps of each entry of the CDF choice builds."""
    weights = 1.0 / np.arange(1, vocab + 1) ** exponent
    cdf = (weights / weights.sum()).cumsum()
    cdf /= cdf[-1]
    grid = sorted({k for c in cdf for k in range(int(c * 2**53) - 2, int(c * 2**53) + 3) if 0 <= k < 2**53})
    for k in grid:
        u = k * 2.0**-53
        rng_new, rng_old = rng_whose_next_random_is(u), rng_whose_next_random_is(u)
        assert rng_whose_next_random_is(u).random() == u  # ... and so is the rng it built
        assert_same_bits(G._zipf_ids(vocab, 1, exponent, rng_new), ref_zipf_ids(vocab, 1, exponent, rng_old))
        assert rng_new.random() == rng_old.random()


def test_every_stateless_model_is_unchanged_with_the_old_helpers_patched_back(monkeypatch):
    """The models this change did not touch call _gaussian (normal, spike, nonfinite, adaptive's candidates):
    with the pre-change helpers put back, no registered model's output moves."""
    Z, L = model_pair(64, 6, 2)
    params = AdversaryParams(spike_probability=0.5, burst_probability=0.5, nonfinite_probability=0.5)
    names = [n for n in GRADIENT_MODELS if n != "lm"]
    new = {(n, s): gradient([n], Z, L, 11, s, params) for n in names for s in range(40)}
    monkeypatch.setattr(G, "_gaussian", ref_gaussian_entries)
    monkeypatch.setattr(G, "_zipf_ids", ref_zipf_ids)
    monkeypatch.setattr(G, "_cho_solve_lower", lambda L, B: scipy.linalg.cho_solve((L, True), B))
    for (n, s), got in new.items():
        for a, b in zip(got, gradient([n], Z, L, 11, s, params)):
            assert_same_bits(a, b)


@pytest.mark.parametrize("where", ["Z", "L_lower", "L_upper"])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_input_to_the_input_gradient_raises_as_before(where, bad):
    """cho_solve checked its inputs (all of L, the upper triangle too); the direct potrs call hands any
    non-finite input back to it, so the same ValueError comes out."""
    Z, L = model_pair(32, 4, 3)
    if where == "Z":
        Z[:] = bad
    elif where == "L_lower":
        L[2, 1] = bad
    else:
        L[0, 3] = bad
    for model in (G.sparse_input, ref_sparse_input):
        with pytest.raises(ValueError, match="infs or NaNs"):
            model(Z, L, np.random.default_rng(0), AdversaryParams(), None)


def test_the_direct_solve_is_cho_solve_on_other_dtypes_layouts_and_empty_input():
    """Inputs beside sparse_input's own (float32 or mixed, non-contiguous, empty) give cho_solve's own bits."""
    Z, L = model_pair(32, 5, 4)
    B = np.random.default_rng(0).standard_normal((5, 9))
    for LL, BB in [(L, B), (np.asfortranarray(L), B), (L, np.asfortranarray(B)), (L, B[:, ::2]),
                   (L.astype(np.float32), B.astype(np.float32)), (L, B.astype(np.float32)),
                   (np.zeros((0, 0)), np.zeros((0, 3)))]:
        before = BB.copy()
        assert_same_bits(G._cho_solve_lower(LL, BB), scipy.linalg.cho_solve((LL, True), BB))
        assert_same_bits(BB, before)  # the right-hand side is the caller's: never solved in place


def test_a_factor_that_does_not_fit_raises_cho_solves_error():
    B = np.ones((4, 2))
    for L in (np.ones((3, 4)), np.ones((4, 3)), np.eye(5), np.ones(4), np.ones((4, 4, 1))):
        with pytest.raises(ValueError) as new:
            G._cho_solve_lower(L, B)
        with pytest.raises(ValueError) as old:
            scipy.linalg.cho_solve((L, True), B)
        assert str(new.value) == str(old.value)


def test_the_stream_takes_the_direct_solve_and_the_cached_cdf(monkeypatch):
    """The speed-up is kept: at a run's inputs neither cho_solve nor choice is called."""
    slow = []

    def refuse(*args, **kwargs):
        slow.append(args)
        raise AssertionError("the slow path was taken")

    class NoChoice:  # a Generator whose choice refuses
        def __init__(self, rng):
            self.rng = rng

        def __getattr__(self, name):
            return refuse if name == "choice" else getattr(self.rng, name)

    Z, L = model_pair(128, 8, 5)
    monkeypatch.setattr(scipy.linalg, "cho_solve", refuse)
    for model in (G.dense_output, G.sparse_input):
        GZ, GL = model(Z, L, NoChoice(np.random.default_rng(0)), AdversaryParams(), None)
        assert GZ.shape == Z.shape and GL.shape == L.shape and np.isfinite(GZ).all() and np.isfinite(GL).all()
    assert slow == []


def test_the_zipf_cdf_is_built_once_and_nobody_can_write_into_it():
    cdf = G._zipf_cdf(128, 1.1)
    assert G._zipf_cdf(128, 1.1) is cdf
    with pytest.raises(ValueError):
        cdf[0] = 0.0


def test_an_empty_vocabulary_raises_as_choice_did():
    for draw in (G._zipf_ids, ref_zipf_ids):
        with pytest.raises(ValueError, match="a must be a positive integer"):
            draw(0, 5, 1.1, np.random.default_rng(0))
