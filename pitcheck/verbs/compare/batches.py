"""A sweep's batches: cells of one grid that share shape, precision and retraction (differing in seed,
adversary, learning rate, ...) handed to a worker together and stepped as one stacked computation
(pitcheck.trajectory.batched), each still its own run directory under DIR/cells/.

Only where it pays: a batch holds at most `batch` cells, and only cells of at most BATCH_MAX_ELEMENTS
entries of Z (V x D): above that the stacked arithmetic, not the per-call overhead it saves, is the cost
(results/bench/BATCHED.md). A cell whose config has no stacked form (`stack_key` is None) is a task of its
own, as before; a cell that cannot join its batch at run time (trajectory/batched.py) runs alone inside it.
"""
from __future__ import annotations

import time
from pathlib import Path

from ...model.retractions import STACKED_RETRACTIONS
from ...infra.errors import PitcheckError
from ...trajectory import RunConfig, Trajectory
from ...trajectory.batched import run_batch
from .cells import record_cost, run_cell

# cells per batch unless --batch says otherwise, and the largest V x D batched: measured at fp32 qr, one
# thread, B = 6 (results/bench/BATCHED.md): 2.2x at 128 x 8, 1.7x at 512 x 16, 1.1x at 1024 x 16 and 0.91x
# at 2048 x 32 (bit-identical at every size; above this the stacked arithmetic, not the calls it saves, costs)
DEFAULT_BATCH = 8
BATCH_MAX_ELEMENTS = 8192


def check_batch(batch) -> int:
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise PitcheckError(f"--batch must be a positive integer (1: every cell alone), got {batch!r}")
    return batch


def stack_key(config: RunConfig) -> tuple | None:
    """What the cells of one batch must share (None: this cell has no stacked form: it runs alone)."""
    plan = config.resolve()
    alone = (config.head != "pit" or config.optimizer != "sgd" or plan.policy.placement
             or config.reproject_every or config.reproject_threshold or config.shards != 1
             or config.retraction not in STACKED_RETRACTIONS or plan.source
             or plan.adaptive or config.device.startswith("cuda") or config.gradient_stream != "numpy"
             or config.vocab * config.dim > BATCH_MAX_ELEMENTS)
    if alone:
        return None
    return (config.backend, config.precision, config.retraction, config.vocab, config.dim, config.device,
            config.shadow, config.steps, config.records_per_decade)


def batch_tasks(tasks: list[dict], batch: int) -> list[dict]:
    """The sweep's cell tasks regrouped: each batch of two or more cells one task {"cells": [...]}, in the
    order of its first cell; the rest as they were."""
    check_batch(batch)
    if batch == 1:
        return list(tasks)
    groups: dict = {}
    out: list = []
    for task in tasks:
        key = stack_key(RunConfig.from_json(task["config"]))
        if key is None:
            out.append(task)
            continue
        if key not in groups or len(groups[key]["cells"]) == batch:
            groups[key] = {"cells": []}
            out.append(groups[key])
        groups[key]["cells"].append(task)
    return [t["cells"][0] if "cells" in t and len(t["cells"]) == 1 else t for t in out]


def run_cell_batch(task: dict) -> list[dict]:
    """Run (or resume) a batch's cells together and time each one's step; a result per cell, as run_cell's.
    A cell's run_seconds is the batch's wall time shared equally among its cells."""
    t0 = time.perf_counter()
    results, runs = [], []
    for cell in task["cells"]:
        result = {"name": cell["name"], "status": "done", "error": None, "seconds": 0.0}
        results.append(result)
        try:
            config = RunConfig.from_json(cell["config"])
            resume = not cell["force"] and Path(cell["dir"]).exists()
            runs.append((cell, result, Trajectory(config, cell["dir"], resume=resume, progress=False,
                                                  force=cell["force"])))
        except PitcheckError as exc:
            result.update(status="error", error=str(exc))
    outcomes = run_batch([t for _, _, t in runs])
    share = (time.perf_counter() - t0) / max(1, len(task["cells"]))
    for (cell, result, trajectory), outcome in zip(runs, outcomes):
        t1 = time.perf_counter()
        record_cost(cell, trajectory.config, result, outcome.error, share)
        result["seconds"] = share + time.perf_counter() - t1
    return results


def run_task(task: dict) -> list[dict]:
    """A sweep's task on a worker: one cell, or a batch of cells stepped together; a result per cell."""
    return run_cell_batch(task) if "cells" in task else [run_cell(task)]
