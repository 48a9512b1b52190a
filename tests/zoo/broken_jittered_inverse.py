"""Broken: the embedding adds a 1e-4 I "jitter" to T^{-1} (a regulariser copied from code that inverts
near-singular matrices), so E = Z (T^{-1} + 1e-4 I) and W E - I = 1e-4 T: off by 1e-4 whatever the precision,
while Z stays exactly orthonormal (QR in post_step). Caught by `penrose`; below what bfloat16 resolves, where
the float64 build shows it."""
import torch

from ._base import LLtPIT

JITTER = 1e-4


class JitteredInversePIT(LLtPIT):
    def solve(self, L, rhs):
        return super().solve(L, rhs) + JITTER * rhs


def make(vocab_size, hidden_size, *, dtype, device, seed):
    return JitteredInversePIT(vocab_size, hidden_size, dtype=dtype, device=device, seed=seed)
