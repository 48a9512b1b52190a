"""Correct: the L L^T module with the identity as its initial memory (torch.nn.init.eye_ on the V x D
memory: Z = [I_D; 0]) and T = I, so at initialisation E = Z and W = Z^T hold only 0 and 1, exact in every
format. It computes in the dtype asked for; `contract` must not take those values for narrow arithmetic."""
import torch

from ._base import LLtPIT


class EyeMemoryPIT(LLtPIT):
    def init_memory(self, V, D, gen):
        return torch.nn.init.eye_(torch.empty(V, D, dtype=torch.float64))


def make(vocab_size, hidden_size, *, dtype, device, seed):
    return EyeMemoryPIT(vocab_size, hidden_size, dtype=dtype, device=device, seed=seed)
