"""Broken: the head normalises h for "stability", logits = ||h|| ((h / ||h||) T) Z^T, with the norm
computed as sqrt(sum(h * h)) in the storage dtype. For ||h|| beyond sqrt(max float) the sum of squares
overflows to inf and the row comes back NaN without an error, although c * logits(h) is finite. Exact for
moderate h. Caught by `scale`."""
import torch

from ._base import LLtPIT


class NormalisedHeadPIT(LLtPIT):
    def head(self, h, L):
        norm = torch.sqrt(torch.sum(h * h, dim=-1, keepdim=True)).clamp_min(torch.finfo(h.dtype).tiny)
        u = h / norm
        return norm * (((u @ L) @ L.T) @ self.memory().T)


def make(vocab_size, hidden_size, *, dtype, device, seed):
    return NormalisedHeadPIT(vocab_size, hidden_size, dtype=dtype, device=device, seed=seed)
