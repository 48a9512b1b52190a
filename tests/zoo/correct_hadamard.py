"""Correct: the L L^T module with a scaled Hadamard memory, Z = H[:, :D] / sqrt(P) on the first P rows
(P the largest power of 4 <= V, so the entries are +-2^-k, exact in every format; the other rows are zero)
and T = I at initialisation, so E = Z and W = Z^T are exact float32 (even bfloat16) values at the start
though the module computes in the dtype asked for. `contract` must judge the arithmetic, not these."""
import torch

from ._base import LLtPIT


def sylvester(n):
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


class HadamardPIT(LLtPIT):
    def init_memory(self, V, D, gen):
        p = 4 ** ((V.bit_length() - 1) // 2)  # largest power of 4 <= V
        while p < D:  # only for V < 4 D: entries 2^-k/2, still orthonormal
            p *= 2
        z = torch.zeros(V, D, dtype=torch.float64)
        z[:p] = sylvester(p)[:, :D] / p ** 0.5
        return z


def make(vocab_size, hidden_size, *, dtype, device, seed):
    return HadamardPIT(vocab_size, hidden_size, dtype=dtype, device=device, seed=seed)
