"""Reference vocabulary-parallel PIT: `ShardedPIT` and the factory `make_sharded`.

Each rank holds its contiguous slice of Z's rows (Megatron's layout, pitcheck.model.sharded.shard_layout: the
last slice may be shorter; with `pad_multiple` every slice is equal and the rows past V are zero padding,
invisible to the maps). T = L L^T is replicated: L_raw's gradient is summed over the ranks by a hook
(each rank's backward yields only its slice's share of it), so every replica takes the same step.

- embed(ids): global ids -> (..., D) on every rank. Ids outside the rank's slice are masked to zero rows,
  the two triangular solves run on the rank's rows, and the partial embeddings are all-reduced (forward
  all-reduce, backward identity, as Megatron's VocabParallelEmbedding). Exactly one rank contributes a
  non-zero row per id, so the sum is exact: the same bits as the unsharded module.
- logits(h): this rank's slice (..., V_r) = ((h L) L^T) Z_r^T. h enters through a copy (forward identity,
  backward all-reduce, Megatron's copy_to_tensor_model_parallel_region) so h's gradient is the full one.
  `gather_logits` assembles (..., V) for a loss computed on every rank (backward: the rank's own slice).
- post_step(): a distributed retraction (pitcheck.model.sharded) of the sharded Z, default cholqr2.

The training contract: the loss is one global function of the assembled maps, computed identically on
every rank (the same inputs everywhere, any normalisation global), and backward runs on every rank.
The same seed gives the same full Z as pitcheck.nn.make: every rank draws the full V x D Gaussian and
factors it in float64 on the CPU (O(V D) memory per rank at construction), then keeps its slice.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

from ..numerics.arrays import TorchOps
from .nn import HALF, PROJECTIVE, checked_ids, lower_factor, memory_as_used
from .retractions import get_retraction
from .sharded.comm import all_reduce_sum, allreduce_dtype as _check_allreduce_dtype, rank_and_size
from .sharded.layout import ShardLayout, scatter_rows, shard_layout
from .sharded.retractions import get_sharded_retraction, tangent_projection

# projective in the sharded registry too: polar (TSQR + SVD of R) maps any full-rank point to the manifold
SHARDED_PROJECTIVE = tuple(PROJECTIVE)


class _ReduceFromRanks(torch.autograd.Function):
    """Forward: sum over the ranks. Backward: identity (the loss, and so its gradient, is replicated)."""

    @staticmethod
    def forward(ctx, x, group):
        return all_reduce_sum(x, group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _CopyToRanks(torch.autograd.Function):
    """Forward: identity. Backward: sum over the ranks (each rank's gradient is its slice's share)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return all_reduce_sum(grad.contiguous(), ctx.group), None


class _GatherVocab(torch.autograd.Function):
    """Forward: the ranks' (..., V_r) slices concatenated to (..., V). Backward: this rank's slice of the
    gradient (the loss is replicated, so no sum: Megatron's gather_from_tensor_model_parallel_region)."""

    @staticmethod
    def forward(ctx, x, group):
        _, size = rank_and_size(group)
        if size == 1:
            ctx.bounds = (0, x.shape[-1])
            return x.clone()
        rank, _ = rank_and_size(group)
        widths = [torch.zeros(1, dtype=torch.int64, device=x.device) for _ in range(size)]
        dist.all_gather(widths, torch.tensor([x.shape[-1]], dtype=torch.int64, device=x.device), group=group)
        widths = [int(w.item()) for w in widths]
        most = max(widths)
        padded = x.new_zeros(x.shape[:-1] + (most,))
        padded[..., :x.shape[-1]] = x
        parts = [torch.empty_like(padded) for _ in range(size)]
        dist.all_gather(parts, padded.contiguous(), group=group)
        start = sum(widths[:rank])
        ctx.bounds = (start, start + widths[rank])
        return torch.cat([p[..., :w] for p, w in zip(parts, widths)], -1)

    @staticmethod
    def backward(ctx, grad):
        start, stop = ctx.bounds
        return grad[..., start:stop].contiguous(), None


