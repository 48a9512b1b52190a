"""pitcheck.numerics.arrays.householder_qr: LAPACK's geqrf + orgqr called directly must be np.linalg.qr bit for bit
(the numpy reference and the float64 shadow step with it, and committed results were computed with
np.linalg.qr), including at a shape where a smaller, unblocked workspace would round differently."""
import numpy as np
import pytest

from pitcheck.numerics.arrays import NumpyOps, householder_qr
from pitcheck.model.retractions import retract_qr


@pytest.mark.parametrize("shape", [(7, 1), (128, 8), (300, 40), (64, 64), (2048, 64), (4096, 256)])
def test_householder_qr_is_numpys_qr_bit_for_bit(shape):
    A = np.random.default_rng(sum(shape)).standard_normal(shape) * 3.0
    Q, R = householder_qr(A)
    Q0, R0 = np.linalg.qr(A)
    assert Q.shape == Q0.shape and R.shape == R0.shape
    assert np.array_equal(Q, Q0) and np.array_equal(R, R0)


def test_householder_qr_leaves_its_input_alone_and_falls_back_off_the_hot_path():
    A = np.random.default_rng(0).standard_normal((50, 6))
    copy = A.copy()
    householder_qr(A)
    assert np.array_equal(A, copy)
    Af = np.asfortranarray(A)  # a column-major input is copied too, never factored in place
    householder_qr(Af)
    assert np.array_equal(Af, copy)
    for x in (A.T, A.astype(np.float32)):  # wide, float32: np.linalg.qr's answer
        Q, R = householder_qr(x)
        Q0, R0 = np.linalg.qr(x)
        assert np.array_equal(Q, Q0) and np.array_equal(R, R0)


def test_numpy_qr_retraction_unchanged_bit_for_bit():
    rng = np.random.default_rng(3)
    Z = np.linalg.qr(rng.standard_normal((512, 24)))[0]
    xi = 1e-2 * rng.standard_normal(Z.shape)
    Q0, R0 = np.linalg.qr(Z + xi)
    expected = Q0 * np.where(np.diag(R0) < 0, -1.0, 1.0)
    assert np.array_equal(retract_qr(Z, xi, NumpyOps()), expected)
