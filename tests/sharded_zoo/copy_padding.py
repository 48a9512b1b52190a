"""Broken: the vocabulary is padded to a multiple of 16 x ranks with copies of the last real rows (as one
public converter pads Megatron checkpoints), and the distributed retraction orthonormalises the stored
block, copies included: the real rows then satisfy Z^T Z = I - P^T P for the copies P. Harmless for a
tied table, not for PIT. Caught by the orthonormality of the real rows and by shard_distance."""
import torch

from pitcheck.model.nn_sharded import ShardedPIT

PAD_MULTIPLE = 16


class CopyPaddingPIT(ShardedPIT):
    def _padding_rows(self, count, full):
        return full[full.shape[0] - count:].clone()


def make(vocab_size, hidden_size, *, dtype=None, device="cpu", seed=0, rank, world_size):
    return CopyPaddingPIT(vocab_size, hidden_size, rank=rank, world_size=world_size, dtype=dtype or torch.float32,
                          device=device, seed=seed, pad_multiple=PAD_MULTIPLE)
