"""Broken: each rank orthonormalises its own slice (a single-process retraction on the local rows), so
every slice has Z_r^T Z_r = I and the full Z has Z^T Z = n I: ||Z^T Z - I||_F = sqrt(D) (n - 1).
Caught by the sharded orthonormality (and shard_distance)."""
import torch

from pitcheck.numerics.arrays import TorchOps
from pitcheck.model.nn_sharded import ShardedPIT
from pitcheck.model.retractions import get_retraction


class LocalRetractionPIT(ShardedPIT):
    @torch.no_grad()
    def post_step(self):
        self.Z.copy_(get_retraction("qr")(self.Z, torch.zeros_like(self.Z), TorchOps()))


def make(vocab_size, hidden_size, *, dtype=None, device="cpu", seed=0, rank, world_size):
    return LocalRetractionPIT(vocab_size, hidden_size, rank=rank, world_size=world_size,
                              dtype=dtype or torch.float32, device=device, seed=seed)