def gather_logits(logits_slice: torch.Tensor, group=None) -> torch.Tensor:
    """Every rank's logits slice assembled to (..., V), differentiable (backward: the own slice)."""
    return _GatherVocab.apply(logits_slice, group)


class ShardedPIT(torch.nn.Module):
    """One rank's part of a vocabulary-parallel PIT (see the module docstring)."""

    def __init__(self, vocab_size: int, hidden_size: int, *, rank: int, world_size: int, dtype=torch.float32,
                 device="cpu", seed: int = 0, retraction: str = "cholqr2", min_diag: float = 1e-6,
                 pad_multiple: int | None = None, group=None, allreduce_dtype=None, sync_grad_hook: bool = True):
        super().__init__()
        if not (isinstance(vocab_size, int) and isinstance(hidden_size, int)) or hidden_size < 1:
            raise ValueError(f"vocab_size and hidden_size must be positive ints, got {vocab_size}, {hidden_size}")
        if vocab_size < hidden_size:
            raise ValueError(f"vocab_size={vocab_size} < hidden_size={hidden_size}: Z cannot have orthonormal columns")
        if dtype not in (torch.float64, torch.float32) + HALF:
            raise ValueError(f"unsupported dtype {dtype}")
        if not min_diag > 0:
            raise ValueError(f"min_diag must be positive, got {min_diag}")
        group_rank, group_size = rank_and_size(group)
        if (rank, world_size) != (group_rank, group_size):
            raise ValueError(f"rank={rank}, world_size={world_size} do not match the process group "
                             f"(rank {group_rank} of {group_size})")
        self._retract = get_sharded_retraction(retraction)  # unknown names fail here, not at the first step
        self.allreduce_dtype = _check_allreduce_dtype(allreduce_dtype)
        self.vocab_size, self.hidden_size, self.dtype = vocab_size, hidden_size, dtype
        self.rank, self.world_size, self.group = rank, world_size, group
        self.compute_dtype = torch.float32 if dtype in HALF else dtype
        self.retraction, self.min_diag = retraction, float(min_diag)
        self.layout = self._make_layout(vocab_size, world_size, pad_multiple)

        # the single-process module's Z for this seed (pitcheck.nn.PIT draws it this way), then the slice
        gen = torch.Generator().manual_seed(seed)
        g = torch.randn(vocab_size, hidden_size, generator=gen, dtype=torch.float64)
        full = get_retraction("qr")(g, torch.zeros_like(g), TorchOps())
        block = scatter_rows(full, self.layout, rank, padding=self._padding_rows)
        self.Z = torch.nn.Parameter(block.to(device=device, dtype=self.compute_dtype))
        r = math.log(math.expm1(1.0 - self.min_diag)) if self.min_diag < 1 else 0.0
        self.L_raw = torch.nn.Parameter(torch.eye(hidden_size, dtype=self.compute_dtype, device=device) * r)
        if retraction not in SHARDED_PROJECTIVE:
            self.register_buffer("Z_prev", self.Z.detach().clone())
        if sync_grad_hook and world_size > 1:
            # the leaf's hook sees this backward's whole gradient once, before accumulation: summing it
            # here stays right under gradient accumulation (an all-reduce of .grad would count twice)
            self.L_raw.register_hook(lambda grad: all_reduce_sum(grad, self.group))

    # ---- pieces the bug models in tests/sharded_zoo override -----------------------------------------
    def _make_layout(self, vocab_size: int, world_size: int, pad_multiple) -> ShardLayout:
        return shard_layout(vocab_size, world_size, pad_multiple)

    _padding_rows = None  # zero padding (a callable (count, full) -> rows replaces it)

    # ---- the shard contract ------------------------------------------------------------------------------
    def vocab_range(self) -> tuple[int, int]:
        """(start, stop) of the vocabulary ids whose rows this rank holds."""
        return self.layout.vocab_range(self.rank)

    @property
    def L(self) -> torch.Tensor:
        return lower_factor(self.L_raw, self.min_diag)

    def _memory(self, z: torch.Tensor) -> torch.Tensor:
        return memory_as_used(z, self.dtype, self.compute_dtype)

    def _check_ids(self, ids) -> torch.Tensor:
        # global ids: the whole vocabulary is valid on every rank
        return checked_ids(ids, self.vocab_size, self.Z.device)

    def embed(self, ids) -> torch.Tensor:
        """Rows e_v = T^{-1} z_v for global ids of any shape (...): (..., D) on every rank."""
        ids = self._check_ids(ids)
        flat = ids.reshape(-1)
        start, stop = self.vocab_range()
        mine = (flat >= start) & (flat < stop)
        if stop > start:
            local = torch.where(mine, flat - start, torch.zeros_like(flat))
            rows = torch.where(mine[:, None], self._memory(self.Z[local]), 0.0)
        else:  # a rank with no vocabulary rows (a tiny V over many ranks) adds zeros
            rows = self.Z.new_zeros((flat.numel(), self.hidden_size))
        L = self.L
        y = torch.linalg.solve_triangular(L, rows.T, upper=False)  # L y = z
        e = torch.linalg.solve_triangular(L.T, y, upper=True).T  # L^T e = y
        e = _ReduceFromRanks.apply(e.contiguous(), self.group) if self.world_size > 1 else e
        return e.reshape(*ids.shape, self.hidden_size).to(self.dtype)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """This rank's slice ((h L) L^T) Z_r^T of shape (..., V_r), V_r = stop - start of vocab_range()."""
        if h.shape[-1] != self.hidden_size:
            raise ValueError(f"hidden states must have last dimension {self.hidden_size}, got shape {tuple(h.shape)}")
        hc = h.to(self.compute_dtype)
        if self.world_size > 1:
            hc = _CopyToRanks.apply(hc, self.group)
        start, stop = self.vocab_range()
        L = self.L
        return (((hc @ L) @ L.T) @ self._memory(self.Z[:stop - start]).T).to(self.dtype)

    def sync_grads(self) -> None:
        """Sum L_raw's gradient over the ranks; only for a module built with sync_grad_hook=False (the hook
        does it during backward otherwise)."""
        if self.L_raw.grad is not None and self.world_size > 1:
            self.L_raw.grad.copy_(all_reduce_sum(self.L_raw.grad, self.group))

    @torch.no_grad()
    def post_step(self) -> None:
        """Put the sharded Z back on the manifold with the distributed retraction named at construction."""
        Z = self.Z
        kwargs = {"group": self.group, "allreduce_dtype": self.allreduce_dtype}
        if self.retraction in SHARDED_PROJECTIVE:
            new = self._retract(Z, torch.zeros_like(Z), **kwargs)
        else:
            base = self.Z_prev
            new = self._retract(base, tangent_projection(base, Z - base, **kwargs), **kwargs)
            self.Z_prev.copy_(new)
        Z.copy_(new)

    def extra_repr(self) -> str:
        return (f"vocab_size={self.vocab_size}, hidden_size={self.hidden_size}, rank={self.rank}, "
                f"world_size={self.world_size}, vocab_range={self.vocab_range()}, dtype={self.dtype}, "
                f"retraction={self.retraction!r}")


def make_sharded(vocab_size: int, hidden_size: int, *, dtype=None, device="cpu", seed: int = 0, rank: int,
                 world_size: int, retraction: str = "cholqr2", min_diag: float = 1e-6,
                 pad_multiple: int | None = None, allreduce_dtype=None) -> ShardedPIT:
    """Factory with the shard contract's signature (dtype None is float32, as pitcheck.nn.make's default),
    for the rank of the default process group (a single process needs none: rank=0, world_size=1)."""
    return ShardedPIT(vocab_size, hidden_size, rank=rank, world_size=world_size,
                      dtype=torch.float32 if dtype is None else dtype, device=device, seed=seed,
                      retraction=retraction, min_diag=min_diag, pad_multiple=pad_multiple,
                      allreduce_dtype=allreduce_dtype)
