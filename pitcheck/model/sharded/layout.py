"""Megatron's vocabulary layout: each rank owns one contiguous slice of rows of Z.

Without padding the slices are ceil(V / n) rows each and the last one is shorter (possibly empty when V is
tiny against n), as torch.chunk cuts. With `pad_multiple` m the vocabulary is rounded up to a multiple of
m * n (Megatron's make_vocab_size_divisible_by times the tensor-parallel size) and every rank gets the
same number of rows; the rows at index >= V are padding, which pitcheck fills with zeros: a zero row adds
exactly nothing to any Gram, so padding is invisible to every retraction and map.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...infra.errors import PitcheckError


def _positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PitcheckError(f"{name} must be a positive integer, got {value!r}")
    return value


@dataclass(frozen=True)
class ShardLayout:
    vocab_size: int  # V, the real rows
    world_size: int
    padded_size: int  # V rounded up to the padding multiple (V without padding)
    rows_per_rank: int  # every slice but the last has this many rows (stored rows, padding included)

    def slice(self, rank: int) -> tuple[int, int]:
        """(start, stop) of the rows rank stores, in padded coordinates (padding rows included)."""
        self._check_rank(rank)
        start = min(rank * self.rows_per_rank, self.padded_size)
        return start, min(start + self.rows_per_rank, self.padded_size)

    def vocab_range(self, rank: int) -> tuple[int, int]:
        """(start, stop) of the real vocabulary ids rank owns (padding excluded); empty as (V, V)."""
        start, stop = self.slice(rank)
        return min(start, self.vocab_size), min(stop, self.vocab_size)

    def local_rows(self, rank: int) -> int:
        start, stop = self.slice(rank)
        return stop - start

    def real_rows(self, rank: int) -> int:
        start, stop = self.vocab_range(rank)
        return stop - start

    def _check_rank(self, rank) -> None:
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.world_size:
            raise PitcheckError(f"rank must be an integer in [0, {self.world_size}), got {rank!r}")


def shard_layout(vocab_size: int, world_size: int, pad_multiple: int | None = None) -> ShardLayout:
    """The contiguous layout of V rows over n ranks, padded to a multiple of pad_multiple * n if given."""
    V, n = _positive_int(vocab_size, "vocab_size"), _positive_int(world_size, "world_size")
    if pad_multiple is None:
        return ShardLayout(V, n, V, -(-V // n))
    m = _positive_int(pad_multiple, "pad_multiple")
    padded = -(-V // (m * n)) * m * n
    return ShardLayout(V, n, padded, padded // n)


def scatter_rows(full, layout: ShardLayout, rank: int, padding=None):
    """Rank's stored block of a full V x D matrix: its real rows, then zero padding rows (or the rows of
    `padding`, a callable (count, full) -> rows, which the bug models use to pad with copies)."""
    start, stop = layout.slice(rank)
    real_start, real_stop = layout.vocab_range(rank)
    block = full[real_start:real_stop]
    extra = (stop - start) - (real_stop - real_start)
    if extra == 0:
        return block.clone() if hasattr(block, "clone") else block.copy()
    rows = padding(extra, full) if padding is not None else _zeros_like_rows(full, extra)
    return _cat([block, rows])


def _zeros_like_rows(full, count):
    if hasattr(full, "new_zeros"):
        return full.new_zeros((count,) + tuple(full.shape[1:]))
    import numpy as np

    return np.zeros((count,) + full.shape[1:], dtype=full.dtype)


def _cat(parts):
    if hasattr(parts[0], "new_zeros"):
        import torch

        return torch.cat(parts, 0)
    import numpy as np

    return np.concatenate(parts, 0)
