"""Shared test fixtures' building blocks."""
import numpy as np

from pitcheck import reference


def pit_pair(vocab, dim, cond, seed=0):
    """A random orthonormal Z and the Cholesky factor of an SPD T with the given condition number."""
    rng = np.random.default_rng(seed)
    Z = reference.random_memory(vocab, dim, rng)
    L = reference.cholesky_factor(reference.spd_with_condition(dim, cond, rng))
    return Z, L
