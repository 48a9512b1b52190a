"""Broken: Z is trained freely and never re-orthonormalised (the paper's v1 froze Z; this port made it
trainable and kept no retraction). Exact at initialisation; ||Z^T Z - I|| and so ||W E - I|| grow with the
steps. Caught by `trajectory`."""
from ._base import LLtPIT


class NoRetractionPIT(LLtPIT):
    def post_step(self):
        pass  # nothing keeps Z on the manifold


def make(vocab_size, hidden_size, *, dtype, device, seed):
    return NoRetractionPIT(vocab_size, hidden_size, dtype=dtype, device=device, seed=seed)
