"""Broken: the head is computed as W = torch.linalg.pinv(E) from the embedding matrix E = Z T^{-1},
at pinv's default cutoff (rtol = max(V, D) eps). Exact while T is well conditioned; once cond(T) passes
the cutoff pinv drops E's small singular values and W E != I. Caught by `conditioning`."""
import torch

from ._base import LLtPIT


class PinvHeadPIT(LLtPIT):
    def head(self, h, L):
        E = self.solve(L, self.memory().T).T  # V x D, every row embedded
        return h @ torch.linalg.pinv(E)


def make(vocab_size, hidden_size, *, dtype, device, seed):
    return PinvHeadPIT(vocab_size, hidden_size, dtype=dtype, device=device, seed=seed)
