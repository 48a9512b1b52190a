"""Broken: L = tril(raw) with the diagonal a raw parameter, no softplus/exp and no floor (init 1, so
T = I). When the diagonal is driven to zero (weight decay's limit, or an optimizer) T is singular and the
triangular solves return inf/NaN without an error. Caught by `conditioning`."""
import torch

from ._base import LLtPIT


class RawDiagPIT(LLtPIT):
    raw_diag_init = 1.0

    def factor(self):
        return torch.tril(self.L_raw)


def make(vocab_size, hidden_size, *, dtype, device, seed):
    return RawDiagPIT(vocab_size, hidden_size, dtype=dtype, device=device, seed=seed)
