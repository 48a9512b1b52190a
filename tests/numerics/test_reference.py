"""The float64 reference: certified against the 50-digit mpmath oracle (tests/oracle.py) in units of u,
and its closed-form values and refusals as tables."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pitcheck import PitcheckError
from pitcheck.numerics import metrics, reference
from tests import oracle
from tests.helpers import pit_pair

U = 2.0**-53


# ---- closed forms and refusals --------------------------------------------------------------------
L2 = np.array([[2.0, 0.0], [1.0, 1.0]])  # T = [[4, 2], [2, 2]], T^{-1} = [[1/2, -1/2], [-1/2, 1]]


def test_softplus_inverse_sign_and_closed_form():
    """softplus(r) = log(1 + e^r): softplus_inverse(log 2) = 0, (log(1 + e)) = 1, (log(1 + e^-3)) = -3."""
    got = reference.softplus_inverse(np.array([math.log(2.0), math.log1p(math.e), math.log1p(math.exp(-3.0))]))
    np.testing.assert_allclose(got, [0.0, 1.0, -3.0], rtol=1e-13, atol=1e-15)
    y = np.geomspace(1e-6, 30, 50)
    np.testing.assert_allclose(np.logaddexp(0.0, reference.softplus_inverse(y)), y, rtol=1e-12)
    # for large y the inverse approaches y from below; for small y it is log(y)
    assert 20.0 - 1e-8 < reference.softplus_inverse(np.array([20.0]))[0] < 20.0
    assert reference.softplus_inverse(np.array([1e-10]))[0] == pytest.approx(math.log(1e-10), rel=1e-9)


@pytest.mark.parametrize("bad", [[0.0], [1.0, -1.0]])
def test_softplus_inverse_refuses_a_non_positive_diagonal(bad):
    with pytest.raises(PitcheckError):
        reference.softplus_inverse(np.array(bad))


def test_embed_is_two_triangular_solves_with_L_then_L_transpose():
    Z = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    np.testing.assert_array_equal(reference.embed(Z, L2, [0, 1, 2]), [[0.5, -0.5], [-0.5, 1.0], [0.0, 0.5]])
    np.testing.assert_array_equal(reference.embed(Z, L2, [2, 0]), [[0.0, 0.5], [0.5, -0.5]])
    np.testing.assert_array_equal(reference.embedding_matrix(Z, L2), reference.embed(Z, L2, [0, 1, 2]))
    assert reference.embed(Z, L2, np.array([], dtype=np.int64)).shape == (0, 2)


def test_logits_and_head_matrix_are_T_times_Z_transpose():
    Z = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    W = reference.head_matrix(Z, L2)
    np.testing.assert_array_equal(W, [[4.0, 2.0, 6.0], [2.0, 2.0, 4.0]])
    h = np.array([[1.0, 0.0], [0.0, -1.0]])
    np.testing.assert_array_equal(reference.logits(Z, L2, h), h @ W)
    Zo = np.array([[0.6, 0.0], [0.0, 1.0], [0.8, 0.0]])
    np.testing.assert_allclose(reference.head_matrix(Zo, L2) @ reference.embedding_matrix(Zo, L2), np.eye(2), atol=1e-15)



@pytest.mark.parametrize("h", [np.ones(2), np.ones((1, 3)), np.ones((1, 2, 2)), np.ones((1, 1))],
                         ids=["1-D", "1x3", "3-D", "1x1"])
def test_logits_refuse_hidden_states_that_are_not_B_by_D(h):
    Z = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    with pytest.raises(PitcheckError, match="B x 2"):  # the D expected
        reference.logits(Z, L2, h)


def test_check_ids_and_shapes():
    np.testing.assert_array_equal(reference.check_ids([0, 4], 5), [0, 4])
    np.testing.assert_array_equal(reference.check_ids([1, 3], 5), [1, 3])
    reference.check_shapes(3, 3)
    reference.check_shapes(1, 1)


@pytest.mark.parametrize("ids", [[5], [-1], [0.0], [7]])
def test_check_ids_refuses_ids_out_of_range_or_not_integers(ids):
    with pytest.raises(PitcheckError):
        reference.check_ids(ids, 5)


@pytest.mark.parametrize("vocab, dim", [(2, 3), (0, 0), (3, 0), (0, 1)])
def test_check_shapes_refuses_empty_and_wide_memories(vocab, dim):
    with pytest.raises(PitcheckError):
        reference.check_shapes(vocab, dim)


def test_random_memory_is_the_sign_fixed_q_of_the_seeded_gaussian():
    # seed 2: LAPACK's R has diagonal signs (-, +, -), so the sign fix has work to do
    Z = reference.random_memory(9, 3, np.random.default_rng(2))
    G = np.random.default_rng(2).standard_normal((9, 3))
    Rf = Z.T @ G  # = R with diag(R) > 0
    np.testing.assert_allclose(np.tril(Rf, -1), 0, atol=1e-14)
    assert (np.diag(Rf) > 0).all()
    np.testing.assert_allclose(Z.T @ Z, np.eye(3), atol=1e-15)


def test_polar_memory_is_P_Q_transpose():
    P = np.linalg.qr(np.random.default_rng(1).standard_normal((6, 2)))[0]
    c, s = math.cos(0.4), math.sin(0.4)
    Q = np.array([[c, -s], [s, c]])
    np.testing.assert_allclose(reference.polar_memory((P * [3.0, 0.1]) @ Q.T), P @ Q.T, atol=1e-14)
    # rank deficiency: s_min <= s_max V eps
    eps = np.finfo(np.float64).eps
    with pytest.raises(PitcheckError):
        reference.polar_memory((P * [1.0, 0.5 * 6 * eps]) @ Q.T)
    reference.polar_memory((P * [1.0, 4 * 6 * eps]) @ Q.T)


@pytest.mark.parametrize("bad", [np.ones(3), np.full((3, 2), np.nan), np.ones((2, 3)), np.ones((3, 2, 2))],
                         ids=["1-D", "nan", "wide", "3-D"])
def test_polar_memory_refuses_what_is_not_a_finite_tall_matrix(bad):
    with pytest.raises(PitcheckError):
        reference.polar_memory(bad)


def test_spd_with_condition_has_geometric_eigenvalues_from_one_to_one_over_cond():
    T = reference.spd_with_condition(4, 1000.0, np.random.default_rng(0))
    np.testing.assert_allclose(np.linalg.eigvalsh(T)[::-1], [1.0, 0.1, 0.01, 0.001], rtol=1e-12)
    np.testing.assert_array_equal(T, T.T)
    assert reference.spd_with_condition(1, 5.0, np.random.default_rng(0)).tolist() == [[1.0]]
    np.testing.assert_allclose(reference.spd_with_condition(3, 1.0, np.random.default_rng(0)), np.eye(3), atol=1e-15)
    with pytest.raises(PitcheckError):
        reference.spd_with_condition(3, 0.99, np.random.default_rng(0))
    # the eigenvectors are a sign-fixed Haar draw: seeded
    np.testing.assert_array_equal(T, reference.spd_with_condition(4, 1000.0, np.random.default_rng(0)))


def test_cholesky_factor_is_lower_and_refuses_what_is_not_spd():
    T = np.array([[4.0, 2.0], [2.0, 2.0]])
    np.testing.assert_array_equal(reference.cholesky_factor(T), L2)
    # a relative asymmetry of 1e-13 passes, of 1e-11 is refused
    reference.cholesky_factor(T + np.array([[0.0, 4e-13], [0.0, 0.0]]))


# a batch of two SPD matrices equals its own t.T (all axes reversed): not a T all the same
SPD_BATCH = np.array([[[2.0, 1.0], [1.0, 1.0]], [[1.0, 1.0], [1.0, 2.0]]])


@pytest.mark.parametrize("bad", [
    np.array([[4.0, 2.0 + 4e-11], [2.0, 2.0]]),  # a relative asymmetry of 1e-11
    np.ones((2, 3)), np.ones(2), np.array([[1.0, 2.0], [2.0, 1.0]]), np.array([[np.inf, 0.0], [0.0, 1.0]]),
    SPD_BATCH, np.ones((3, 2)),
], ids=["asymmetric", "2x3", "1-D", "indefinite", "inf", "batch", "3x2"])
def test_cholesky_factor_refuses_what_is_not_one_spd_matrix(bad):
    with pytest.raises(PitcheckError):
        reference.cholesky_factor(bad)


@pytest.mark.parametrize("L", [np.array([[1.0, 0.0], [np.inf, 1.0]]), np.array([[1.0, 0.0], [1.0, -1.0]]),
                               np.array([[1.0, 0.0], [1.0, 0.0]]), np.eye(3), np.eye(1)],
                         ids=["inf", "negative", "zero", "3x3", "1x1"])
def test_embed_refuses_a_factor_that_is_not_finite_positive_and_D_by_D(L):
    Z = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    with pytest.raises(PitcheckError, match="2 x 2"):  # the shape expected
        reference.embed(Z, L, [0])


def test_polar_memory_of_one_column_is_the_normalised_column():
    np.testing.assert_allclose(reference.polar_memory(np.array([[3.0], [4.0]])), [[0.6], [0.8]], rtol=1e-15)


def test_embed_keeps_a_non_finite_memory_row_in_its_row():
    """The solves run without scipy's finiteness check: a NaN row of Z gives a NaN embedding row and
    leaves the other rows exact (what the validator's bad_input check asks of a target)."""
    Z = np.array([[1.0, 0.0], [np.nan, 1.0], [1.0, 1.0]])
    E = reference.embed(Z, L2, [0, 1, 2])
    assert np.isnan(E[1]).all()
    np.testing.assert_array_equal(E[[0, 2]], [[0.5, -0.5], [0.0, 0.5]])


def test_cholesky_factor_symmetry_tolerance_is_relative_to_the_largest_entry():
    T = np.array([[4.0, 2.0], [2.0, 2.0]])  # max |t| = 4: tolerance 4e-12
    reference.cholesky_factor(T + np.array([[0.0, 2e-12], [0.0, 0.0]]))
    with pytest.raises(PitcheckError, match="not symmetric"):
        reference.cholesky_factor(T + np.array([[0.0, 6e-12], [0.0, 0.0]]))
    assert reference.cholesky_factor(np.eye(300)).shape == (300, 300)  # shapes compared by value


def test_spd_with_condition_of_dimension_two_spans_one_to_one_over_cond():
    T = reference.spd_with_condition(2, 100.0, np.random.default_rng(1))
    np.testing.assert_allclose(np.linalg.eigvalsh(T), [0.01, 1.0], rtol=1e-13)


def test_random_memory_fixes_every_negative_pivot_and_only_those():
    # seed 1, 4 x 4: LAPACK's pivots are (-1.27, 0.68, 0.77, -0.75): small positive ones must stay
    Z = reference.random_memory(4, 4, np.random.default_rng(1))
    Rf = Z.T @ np.random.default_rng(1).standard_normal((4, 4))
    assert (np.diag(Rf) > 0).all()
    np.testing.assert_allclose(np.tril(Rf, -1), 0, atol=1e-14)


def test_check_shapes_names_an_empty_size_as_not_positive():
    with pytest.raises(PitcheckError, match="positive"):
        reference.check_shapes(0, 1)


def test_reference_shape_checks_compare_shapes_by_value():
    assert np.array_equal(SPD_BATCH, SPD_BATCH.T)  # what makes the batch a hard case for the symmetry test
    big = np.eye(300)  # shapes compared by value: 300 is not a cached small int
    np.testing.assert_array_equal(reference.logits(big, big, np.ones((1, 300))), np.ones((1, 300)))


# ---- properties, certified against the oracle ----------------------------------------------------
def test_random_memory_is_orthonormal_to_working_precision(rng):
    Z = reference.random_memory(200, 16, rng)
    assert metrics.orthonormality_ratio(Z, U) < 30  # dqrt01's pass level


def test_random_memory_is_seeded():
    a = reference.random_memory(64, 8, np.random.default_rng(5))
    b = reference.random_memory(64, 8, np.random.default_rng(5))
    assert np.array_equal(a, b)


def test_polar_memory_is_the_oracle_polar_factor(rng):
    teacher = rng.standard_normal((60, 8)) @ np.diag(np.logspace(0, 3, 8))
    Z = reference.polar_memory(teacher)
    exact = oracle.polar(teacher)
    cond = np.linalg.cond(teacher)
    # the polar factor's condition number is about cond(E0): forward error ~ cond * u
    assert np.linalg.norm(Z - exact) / np.linalg.norm(exact) < 10 * 8 * cond * U


def test_polar_memory_rejects_bad_teachers():
    with pytest.raises(PitcheckError, match="rank deficient"):
        reference.polar_memory(np.ones((10, 3)))
    with pytest.raises(PitcheckError, match="non-finite"):
        reference.polar_memory(np.full((10, 3), np.nan))
    with pytest.raises(PitcheckError, match="V=3 < D=10"):
        reference.polar_memory(np.ones((3, 10)))


@pytest.mark.parametrize("cond", [1.0, 1e3, 1e8])
def test_spd_with_condition_hits_the_condition_number(cond, rng):
    T = reference.spd_with_condition(12, cond, rng)
    assert np.allclose(T, T.T)
    assert oracle.cond2(T) == pytest.approx(cond, rel=1e-6 * max(cond, 1) ** 0.5 + 1e-9)


def test_cholesky_factor_rejects_non_spd():
    with pytest.raises(PitcheckError, match="not positive definite"):
        reference.cholesky_factor(np.diag([1.0, -1.0]))
    with pytest.raises(PitcheckError, match="not symmetric"):
        reference.cholesky_factor(np.array([[2.0, 1.0], [0.0, 2.0]]))
    with pytest.raises(PitcheckError, match="square"):
        reference.cholesky_factor(np.ones((2, 3)))
    with pytest.raises(PitcheckError, match="non-positive diagonal"):
        reference.softplus_inverse(np.array([1.0, 0.0]))


def test_embed_rejects_bad_token_ids():
    Z, L = pit_pair(20, 4, 10.0)
    with pytest.raises(PitcheckError, match="out of range"):
        reference.embed(Z, L, [0, 20])
    with pytest.raises(PitcheckError, match="out of range"):
        reference.embed(Z, L, [-1])
    with pytest.raises(PitcheckError, match="integers"):
        reference.embed(Z, L, [0.5])
    with pytest.raises(PitcheckError, match="hidden states"):
        reference.logits(Z, L, np.ones((2, 5)))


def test_logits_are_h_T_Z_transpose():
    Z, L = pit_pair(30, 5, 100.0)
    h = np.random.default_rng(0).standard_normal((3, 5))
    assert np.allclose(reference.logits(Z, L, h), h @ reference.head_matrix(Z, L))


@settings(max_examples=12, deadline=None)
@given(
    vocab=st.integers(8, 48),
    dim=st.integers(2, 8),
    log_cond=st.floats(0, 10),
    seed=st.integers(0, 2**31),
)
def test_embedding_certified_against_oracle(vocab, dim, log_cond, seed):
    dim = min(dim, vocab)
    cond = 10.0**log_cond
    Z, L = pit_pair(vocab, dim, cond, seed)
    ids = np.arange(vocab)
    E = reference.embed(Z, L, ids)
    exact = oracle.embed(Z, L, ids)
    cond_T = oracle.cond2(L @ L.T)
    forward = np.max(np.linalg.norm(E - exact, axis=1) / np.linalg.norm(exact, axis=1))
    # two backward-stable triangular solves: forward error <= ~2 n cond(T) u, up to the factor between
    # a solve's componentwise (Skeel) condition and cond_2 (measured: 4.4 u at n = 2, cond(T) = 1)
    assert forward <= 4 * dim * cond_T * U
    # the exact drift of the computed E: ||W E - I|| <~ cond(T) (||Z^T Z - I|| + n u)
    orth = oracle.orthonormality_loss(Z)
    assert oracle.pinv_drift(Z, L, E) <= 2 * cond_T * (orth + dim * U) * np.sqrt(dim)


def test_orthonormality_loss_certified_against_oracle(rng):
    Z = reference.random_memory(100, 10, rng) + 1e-9 * rng.standard_normal((100, 10))
    exact = oracle.orthonormality_loss(Z)
    # the float64 Gram has error ~ V u per entry
    assert abs(metrics.orthonormality_loss(Z) - exact) <= 2 * 100 * U * np.sqrt(10)


def test_pinv_error_certified_against_oracle_pinv():
    Z, L = pit_pair(50, 5, 1e4)
    E = reference.embedding_matrix(Z, L)
    exact_pinv = oracle.pinv(E)  # D x V
    # W = T Z^T is the exact pseudo-inverse up to the drift bound cond(T) (orth + n u)
    W = (L @ L.T) @ Z.T
    bound = 10 * 1e4 * (oracle.orthonormality_loss(Z) + 5 * U)
    assert np.linalg.norm(W - exact_pinv) / np.linalg.norm(exact_pinv) < bound
    assert metrics.pinv_error(E, W.T) < bound
    # and the check fails a head that is not the pseudo-inverse
    assert metrics.pinv_error(E, (1.001 * W).T) > 1e-4
