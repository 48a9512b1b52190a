"""Broken: embed serves rows from a cached embedding table E = Z T^{-1} that post_step rebuilds only every
5th call (to amortise the O(V D^2) rebuild); gradients reach the parameters straight-through from the
exact rows, so training and `gradients` look right. Between refreshes the embedding lags the head by up
to 4 optimizer steps. Exact at initialisation. Caught by `trajectory` (the table is not in the state_dict
either, so `checkpoint` may fail too)."""
import torch

from ._base import LLtPIT


class StaleCachePIT(LLtPIT):
    refresh_every = 5

    def __init__(self, vocab_size, hidden_size, *, dtype, device, seed):
        super().__init__(vocab_size, hidden_size, dtype=dtype, device=device, seed=seed)
        self._steps = 0
        self._table = self._build()

    @torch.no_grad()
    def _build(self):
        return self.solve(self.factor(), self.memory().T).T

    def embed(self, ids):
        ids = self.check_ids(ids)
        flat = ids.reshape(-1)
        e = self._table[flat]
        if torch.is_grad_enabled():
            exact = self.solve(self.factor(), self.memory()[flat].T).T
            e = e + (exact - exact.detach())  # straight-through: cached values, exact gradients
        return e.reshape(*ids.shape, self.D).to(self.dtype)

    @torch.no_grad()
    def post_step(self):
        super().post_step()
        self._steps += 1
        if self._steps % self.refresh_every == 0:
            self._table = self._build()


def make(vocab_size, hidden_size, *, dtype, device, seed):
    return StaleCachePIT(vocab_size, hidden_size, dtype=dtype, device=device, seed=seed)
