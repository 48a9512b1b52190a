"""Validating a vocabulary-parallel PIT: the harness every rank drives its module through.

The shard contract: for each rank of the default process group, `factory(vocab_size, hidden_size,
*, dtype, device, seed, rank, world_size)` returns the rank's module with `embed(ids)` (global ids -> the
full (..., D) embeddings on every rank), `logits(h)` (this rank's contiguous vocabulary slice, (..., V_r)),
`vocab_range()` -> (start, stop) of that slice, and optionally `post_step()`.

Every probe of probes.py runs unchanged on every rank through `ShardedHarness`: the same seeded inputs on
every rank, the head assembled to (..., V) by an all-gather (backward: the rank's own slice), and every
normalisation global (gradient norms and directions sum the row blocks over the ranks and count replicated
parameters once), so that a probe's loss is one function of the assembled maps and backward runs on every
rank. A per-rank normalisation would make a correct module's replicas drift.

The memory: the trainable (rows, D) parameter nearest orthonormal once its blocks are summed over the
ranks (sum_r Z_r^T Z_r = I); its first V_r = stop - start rows are taken to be the rank's real rows and
any further rows padding. Every other trainable parameter is replicated.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from ...model.nn_sharded import gather_logits
from ...model.sharded.comm import all_reduce_sum, assemble_rows, rank_and_size
from .probes import Harness, MemoryAccess, TargetFault, to_numpy


class ShardedHarness(Harness):
    """Harness for one rank's module: the maps assembled, norms and inner products global."""

    def __init__(self, module, vocab: int, dim: int, dtype, device: str, seed: int):
        self.rank, self.world_size = rank_and_size()
        start, stop = (int(x) for x in module.vocab_range())
        self.range = (start, stop)
        super().__init__(module, vocab, dim, dtype, device, seed)
        self._agree_on_parameters()
        self.memory = self._find_memory()
        self.sharded = {id(self.memory[1])} if self.memory else set()

    @property
    def real_rows(self) -> int:
        return self.range[1] - self.range[0]

    # ---- the maps ----------------------------------------------------------------------------------
    def logits(self, h):
        return gather_logits(self.module.logits(h))

    # ---- global sums ---------------------------------------------------------------------------------
    def _global(self, sharded: float, replicated: float) -> float:
        """sharded summed over the ranks, plus replicated counted once (rank 0's: the same on every rank)."""
        parts = torch.tensor([sharded, replicated if self.rank == 0 else 0.0], dtype=torch.float64,
                             device=self.device)
        return float(all_reduce_sum(parts).sum())

    def _split_sum(self, params, values) -> float:
        sharded = sum(v for p, v in zip(params, values) if id(p) in self.sharded)
        return self._global(sharded, sum(v for p, v in zip(params, values) if id(p) not in self.sharded))

    def squared_norm(self, params, tensors) -> float:
        return self._split_sum(params, [float(t.detach().double().pow(2).sum()) for t in tensors])

    def dot(self, params, a, b) -> float:
        return self._split_sum(params, [float((x.to(torch.float64) * y.to(x.device, torch.float64)).sum())
                                        for x, y in zip(a, b)])

    def random_direction(self, params, generator) -> list:
        """As Harness's, with global norms: a row block draws from a stream of its own rank (its shape is the
        rank's), a replicated parameter from the shared stream (the same direction on every rank)."""
        own = torch.Generator().manual_seed(int(torch.randint(0, 2**62, (1,), generator=generator)) + self.rank)
        out = []
        for p in params:
            d = torch.randn(p.shape, generator=own if id(p) in self.sharded else generator, dtype=torch.float64)
            d_norm = self._split_sum([p], [float(d.pow(2).sum())]) ** 0.5
            p_norm = self._split_sum([p], [float(p.detach().double().pow(2).sum())]) ** 0.5
            out.append(d / max(d_norm, 1e-300) * max(p_norm, 1.0) * 1e-1)
        return out

    # ---- which parameter is what -----------------------------------------------------------------------
    def _agree_on_parameters(self) -> None:
        """Every rank must hold parameters of the same names (the probes' collectives go parameter by
        parameter); a rank that does not is named."""
        names = [n for n, _ in self.module.named_parameters()]
        every = [None] * self.world_size
        dist.all_gather_object(every, names)
        for rank, theirs in enumerate(every):
            if theirs != every[0]:
                raise TargetFault(f"rank {rank}'s module has parameters {theirs}, rank 0's {every[0]}: the ranks "
                                  "must hold the same parameters (replicated, or row blocks of the same tensors)")

    def _find_memory(self):
        """(name, tensor) of the memory's row block on this rank, or None (see the module docstring)."""
        named = list(self.module.named_parameters())
        local = [float(p.requires_grad and p.is_floating_point() and p.dim() == 2 and p.shape[1] == self.dim
                       and p.shape[0] >= self.real_rows and (self.world_size > 1 or p.shape[0] == self.vocab))
                 for _, p in named]
        agreed = all_reduce_sum(torch.tensor(local, dtype=torch.float64, device=self.device)) if named else []
        best = None
        for (name, p), votes in zip(named, agreed):
            if int(votes) != self.world_size:
                continue
            with torch.no_grad():
                z = p.detach().to(torch.float64)
                gram = all_reduce_sum(z.T @ z)
                off = float(torch.linalg.matrix_norm(gram - torch.eye(self.dim, dtype=torch.float64,
                                                                       device=gram.device), 2))
            if best is None or not off >= best[0]:
                best = (off, name, p)
        return None if best is None else best[1:]

    def replicated_parameters(self) -> list:
        """(name, parameter) of every trainable parameter but the memory."""
        return [(n, p) for n, p in self.module.named_parameters() if p.requires_grad and id(p) not in self.sharded]

    def t_side_parameters(self) -> list:
        return [p for _, p in self.replicated_parameters() if p.numel() < self.vocab * self.dim]

    def retraction_start(self, memory) -> None:
        """The assembled memory replaced by its nearest orthonormal matrix (the polar factor, float64 SVD;
        anchors too). A sharding bug leaves the blocks off the manifold after the own steps (Z^T Z = n I),
        where the maps no longer show the stored tensor as their memory and the judging could only call
        the retraction inconclusive; from a point of the manifold, post_step itself is judged."""
        anchors = memory.anchors()
        U, _, Vt = np.linalg.svd(memory.read(), full_matrices=False)
        memory.write(U @ Vt, *anchors)

    def memory_access(self):
        return None if self.memory is None else ShardedMemoryAccess(self, *self.memory)

    def padding(self):
        """This rank's padding rows of the memory (rows past its real ones), or None without a memory."""
        return None if self.memory is None else self.memory[1][self.real_rows:]


class ShardedMemoryAccess(MemoryAccess):
    """The assembled real rows of the memory (V x D on every rank); a write sets each rank's real rows and
    leaves its padding rows as they are."""

    def __init__(self, harness: ShardedHarness, name: str, tensor):
        super().__init__(harness, name, tensor, False)

    def read(self) -> np.ndarray:
        return to_numpy(assemble_rows(self.tensor[:self.harness.real_rows]))

    def write(self, z: np.ndarray, *also) -> None:
        start, stop = self.harness.range
        rows = torch.from_numpy(np.ascontiguousarray(z[start:stop]))
        with torch.no_grad():
            for x in (self.tensor, *also):
                x[:stop - start].copy_(rows.to(x.device, x.dtype))
