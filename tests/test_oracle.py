"""The mpmath oracle (tests/oracle.py, 50 digits) on cases with closed-form answers, and on residuals
that float64 cannot resolve: at 50 digits (about 166 bits) a residual far below float64's u = 2^-53
relative to its terms comes out exactly; at 16 digits (about 56 bits) it would round away."""
import math
from fractions import Fraction

import numpy as np
import pytest

from pitcheck.infra.errors import PitcheckError
from tests import oracle

L2 = np.array([[2.0, 0.0], [1.0, 1.0]])  # T = [[4, 2], [2, 2]], T^{-1} = [[1/2, -1/2], [-1/2, 1]]
Z3 = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])


# ---- closed forms ------------------------------------------------------------------------------------
def test_oracle_embed_is_T_inverse_z_exactly():
    np.testing.assert_array_equal(oracle.embed(Z3, L2, [0, 1, 2]), [[0.5, -0.5], [-0.5, 1.0], [0.0, 0.5]])
    np.testing.assert_array_equal(oracle.embed(Z3, L2, [1]), [[-0.5, 1.0]])
    # a 3 x 3 factor: every off-diagonal entry takes part in both substitutions
    L = np.array([[1.0, 0.0, 0.0], [2.0, 1.0, 0.0], [3.0, 4.0, 1.0]])
    Z = np.eye(3)
    np.testing.assert_allclose(oracle.embed(Z, L, [0, 1, 2]) @ (L @ L.T), Z, atol=1e-13)
    np.testing.assert_array_equal(oracle.embed(Z, L, [0, 1, 2]), np.linalg.inv(L @ L.T).round(9))


def test_oracle_orthonormality_loss_and_pinv_drift():
    assert oracle.orthonormality_loss(Z3) == pytest.approx(math.sqrt(1 + 1 + 1 + 1), rel=1e-15)  # [[1,1],[1,1]]
    Zo = np.array([[0.6, 0.0], [0.0, 1.0], [0.8, 0.0]])
    assert oracle.orthonormality_loss(Zo) < 1e-16  # 0.6 and 0.8 are rounded: not exactly 0
    E = oracle.embed(Zo, L2, [0, 1, 2])
    assert oracle.pinv_drift(Zo, L2, E) < 1e-15
    # W E - I = T Z^T (E + Delta) - I = T Z^T Delta: Delta = d at (1, 0) -> T[:, 1] d = (2 d, 2 d)
    d = 2.0**-20
    E2 = E.copy()
    E2[1, 0] += d
    assert oracle.pinv_drift(Zo, L2, E2) == pytest.approx(math.sqrt(8) * d, rel=1e-9)


def test_oracle_polar_and_pinv_and_cond():
    c, s = math.cos(0.4), math.sin(0.4)
    Q = np.array([[c, -s], [s, c]])
    P = np.array([[0.6, 0.0], [0.0, 1.0], [0.8, 0.0]])
    Y = (P * [3.0, 0.5]) @ Q.T
    np.testing.assert_allclose(oracle.polar(Y), P @ Q.T, atol=1e-15)
    np.testing.assert_allclose(oracle.pinv(Y), (Q / [3.0, 0.5]) @ P.T, atol=1e-15)
    assert oracle.cond2(Y) == pytest.approx(6.0, rel=1e-15)
    assert oracle.cond2(np.diag([4.0, 0.5, 1.0])) == 8.0


def test_oracle_round_trip_is_exact():
    a = np.array([[0.1, -2.0**-60], [1e300, 3.0]])
    np.testing.assert_array_equal(oracle.to_float(oracle.to_mp(a)), a)
    assert oracle.to_mp(np.array([1.0, 2.0])).rows == 1


# ---- size limits: V <= 256, D <= 32 ------------------------------------------------------------------
BIG = np.zeros((oracle.MAX_VOCAB + 1, 2))
WIDE = np.zeros((4, oracle.MAX_DIM + 1))


@pytest.mark.parametrize("call", [
    lambda: oracle.orthonormality_loss(BIG), lambda: oracle.orthonormality_loss(WIDE),
    lambda: oracle.polar(BIG), lambda: oracle.polar(WIDE),
    lambda: oracle.pinv(BIG), lambda: oracle.pinv(WIDE),
    lambda: oracle.embed(BIG, np.eye(2), [0]),
    lambda: oracle.pinv_drift(BIG, np.eye(2), BIG),
], ids=["loss-V", "loss-D", "polar-V", "polar-D", "pinv-V", "pinv-D", "embed-V", "pinv_drift-V"])
def test_oracle_refuses_sizes_beyond_its_limits(call):
    with pytest.raises(PitcheckError):
        call()


def test_oracle_size_limits_are_256_by_32():
    assert (oracle.MAX_VOCAB, oracle.MAX_DIM) == (256, 32)
    oracle._check_size(oracle.MAX_VOCAB, oracle.MAX_DIM)
    oracle._check_size(256, 32)


@pytest.mark.parametrize("vocab, dim", [(257, 32), (256, 33)])
def test_oracle_refuses_one_past_either_limit(vocab, dim):
    with pytest.raises(PitcheckError):
        oracle._check_size(vocab, dim)


# ---- resolution: what float64 rounds away ------------------------------------------------------------
def test_oracle_resolves_a_residual_far_below_float64_u():
    # Z = [1; 2^-30]: Z^T Z - 1 = 2^-60 exactly, 2^-7 of float64's u at 1 (float64 gives 0)
    Z = np.array([[1.0], [2.0**-30]])
    assert float((Z.T @ Z)[0, 0]) - 1 == 0.0
    assert oracle.orthonormality_loss(Z) == 2.0**-60
    # 2^-80: out of reach of 64 bits too
    assert oracle.orthonormality_loss(np.array([[1.0], [2.0**-40]])) == 2.0**-80


def test_oracle_pinv_drift_resolves_cancellation_below_u():
    # T = 1, Z = [1, 2^-35], E = Z: T Z^T E - 1 = 2^-70 exactly
    Z = np.array([[1.0], [2.0**-35]])
    assert oracle.pinv_drift(Z, np.eye(1), Z) == 2.0**-70


def test_oracle_embedding_is_the_correctly_rounded_quotient():
    # e = z / (l^2) with l = 1 + 2^-30: the exact quotient rounded once; a 56-bit oracle rounds twice
    l = 1 + 2.0**-30
    z = 1 + 2.0**-52
    want = float(Fraction(z) / Fraction(l) ** 2)
    assert oracle.embed(np.array([[z]]), np.array([[l]]), [0])[0, 0] == want
    assert oracle.DIGITS == 50


def test_oracle_refuses_large_sizes():
    with pytest.raises(PitcheckError, match="oracle"):
        oracle.embed(np.zeros((300, 4)), np.eye(4), [0])
