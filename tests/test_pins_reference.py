"""Pins of pitcheck.reference: closed-form values of the float64 reference PIT."""
import math

import numpy as np
import pytest

from pitcheck import reference as ref
from pitcheck.errors import PitcheckError

L2 = np.array([[2.0, 0.0], [1.0, 1.0]])  # T = [[4, 2], [2, 2]], T^{-1} = [[1/2, -1/2], [-1/2, 1]]


def test_softplus_inverse_sign_and_closed_form():
    """softplus(r) = log(1 + e^r): softplus_inverse(log 2) = 0, (log(1 + e)) = 1, (log(1 + e^-3)) = -3."""
    got = ref.softplus_inverse(np.array([math.log(2.0), math.log1p(math.e), math.log1p(math.exp(-3.0))]))
    np.testing.assert_allclose(got, [0.0, 1.0, -3.0], rtol=1e-13, atol=1e-15)
    y = np.geomspace(1e-6, 30, 50)
    np.testing.assert_allclose(np.logaddexp(0.0, ref.softplus_inverse(y)), y, rtol=1e-12)
    # for large y the inverse approaches y from below; for small y it is log(y)
    assert 20.0 - 1e-8 < ref.softplus_inverse(np.array([20.0]))[0] < 20.0
    assert ref.softplus_inverse(np.array([1e-10]))[0] == pytest.approx(math.log(1e-10), rel=1e-9)


def test_softplus_inverse_refuses_a_non_positive_diagonal():
    for bad in ([0.0], [1.0, -1.0]):
        with pytest.raises(PitcheckError):
            ref.softplus_inverse(np.array(bad))


def test_embed_is_two_triangular_solves_with_L_then_L_transpose():
    Z = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    np.testing.assert_array_equal(ref.embed(Z, L2, [0, 1, 2]), [[0.5, -0.5], [-0.5, 1.0], [0.0, 0.5]])
    np.testing.assert_array_equal(ref.embed(Z, L2, [2, 0]), [[0.0, 0.5], [0.5, -0.5]])
    np.testing.assert_array_equal(ref.embedding_matrix(Z, L2), ref.embed(Z, L2, [0, 1, 2]))
    assert ref.embed(Z, L2, np.array([], dtype=np.int64)).shape == (0, 2)


def test_logits_and_head_matrix_are_T_times_Z_transpose():
    Z = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    W = ref.head_matrix(Z, L2)
    np.testing.assert_array_equal(W, [[4.0, 2.0, 6.0], [2.0, 2.0, 4.0]])
    h = np.array([[1.0, 0.0], [0.0, -1.0]])
    np.testing.assert_array_equal(ref.logits(Z, L2, h), h @ W)
    Zo = np.array([[0.6, 0.0], [0.0, 1.0], [0.8, 0.0]])
    np.testing.assert_allclose(ref.head_matrix(Zo, L2) @ ref.embedding_matrix(Zo, L2), np.eye(2), atol=1e-15)
    for bad in (np.ones(2), np.ones((1, 3))):
        with pytest.raises(PitcheckError, match="must be B x 2,"):
            ref.logits(Z, L2, bad)


def test_check_ids_and_shapes():
    np.testing.assert_array_equal(ref.check_ids([0, 4], 5), [0, 4])
    for ids in ([5], [-1], [0.0]):
        with pytest.raises(PitcheckError):
            ref.check_ids(ids, 5)
    ref.check_shapes(3, 3)
    ref.check_shapes(1, 1)
    for v, d in ((2, 3), (0, 0), (3, 0), (0, 1)):
        with pytest.raises(PitcheckError):
            ref.check_shapes(v, d)


def test_random_memory_is_the_sign_fixed_q_of_the_seeded_gaussian():
    # seed 2: LAPACK's R has diagonal signs (-, +, -), so the sign fix has work to do
    Z = ref.random_memory(9, 3, np.random.default_rng(2))
    G = np.random.default_rng(2).standard_normal((9, 3))
    Rf = Z.T @ G  # = R with diag(R) > 0
    np.testing.assert_allclose(np.tril(Rf, -1), 0, atol=1e-14)
    assert (np.diag(Rf) > 0).all()
    np.testing.assert_allclose(Z.T @ Z, np.eye(3), atol=1e-15)


def test_polar_memory_is_P_Q_transpose():
    P = np.linalg.qr(np.random.default_rng(1).standard_normal((6, 2)))[0]
    c, s = math.cos(0.4), math.sin(0.4)
    Q = np.array([[c, -s], [s, c]])
    np.testing.assert_allclose(ref.polar_memory((P * [3.0, 0.1]) @ Q.T), P @ Q.T, atol=1e-14)
    # rank deficiency: s_min <= s_max V eps
    eps = np.finfo(np.float64).eps
    with pytest.raises(PitcheckError):
        ref.polar_memory((P * [1.0, 0.5 * 6 * eps]) @ Q.T)
    ref.polar_memory((P * [1.0, 4 * 6 * eps]) @ Q.T)
    for bad in (np.ones(3), np.full((3, 2), np.nan), np.ones((2, 3))):
        with pytest.raises(PitcheckError):
            ref.polar_memory(bad)


