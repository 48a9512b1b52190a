"""A sweep's cells: one run directory each under DIR/cells/, named by its config; running (or resuming)
one in a worker and timing its step; telling a finished one from one still to compute."""
from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...infra.errors import PitcheckError
from ...model.heads import StateBreakdown
from ...infra.rundir import read_events, read_manifest, read_metrics, write_atomic
from ...trajectory import GPU_MIN_ELEMENTS, RunBreakdown, RunConfig, initial_state, make_engine, run
from ...trajectory.plan import head_named
from .grid import Grid, adversary_label, configs

COST_STEPS, COST_WARMUP = 20, 3


@dataclass(frozen=True)
class Cell:
    name: str
    config: RunConfig
    group: tuple  # the summary row this cell belongs to (every axis but the seed; shards last)


def cell_name(config) -> str:
    """The axes in words, then 8 hex digits of the whole config but its length and device."""
    d = config.to_json()
    for k in ("steps", "device"):
        d.pop(k)
    digest = hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:8]
    retraction = config.retraction if head_named(config.head).has_retraction else "none"
    shards = f"-shards{config.shards}" if config.shards > 1 else ""  # an unsharded cell keeps its old name
    return (f"{config.precision}-{retraction}-{adversary_label(config.adversary)}-{config.head}-"
            f"{config.vocab}x{config.dim}{shards}-{config.optimizer}-lr{config.lr:g}-seed{config.seed}-{digest}")



def cells(grid: Grid) -> list[Cell]:
    """Every cell of the grid, in axis order; baseline heads (no retraction) appear once per precision."""
    out, seen = [], set()
    for a, config in configs(grid):
        name = cell_name(config)
        if name in seen:
            continue
        seen.add(name)
        group = (a["retraction"] if head_named(a["head"]).has_retraction else "-", a["precision"], a["adversary"], a["optimizer"],
                 a["lr"], a["head"], config.vocab, config.dim, a["shards"])
        out.append(Cell(name, config, group))
    return out


def cell_dir(out: Path, cell: Cell) -> Path:
    return out / "cells" / cell.name


def cost_path(out: Path, cell: Cell) -> Path:
    return out / "costs" / f"{cell.name}.json"


def finished(out: Path, cell: Cell) -> bool:
    """True when the cell's directory holds this very run to its last step (or to its breakdown) and its
    cost was measured: nothing to compute. Anything else is left to the run, which resumes or refuses."""
    d = cell_dir(out, cell)
    if not (d / "manifest.json").is_file() or not cost_path(out, cell).is_file():
        return False
    if (d / "commit.json.tmp").exists() or any(d.glob("*.staged")):
        return False  # a cut commit: the run's store finishes or discards it
    try:
        theirs = read_manifest(d / "manifest.json")["config"]
        mine = cell.config.to_json()
        if any(theirs.get(k) != v for k, v in mine.items() if k != "device"):
            return False
        rows = read_metrics(d / "metrics.csv")
        events = read_events(d / "events.jsonl")
    except PitcheckError:
        return False
    if not rows:
        return False
    return rows[-1]["step"] == cell.config.steps or bool(events and events[-1]["event"] == "breakdown")



def time_steps(config, steps: int = COST_STEPS, warmup: int = COST_WARMUP) -> float:
    """Milliseconds per optimizer step of this cell's model alone (retraction included; no shadow, no
    metrics, gradients drawn beforehand): the median over `steps` timed steps after `warmup`, or over those
    taken before the model broke down (NaN when none were). NaN for a sharded cell: its ranks share this
    machine's cores, so their step time says nothing of a cluster's."""
    if config.shards > 1:
        return float("nan")
    plan = config.resolve()
    engine = make_engine(plan, config.backend, plan.policy, plan.device)
    engine.initialise(*initial_state(plan))
    names = list(plan.adversaries)
    grads = [engine.gradients([n for n in names if n != "adaptive"] or ["gaussian"], config.seed, k,
                              config.adversary_params) for k in range(steps + warmup)]
    times = []
    sync = None
    if engine.backend == "torch" and engine.device.startswith("cuda"):
        import torch  # loaded already by the torch backend's engine; only CUDA cells get here

        sync = torch.cuda.synchronize
    for k, g in enumerate(grads):
        t0 = time.perf_counter()
        try:
            engine.step(g, k)
        except StateBreakdown:
            # the model broke down as its run did (a study that provokes breakdowns): the steps timed before
            # it are its cost, NaN when there were none; the breakdown is its run's result, not an error
            break
        if sync:
            sync()
        if k >= warmup:
            times.append(time.perf_counter() - t0)
    return float(np.median(times) * 1e3) if times else float("nan")


def run_cell(task: dict) -> dict:
    """Run (or resume) one cell and time its step; never raises for the cell's own failures."""
    config = RunConfig.from_json(task["config"])
    result = {"name": task["name"], "status": "done", "error": None, "seconds": 0.0}
    t0 = time.perf_counter()
    error = None
    try:
        # a cell not yet begun has no directory: it starts; one that has, resumes
        run(config, task["dir"], resume=not task["force"] and Path(task["dir"]).exists(), progress=False,
            force=task["force"])
    except PitcheckError as exc:
        error = exc
    record_cost(task, config, result, error, time.perf_counter() - t0)
    result["seconds"] = time.perf_counter() - t0
    return result


def record_cost(task: dict, config, result: dict, error: PitcheckError | None, seconds: float) -> None:
    """The cell's status from how its run ended (a breakdown is a result, any other error is not) and, unless
    it could not run, its step timed and written to its cost file with the run's `seconds`."""
    try:
        if isinstance(error, RunBreakdown):
            result["status"] = "breakdown"
        elif error is not None:
            raise error
        ms = time_steps(config)
        cost = {"ms_per_step": ms, "run_seconds": seconds, "pid": os.getpid(), "host": platform.node()}
        write_atomic(task["cost"], (json.dumps(cost, indent=1) + "\n").encode())
    except PitcheckError as exc:
        result.update(status="error", error=str(exc))


def needs_gpu(task: dict, cluster_gpus: bool) -> bool:
    """A cell runs on CUDA when its device says cuda, or says auto on the torch backend where GPUs are and its Z
    is large enough to gain from one (trajectory.config.GPU_MIN_ELEMENTS)."""
    config = task["cells"][0].get("config", {}) if "cells" in task else task.get("config", {})
    device = str(config.get("device", "auto"))
    large = int(config.get("vocab", RunConfig.vocab)) * int(config.get("dim", RunConfig.dim)) >= GPU_MIN_ELEMENTS
    return device.startswith("cuda") or (device == "auto" and config.get("backend") == "torch" and cluster_gpus
                                         and large)
