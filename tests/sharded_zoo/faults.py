"""Ranks that fail: the reference module, except that on the last rank post_step raises, hangs (as a rank
stuck outside a collective its peers wait in) or ends the process. The validator must name that rank within
its time limit and leave no process behind."""
import os
import time

import torch

from pitcheck.model.nn_sharded import ShardedPIT


class FaultyPIT(ShardedPIT):
    fault = ""

    def post_step(self):
        if self.rank == self.world_size - 1:
            if self.fault == "raise":
                raise ValueError("planted failure in post_step")
            if self.fault == "hang":
                time.sleep(3600)
            if self.fault == "die":
                os._exit(7)
        super().post_step()


def _make(fault):
    def make(vocab_size, hidden_size, *, dtype=None, device="cpu", seed=0, rank, world_size):
        module = FaultyPIT(vocab_size, hidden_size, rank=rank, world_size=world_size, dtype=dtype or torch.float32,
                           device=device, seed=seed)
        module.fault = fault
        return module
    return make


make_raising, make_hanging, make_dying = _make("raise"), _make("hang"), _make("die")
