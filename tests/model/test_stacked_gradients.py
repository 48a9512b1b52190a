"""A batch's gradients computed as one stack (pitcheck.model.stacked_gradients) are the bytes of gradient() run
cell by cell and stacked (signed zeros and NaN payloads too), over many (seed, step) pairs, stack sizes,
shapes, per-cell parameters, mixed adversaries (one a model without a stacked form), non-finite cells;
and seed_streams builds default_rng's own streams."""
import warnings

import numpy as np
import pytest

from pitcheck.model.gradients import AdversaryParams, gradient
from pitcheck.model.seed_streams import generators
from pitcheck.model.stacked_gradients import stacked_gradients
from tests.model.test_gradient_stream_exact import assert_same_bits, model_pair

ADVERSARIES = [["gaussian"], ["dense_output", "sparse_input"]]  # the default compare grid's
MIXED = ADVERSARIES + [["dense_output"], ["sparse_input"], ["sparse_input", "gaussian"], ["gaussian", "spike"],
                       ["rank1"]]
# batch sizes shared by cells of other exponents and scales; input_scale 0 makes sparse_input's -0.0s, which
# gradient()'s zeros-started sum turns into +0.0
PARAMS = [AdversaryParams(), AdversaryParams(batch=7, zipf_exponent=0.6, input_scale=0.37),
          AdversaryParams(batch=1, zipf_exponent=2.5, input_scale=3.0),
          AdversaryParams(spike_probability=0.5, burst_probability=0.5, input_scale=0.5, zipf_exponent=1.6),
          AdversaryParams(batch=7, input_scale=0.0)]
SHAPES = [(128, 8), (32, 4), (17, 3), (256, 16)]


def stack(V, D, K, seed):
    pairs = [model_pair(V, D, seed * 100 + k) for k in range(K)]
    return np.stack([Z for Z, _ in pairs]), np.stack([L for _, L in pairs])


def per_cell(cells, Z, L, step):
    grads = [gradient(names, Z[k], L[k], seed, step, params) for k, (names, seed, params) in enumerate(cells)]
    return np.stack([g for g, _ in grads]), np.stack([g for _, g in grads])


def assert_stack_is_per_cell(cells, Z, L, step):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # gradient() runs quietly on an overflowed state: so must the stack
        got = stacked_gradients(cells, Z, L, step)
    for a, b in zip(got, per_cell(cells, Z, L, step)):
        assert_same_bits(a, b)


@pytest.mark.parametrize("K", [1, 2, 8])
@pytest.mark.parametrize("V,D", SHAPES, ids=[f"{v}x{d}" for v, d in SHAPES])
def test_one_adversary_stacked_is_per_cell(V, D, K):
    Z, L = stack(V, D, K, 0)
    pick = np.random.default_rng([V, D, K])
    for n in range(60):
        names = ADVERSARIES[n % 2]
        cells = [(names, int(pick.integers(2**31)), PARAMS[0]) for _ in range(K)]
        assert_stack_is_per_cell(cells, Z, L, int(pick.integers(10**7)))


@pytest.mark.parametrize("K", [1, 2, 8])
@pytest.mark.parametrize("V,D", SHAPES, ids=[f"{v}x{d}" for v, d in SHAPES])
def test_mixed_adversaries_and_parameters_stacked_are_per_cell(V, D, K):
    """Cells of one stack differ in adversary (a model without a stacked form among them), batch, Zipf
    exponent and input scale."""
    Z, L = stack(V, D, K, 1)
    pick = np.random.default_rng([V, D, K, 1])
    for n in range(60):
        cells = [(MIXED[int(pick.integers(len(MIXED)))], int(pick.integers(2**31)),
                  PARAMS[int(pick.integers(len(PARAMS)))]) for _ in range(K)]
        assert_stack_is_per_cell(cells, Z, L, int(pick.integers(10**7)))


def test_each_cell_keeps_its_own_params_and_stream():
    """Cells alike but for one parameter or their seed get different gradients (the stack takes neither
    from its first cell)."""
    Z, L = stack(32, 4, 4, 2)
    base = AdversaryParams()
    names = ["dense_output", "sparse_input"]
    cells = [(names, 5, base), (names, 5, AdversaryParams(input_scale=2.0)),
             (names, 5, AdversaryParams(zipf_exponent=0.3)), (names, 6, base)]
    Z[:] = Z[0]
    L[:] = L[0]
    GZ, GL = stacked_gradients(cells, Z, L, 3)
    for k in range(1, 4):
        assert not np.array_equal(GZ[0], GZ[k])
    assert_stack_is_per_cell(cells, Z, L, 3)


