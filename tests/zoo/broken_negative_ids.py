"""Broken: correct maps, but token ids are not range-checked; torch indexing turns id -1 into the last
row, so embed(-1) silently returns the embedding of token V-1 (V itself still raises inside torch).
Caught by `bad_input`."""
import torch

from ._base import LLtPIT


class UncheckedIdsPIT(LLtPIT):
    def check_ids(self, ids):
        return torch.as_tensor(ids, device=self.Z.device)  # torch indexing rejects floats and ids >= V


def make(vocab_size, hidden_size, *, dtype, device, seed):
    return UncheckedIdsPIT(vocab_size, hidden_size, dtype=dtype, device=device, seed=seed)
