"""The float64 reference, certified against the 50-digit mpmath oracle in units of u."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import pit_pair
from pitcheck import PitcheckError, metrics, oracle, reference

U = 2.0**-53


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


def test_oracle_refuses_large_sizes():
    with pytest.raises(PitcheckError, match="oracle"):
        oracle.embed(np.zeros((300, 4)), np.eye(4), [0])


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
