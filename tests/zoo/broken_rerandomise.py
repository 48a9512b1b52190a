"""Broken: post_step "re-orthonormalises" by drawing a fresh random orthonormal Z (sign-fixed QR of a new
Gaussian) every call, as a port that confused the memory's initialisation with its retraction would. Every
state is on the manifold and W E = I holds exactly, so the interface checks pass; what the optimizer
learnt about Z is thrown away at each step. Caught by `retraction`."""
import torch

from ._base import LLtPIT, qr_sign


class RerandomisePIT(LLtPIT):
    def __init__(self, vocab_size, hidden_size, *, dtype, device, seed):
        super().__init__(vocab_size, hidden_size, dtype=dtype, device=device, seed=seed)
        self._draws = torch.Generator().manual_seed(seed + 1)

    @torch.no_grad()
    def post_step(self):
        fresh = qr_sign(torch.randn(self.V, self.D, generator=self._draws, dtype=torch.float64))
        self.Z.copy_(fresh.to(self.Z.device, self.Z.dtype))


def make(vocab_size, hidden_size, *, dtype, device, seed):
    return RerandomisePIT(vocab_size, hidden_size, dtype=dtype, device=device, seed=seed)
