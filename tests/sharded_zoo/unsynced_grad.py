"""Broken: the replicated T's gradient is not all-reduced. Each rank steps with its own slice's share of
the gradient, so the replicas of L drift apart after the first step. Caught by replica_spread."""
import torch

from pitcheck.model.nn_sharded import ShardedPIT


def make(vocab_size, hidden_size, *, dtype=None, device="cpu", seed=0, rank, world_size):
    return ShardedPIT(vocab_size, hidden_size, rank=rank, world_size=world_size, dtype=dtype or torch.float32,
                      device=device, seed=seed, sync_grad_hook=False)
