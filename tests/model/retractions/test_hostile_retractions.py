"""Retractions called on a shape with no orthonormal point (more columns than rows), or a step not of Z's
shape: every registered map and every stacked form refuses it naming the shape, where they returned
something silently off the manifold (qr a 4 x 4 array, polar-express and landing far from orthonormal)."""
import numpy as np
import pytest
import torch

from pitcheck import PitcheckError
from pitcheck.numerics.arrays import NumpyOps, TorchOps
from pitcheck.model.retractions import STACKED_RETRACTIONS, StackedOps
from pitcheck.model.retractions import RETRACTIONS, retract_qr


@pytest.mark.parametrize("name", list(RETRACTIONS))
@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_every_retraction_refuses_more_columns_than_rows(name, kind):
    Z = np.random.default_rng(0).standard_normal((4, 8))
    ops = NumpyOps() if kind == "numpy" else TorchOps()
    if kind == "torch":
        Z = torch.from_numpy(Z)
    with pytest.raises(PitcheckError, match=rf"^{name}: Z is 4 x 8, more columns than rows"):
        RETRACTIONS[name](Z, 0 * Z, ops)


@pytest.mark.parametrize("name", list(STACKED_RETRACTIONS))
def test_every_stacked_form_refuses_more_columns_than_rows(name):
    Z = np.random.default_rng(0).standard_normal((2, 4, 8))
    with pytest.raises(PitcheckError, match=rf"^{name}: Z is 4 x 8, more columns than rows"):
        STACKED_RETRACTIONS[name](Z, 0 * Z, StackedOps(NumpyOps()))


def test_a_module_level_function_refuses_too_and_names_a_mismatched_step():
    with pytest.raises(PitcheckError, match="qr: Z is 4 x 8"):
        retract_qr(np.ones((4, 8)), np.zeros((4, 8)))
    with pytest.raises(PitcheckError, match="qr: xi is 8 x 3, Z 8 x 4"):
        retract_qr(np.ones((8, 4)), np.zeros((8, 3)))
    with pytest.raises(PitcheckError, match="qr: Z must be a V x D array, got a 8 array"):
        retract_qr(np.ones(8), np.zeros(8))
    # a stack handed to the one-matrix form: its rank is refused, not read as B x V
    with pytest.raises(PitcheckError, match="qr: Z must be a V x D array, got a 2 x 8 x 4 array"):
        retract_qr(np.ones((2, 8, 4)), np.zeros((2, 8, 4)))
    with pytest.raises(PitcheckError, match="Z must be a B x V x D array"):
        STACKED_RETRACTIONS["qr"](np.ones((8, 4)), np.zeros((8, 4)), StackedOps(NumpyOps()))


def test_a_square_and_a_tall_matrix_still_retract():
    for V, D in ((4, 4), (8, 4)):
        Q = retract_qr(np.random.default_rng(1).standard_normal((V, D)), np.zeros((V, D)))
        assert np.allclose(Q.T @ Q, np.eye(D))
