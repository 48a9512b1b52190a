"""Broken: Z is initialised as a Gaussian scaled by 1/sqrt(V) (the usual embedding init) and never
orthonormalised at the start; post_step's QR retraction makes it orthonormal only after the first step.
At initialisation Z^T Z != I, so W E = Z^T Z != I. Caught by `penrose` at initialisation."""
import torch

from ._base import LLtPIT


class GaussianInitPIT(LLtPIT):
    def init_memory(self, V, D, gen):
        return torch.randn(V, D, generator=gen, dtype=torch.float64) / V ** 0.5


def make(vocab_size, hidden_size, *, dtype, device, seed):
    return GaussianInitPIT(vocab_size, hidden_size, dtype=dtype, device=device, seed=seed)
