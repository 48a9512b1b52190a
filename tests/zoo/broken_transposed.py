"""Broken: the head applies L^T L where T = L L^T belongs (logits = (h L^T L) Z^T), while embed solves
with L L^T. Same at initialisation and for diagonal L; at a generic T, W E = L^T L (L L^T)^{-1} != I.
Caught by `penrose`."""
from ._base import LLtPIT


class TransposedHeadPIT(LLtPIT):
    def head(self, h, L):
        return ((h @ L.T) @ L) @ self.memory().T


def make(vocab_size, hidden_size, *, dtype, device, seed):
    return TransposedHeadPIT(vocab_size, hidden_size, dtype=dtype, device=device, seed=seed)
