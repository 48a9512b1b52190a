import numpy as np
import pytest

from pitcheck import reference


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def pit_pair(vocab, dim, cond, seed=0):
    """A random orthonormal Z and the Cholesky factor of an SPD T with the given condition number."""
    rng = np.random.default_rng(seed)
    Z = reference.random_memory(vocab, dim, rng)
    L = reference.cholesky_factor(reference.spd_with_condition(dim, cond, rng))
    return Z, L