def test_spd_with_condition_has_geometric_eigenvalues_from_one_to_one_over_cond():
    T = ref.spd_with_condition(4, 1000.0, np.random.default_rng(0))
    np.testing.assert_allclose(np.linalg.eigvalsh(T)[::-1], [1.0, 0.1, 0.01, 0.001], rtol=1e-12)
    np.testing.assert_array_equal(T, T.T)
    assert ref.spd_with_condition(1, 5.0, np.random.default_rng(0)).tolist() == [[1.0]]
    np.testing.assert_allclose(ref.spd_with_condition(3, 1.0, np.random.default_rng(0)), np.eye(3), atol=1e-15)
    with pytest.raises(PitcheckError):
        ref.spd_with_condition(3, 0.99, np.random.default_rng(0))
    # the eigenvectors are a sign-fixed Haar draw: seeded
    np.testing.assert_array_equal(T, ref.spd_with_condition(4, 1000.0, np.random.default_rng(0)))


def test_cholesky_factor_is_lower_and_refuses_what_is_not_spd():
    T = np.array([[4.0, 2.0], [2.0, 2.0]])
    np.testing.assert_array_equal(ref.cholesky_factor(T), L2)
    # a relative asymmetry of 1e-13 passes, of 1e-11 is refused
    ref.cholesky_factor(T + np.array([[0.0, 4e-13], [0.0, 0.0]]))
    for bad in (T + np.array([[0.0, 4e-11], [0.0, 0.0]]), np.ones((2, 3)), np.ones(2), np.array([[1.0, 2.0], [2.0, 1.0]]),
                np.array([[np.inf, 0.0], [0.0, 1.0]])):
        with pytest.raises(PitcheckError):
            ref.cholesky_factor(bad)


def test_embed_refuses_a_factor_that_is_not_finite_positive_and_D_by_D():
    Z = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    for L in (np.array([[1.0, 0.0], [np.inf, 1.0]]), np.array([[1.0, 0.0], [1.0, -1.0]]),
              np.array([[1.0, 0.0], [1.0, 0.0]]), np.eye(3)):
        with pytest.raises(PitcheckError, match="L must be a finite 2 x 2 factor"):
            ref.embed(Z, L, [0])


def test_polar_memory_of_one_column_is_the_normalised_column():
    np.testing.assert_allclose(ref.polar_memory(np.array([[3.0], [4.0]])), [[0.6], [0.8]], rtol=1e-15)


def test_embed_keeps_a_non_finite_memory_row_in_its_row():
    """The solves run without scipy's finiteness check: a NaN row of Z gives a NaN embedding row and
    leaves the other rows exact (what the validator's bad_input check asks of a target)."""
    Z = np.array([[1.0, 0.0], [np.nan, 1.0], [1.0, 1.0]])
    E = ref.embed(Z, L2, [0, 1, 2])
    assert np.isnan(E[1]).all()
    np.testing.assert_array_equal(E[[0, 2]], [[0.5, -0.5], [0.0, 0.5]])


def test_cholesky_factor_symmetry_tolerance_is_relative_to_the_largest_entry():
    T = np.array([[4.0, 2.0], [2.0, 2.0]])  # max |t| = 4: tolerance 4e-12
    ref.cholesky_factor(T + np.array([[0.0, 2e-12], [0.0, 0.0]]))
    with pytest.raises(PitcheckError, match="not symmetric"):
        ref.cholesky_factor(T + np.array([[0.0, 6e-12], [0.0, 0.0]]))
    assert ref.cholesky_factor(np.eye(300)).shape == (300, 300)  # shapes compared by value


def test_spd_with_condition_of_dimension_two_spans_one_to_one_over_cond():
    T = ref.spd_with_condition(2, 100.0, np.random.default_rng(1))
    np.testing.assert_allclose(np.linalg.eigvalsh(T), [0.01, 1.0], rtol=1e-13)


def test_random_memory_fixes_every_negative_pivot_and_only_those():
    # seed 1, 4 x 4: LAPACK's pivots are (-1.27, 0.68, 0.77, -0.75): small positive ones must stay
    Z = ref.random_memory(4, 4, np.random.default_rng(1))
    Rf = Z.T @ np.random.default_rng(1).standard_normal((4, 4))
    assert (np.diag(Rf) > 0).all()
    np.testing.assert_allclose(np.tril(Rf, -1), 0, atol=1e-14)


def test_input_checks_of_the_reference():
    with pytest.raises(PitcheckError):
        ref.polar_memory(np.ones((3, 2, 2)))
    np.testing.assert_array_equal(ref.check_ids([1, 3], 5), [1, 3])
    with pytest.raises(PitcheckError):
        ref.check_ids([7], 5)
    with pytest.raises(PitcheckError, match="must be positive"):
        ref.check_shapes(0, 1)


def test_reference_shape_checks_of_T_h_and_L():
    # a batch of two SPD matrices, equal to its own t.T (all axes reversed): not a T all the same
    batch = np.array([[[2.0, 1.0], [1.0, 1.0]], [[1.0, 1.0], [1.0, 2.0]]])
    assert np.array_equal(batch, batch.T)
    for bad in (batch, np.ones((3, 2))):
        with pytest.raises(PitcheckError):
            ref.cholesky_factor(bad)
    Z = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    for h in (np.ones((1, 2, 2)), np.ones((1, 1))):
        with pytest.raises(PitcheckError):
            ref.logits(Z, L2, h)
    with pytest.raises(PitcheckError):
        ref.embed(Z, np.eye(1), [0])
    big = np.eye(300)  # shapes compared by value: 300 is not a cached small int
    np.testing.assert_array_equal(ref.logits(big, big, np.ones((1, 300))), np.ones((1, 300)))
