"""Correct, started away from T = I: the upper-polar convention (T = R^T R) with R's diagonal spread
geometrically so that cond(T) = 1e4 at initialisation, and a small random upper part, as a module
converted from a trained model starts. A verifier that loses digits to cond(T)^2 fails it."""
import math

import torch
import torch.nn.functional as F

from tests.zoo.correct_upper_polar import UpperPolarPIT

COND = 1e4


class ConditionedStartPIT(UpperPolarPIT):
    def __init__(self, vocab_size, hidden_size, *, dtype, device, seed):
        super().__init__(vocab_size, hidden_size, dtype=dtype, device=device, seed=seed)
        gen = torch.Generator().manual_seed(seed + 1)
        # diag(R) from 1 to cond^(1/2): cond(R^T R) near cond
        diag = torch.logspace(0.0, 0.5 * math.log10(COND), hidden_size, dtype=torch.float64) - self.FLOOR
        raw = torch.log(torch.expm1(diag))  # softplus^-1
        upper = torch.triu(0.1 * torch.randn(hidden_size, hidden_size, generator=gen, dtype=torch.float64), 1)
        with torch.no_grad():
            self.R_raw.copy_((upper + torch.diag(raw)).to(self.R_raw))


def make(vocab_size, hidden_size, *, dtype, device, seed):
    return ConditionedStartPIT(vocab_size, hidden_size, dtype=dtype, device=device, seed=seed)
