"""Broken: asked for float64, it silently runs the triangular solves in float32 and casts back (a
"fast path" copied from GPU code). Parameters and outputs are float64, but embed carries float32 error
(~cond(T) * 6e-8 instead of ~cond(T) * 1e-16). Caught by `contract` (and `reference`)."""
import torch

from ._base import LLtPIT


class Fp32SolvesPIT(LLtPIT):
    def solve(self, L, rhs):
        out_dtype = rhs.dtype
        L32, rhs32 = L.float(), rhs.float()
        y = torch.linalg.solve_triangular(L32, rhs32, upper=False)
        return torch.linalg.solve_triangular(L32.T, y, upper=True).to(out_dtype)


def make(vocab_size, hidden_size, *, dtype, device, seed):
    return Fp32SolvesPIT(vocab_size, hidden_size, dtype=dtype, device=device, seed=seed)
