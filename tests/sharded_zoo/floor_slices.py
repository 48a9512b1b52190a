"""Broken: uneven slices mishandled. Every rank takes V // n rows, so the last V mod n ids belong to no
rank: they embed to zero, have no logits, and the retraction orthonormalises the covered rows alone.
Caught by the orthonormality of the assembled rows (the missing rows' share of Z^T Z is gone) before a
retraction and by shard_distance after one; the slices do not tile 0..V."""
import torch

from pitcheck.model.nn_sharded import ShardedPIT
from pitcheck.model.sharded.layout import ShardLayout


class FloorSlicesPIT(ShardedPIT):
    def _make_layout(self, vocab_size, world_size, pad_multiple):
        rows = vocab_size // world_size
        return ShardLayout(vocab_size, world_size, rows * world_size, rows)


def make(vocab_size, hidden_size, *, dtype=None, device="cpu", seed=0, rank, world_size):
    return FloorSlicesPIT(vocab_size, hidden_size, rank=rank, world_size=world_size, dtype=dtype or torch.float32,
                          device=device, seed=seed)
