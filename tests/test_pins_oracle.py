"""Pins of pitcheck.oracle (mpmath at 50 digits) on cases with closed-form answers."""
import math

import numpy as np
import pytest

from pitcheck import oracle
from pitcheck.errors import PitcheckError

L2 = np.array([[2.0, 0.0], [1.0, 1.0]])  # T = [[4, 2], [2, 2]], T^{-1} = [[1/2, -1/2], [-1/2, 1]]
Z3 = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])


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


def test_oracle_refuses_sizes_beyond_its_limits():
    big = np.zeros((oracle.MAX_VOCAB + 1, 2))
    wide = np.zeros((4, oracle.MAX_DIM + 1))
    for f in (oracle.orthonormality_loss, oracle.polar, oracle.pinv):
        for a in (big, wide):
            with pytest.raises(PitcheckError):
                f(a)
    with pytest.raises(PitcheckError):
        oracle.embed(big, np.eye(2), [0])
    with pytest.raises(PitcheckError):
        oracle.pinv_drift(big, np.eye(2), big)
    oracle._check_size(oracle.MAX_VOCAB, oracle.MAX_DIM)


def test_oracle_round_trip_is_exact():
    a = np.array([[0.1, -2.0**-60], [1e300, 3.0]])
    np.testing.assert_array_equal(oracle.to_float(oracle.to_mp(a)), a)
    assert oracle.to_mp(np.array([1.0, 2.0])).rows == 1


def test_oracle_size_limits_are_256_by_32():
    oracle._check_size(256, 32)
    for v, d in ((257, 32), (256, 33)):
        with pytest.raises(PitcheckError):
            oracle._check_size(v, d)
