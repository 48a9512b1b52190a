"""The random draws of stacked gradients, kept for the next batch of the same process.

A cell's draws at a step are a function of its seed, the step, the stream index, the gradient model, V x D
and the model's parameters alone: `default_rng([seed, step, index])` and the model's fixed sequence of
calls on it. The default grid's 56 batches share three seeds and two adversaries, so each worker draws
the same numbers for every batch it runs: building the generators and drawing was about a tenth of a
stack step at 128 x 8. Kept here, later batches look them up instead. The arrays are the ones drawn,
made read-only, so the gradients built from them are the same bytes (tests/model/test_draw_memo.py).

A process keeps at most DRAW_MEMO_BYTES (512 MiB) of draws: the default grid's three seeds at 10^4 steps
need 381 MiB per worker (13312 bytes a seed and step: Gaussian 128 x 8 and 8 x 8, the LM mix's 32 x 8
twice and 32 ids twice); draws beyond that are made and not kept.
"""
from __future__ import annotations

import numpy as np

DRAW_MEMO_BYTES = 1 << 29


class DrawMemo:
    """Draws by key (model, seed, step, index, V, D, params), up to `budget` bytes; nothing is evicted."""

    def __init__(self, budget: int = DRAW_MEMO_BYTES):
        self.budget = budget
        self.kept: dict[tuple, tuple] = {}
        self.nbytes = 0

    def get(self, key: tuple) -> tuple | None:
        return self.kept.get(key)

    def put(self, key: tuple, draws: tuple) -> None:
        size = sum(np.asarray(a).nbytes for a in draws)
        if self.nbytes + size > self.budget:
            return
        for a in draws:
            if isinstance(a, np.ndarray):
                a.flags.writeable = False  # a later batch reads these very arrays
        self.kept[key] = draws
        self.nbytes += size


MEMO = DrawMemo()
