"""Broken: post_step retracts (sign-fixed QR) only every 100th call, a drift guard set too lazily; in
between, the optimizer's steps leave Z off the manifold. Caught by `retraction` (post_step leaves Z + t xi
where it was)."""
import torch

from ._base import LLtPIT, qr_sign


class LazyRetractionPIT(LLtPIT):
    every = 100

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = 0

    @torch.no_grad()
    def post_step(self):
        self.calls += 1
        if self.calls % self.every == 0:
            self.Z.copy_(qr_sign(self.Z))


def make(vocab_size, hidden_size, *, dtype, device, seed):
    return LazyRetractionPIT(vocab_size, hidden_size, dtype=dtype, device=device, seed=seed)
