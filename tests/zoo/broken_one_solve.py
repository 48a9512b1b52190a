"""Broken: embed does one triangular solve (e = L^{-T} z) instead of two (T^{-1} z = L^{-T} L^{-1} z).
Exact at initialisation (L = I), wrong at any generic T. Caught by `penrose` (W E != I at a generic
state) and `reference`."""
import torch

from ._base import LLtPIT


class OneSolvePIT(LLtPIT):
    def solve(self, L, rhs):
        return torch.linalg.solve_triangular(L.T, rhs, upper=True)


def make(vocab_size, hidden_size, *, dtype, device, seed):
    return OneSolvePIT(vocab_size, hidden_size, dtype=dtype, device=device, seed=seed)