def test_default_grid_seeds_and_steps():
    """The compare grid's own kind of stack: 8 cells at 128 x 8, seeds 0..7, many steps from 0."""
    Z, L = stack(128, 8, 8, 3)
    for names in ADVERSARIES:
        cells = [(names, seed, AdversaryParams()) for seed in range(8)]
        for step in list(range(150)) + [10**4 - 1, 2**31, 2**32 - 1, 2**32, 2**40]:
            assert_stack_is_per_cell(cells, Z, L, step)


def test_seeds_beyond_one_word_and_odd_seeds_fall_back_alike():
    Z, L = stack(17, 3, 4, 4)
    for seeds in ([2**32, 2**40 + 3, 0, 2**32 - 1], [np.int64(5), 1, 2, 3]):
        cells = [(ADVERSARIES[k % 2], s, AdversaryParams()) for k, s in enumerate(seeds)]
        assert_stack_is_per_cell(cells, Z, L, 11)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("where", ["Z_row", "Z_all", "L_lower", "L_upper"])
def test_an_overflowed_cell_gives_the_same_bits_or_the_same_error(where, bad):
    """A non-finite cell: the dense and gaussian models give the per-cell NaN/inf pattern; sparse_input
    raises cho_solve's ValueError as gradient() does, unless its draws miss the bad row."""
    V, D, K = 32, 4, 4
    for step in range(30):
        Z, L = stack(V, D, K, 5)
        k = step % K
        if where == "Z_row":
            Z[k, step % V] = bad
        elif where == "Z_all":
            Z[k] = bad
        elif where == "L_lower":
            L[k, 2, 1] = bad
        else:
            L[k, 0, 3] = bad
        for names in (["gaussian"], ["dense_output"], ["dense_output", "sparse_input"]):
            cells = [(names, 40 + j, PARAMS[1]) for j in range(K)]
            try:
                expected = per_cell(cells, Z, L, step)
            except ValueError as exc:
                with pytest.raises(ValueError, match="infs or NaNs") as got:
                    with warnings.catch_warnings():
                        warnings.simplefilter("error")
                        stacked_gradients(cells, Z, L, step)
                assert str(got.value) == str(exc)
                continue
            assert_stack_is_per_cell(cells, Z, L, step)
            if names != ["gaussian"]:
                assert not np.isfinite(expected[0][k]).all() or not np.isfinite(expected[1][k]).all()


def test_a_missed_bad_row_is_solved_in_the_stack():
    """A NaN row that sparse_input's ids miss does not stop the solve (cho_solve sees only drawn rows)."""
    Z, L = stack(256, 4, 2, 6)
    Z[1, -1] = np.nan  # Zipf ids at exponent 2.5 almost never reach the last of 256 rows
    cells = [(["sparse_input"], s, PARAMS[2]) for s in (1, 2)]
    GZ, _ = stacked_gradients(cells, Z, L, 0)
    assert np.isfinite(GZ).all()
    assert_stack_is_per_cell(cells, Z, L, 0)


def test_non_contiguous_or_float32_input_goes_cell_by_cell():
    Z, L = stack(32, 4, 3, 7)
    cells = [(ADVERSARIES[k % 2], k, AdversaryParams()) for k in range(3)]
    assert_stack_is_per_cell(cells, np.asfortranarray(Z), L, 1)
    assert_stack_is_per_cell(cells, Z[::-1], L[::-1], 1)
    assert_stack_is_per_cell(cells, Z.astype(np.float32), L.astype(np.float32), 1)


def test_seed_streams_are_default_rngs_streams():
    entropies = [(s, t, i) for s in (0, 1, 7, 2**31, 2**32 - 1, 2**32, 2**40)
                 for t in (0, 1, 3, 10**7, 2**32 - 1, 2**32) for i in (0, 1, 2)]
    entropies += [tuple(int(x) for x in e) for e in np.random.default_rng(0).integers(0, 2**32, (300, 3))]
    entropies += [(np.int64(3), 1, 0), (True, 1, 0)]
    for entropy, rng in zip(entropies, generators(entropies)):
        ref = np.random.default_rng(list(entropy))
        assert rng.bit_generator.state == ref.bit_generator.state
        assert rng.standard_normal(7).tobytes() == ref.standard_normal(7).tobytes()
        assert rng.random(3).tobytes() == ref.random(3).tobytes()


def test_seed_streams_refuse_what_default_rng_refuses():
    with pytest.raises(ValueError):
        generators([(1, 2, 0), (-1, 2, 0)])
