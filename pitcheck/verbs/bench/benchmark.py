"""Cost of keeping Z on the manifold, as ratios to the GEMM floor measured in the same run: the library
of `pitcheck bench`. `bench()` times, writes the outputs asked for and returns the results document.

torch is imported where cases are built, not here: the CLI imports this module while building its parser,
before it imports torch with Ctrl-C held (pitcheck.cli.common.import_torch_holding_ctrl_c).
"""
from __future__ import annotations

import json
import math
import os
import platform
import random
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from ...numerics.arrays import TorchOps
from ...infra.errors import PitcheckError
from ...model.gradients import AdversaryParams, check_stream
from ...infra.plotting import pyplot, save_figure
from ...numerics.reference import random_memory
from ...model.retractions import APPROXIMATE, RETRACTIONS, in_table_order, tangent_projection
from .runcost import (AMORTISED_STEPS, RunTimer, StackTimer, amortised_ms, cell_seconds, cost_class, cost_classes,
                      records_per_step)
from ...infra.rundir import check_distinct_outputs, check_out_file, check_out_path, write_atomic
from ...infra.threads import available_cores, pin_threads, policy_threads
from ...trajectory import RunConfig, available_memory, check_memory, initial_state, make_engine, recorded_steps
from ...trajectory.config import check_argument, check_device, check_device_present, is_int

QUICK_SHAPES = [(2048, 32), (16384, 64), (8192, 128), (65536, 32)]
FULL_SHAPES = [(v, d) for v in (4096, 16384, 65536) for d in (32, 64, 128)]
# the V x V peers run up to this V (their cost grows like V^3; above it they are reported, not run)
VV_LIMIT = {"quick": 2048, "full": 8192}
STEP_RETRACTIONS = ("qr", "cholqr2", "cayley", "polar-gram", "rcqr", "cholqr3-shifted")
# the whole run step (runcost.py) is also timed at V x D = 2048 x 64, the shape the stacked step's speed is judged at
RUN_STEP_SHAPE = (2048, 64)
RUN_STEP_RETRACTION = "qr"
TARGETS = [  # the ceilings bench is judged against: (what, shape or None for every shape timed, ceiling in GEMM units)
    ("cholqr2", (8192, 128), 3.5),
    ("cayley", (8192, 128), 5.0),
    ("qr", (8192, 128), 4.0),
    ("polar-gram", (8192, 128), 2.5),
    ("step:qr", (65536, 32), 15.0),
    ("metrics", (65536, 32), 40.0),
    ("run step:qr", RUN_STEP_SHAPE, 30.0),
]


@dataclass
class Case:
    """Something to time at one shape: fn() does one unit of work (a retraction, a step, a record)."""
    name: str
    # gemm, floor (another library's GEMM), retraction, peer, step, metrics, run, record (amortised: runstep), and
    # a record's two parts: measure (the metrics row) and commit (the checkpoint and files written)
    kind: str
    fn: object
    vocab: int
    dim: int
    precision: str = "fp32"
    peer: str | None = None
    approximate: bool = False
    note: str = ""
    times: list = field(default_factory=list)
    reps: int = 1


def _cpu_seconds() -> float:
    return time.process_time()


def device_clock(device: str):
    """What a case's time is on `device`: the process's CPU time on the CPU (the least disturbed by other jobs on
    shared cores); on CUDA, wall time between two synchronisations (the GPU's work is no CPU time of this process)."""
    if not device.startswith("cuda"):
        return _cpu_seconds
    import torch  # loaded already: a CUDA bench built its tensors with it

    def wall() -> float:
        torch.cuda.synchronize(device)
        return time.perf_counter()

    return wall


def _calibrate(fn, target_s: float, clock) -> int:
    t0 = clock()
    fn()
    t = clock() - t0
    return max(1, min(50, int(math.ceil(target_s / max(t, 1e-6)))))


def time_interleaved(cases: list[Case], rounds: int, target_s: float = 0.02, seed: int = 0, clock=None) -> None:
    """Each round times every case once (reps calls; CPU time, or `clock`), in a shuffled order; keeps all samples.
    The minimum over rounds is the estimate: the least disturbed by other jobs on shared cores."""
    clock = clock or _cpu_seconds
    for c in cases:
        c.reps = _calibrate(c.fn, target_s, clock)  # also the warm-up
    order = list(cases)
    rng = random.Random(seed)
    for _ in range(rounds):
        rng.shuffle(order)
        for c in order:
            t0 = clock()
            for _ in range(c.reps):
                c.fn()
            c.times.append((clock() - t0) / c.reps)


def _tall_point(V: int, D: int, dtype, seed: int = 0, device: str = "cpu"):
    import torch

    rng = np.random.default_rng(seed)
    Z = random_memory(V, D, rng)
    xi = tangent_projection(Z, rng.standard_normal((V, D)))
    xi *= 1e-2 * math.sqrt(D) / np.linalg.norm(xi)
    return (torch.from_numpy(Z).to(device=device, dtype=dtype).contiguous(),
            torch.from_numpy(xi).to(device=device, dtype=dtype).contiguous())


def _vv_bytes(V: int, itemsize: int = 4) -> int:
    return V * V * itemsize


def peer_cases(V: int, D: int, Z, xi, mode: str) -> tuple[list[Case], list[dict]]:
    """The peers that fit; and a note for each that was not run (not installed, or V x V too large)."""
    import torch
    from torch.nn.utils.parametrizations import orthogonal

    cases, notes = [], []

    # torch's own orthogonal parametrisation, Householder map, no trivialisation: tall-friendly
    lin = torch.nn.Linear(D, V, bias=False)
    with torch.no_grad():
        lin.weight.copy_(Z + xi)
    orthogonal(lin, orthogonal_map="householder", use_trivialization=False)

    def householder():
        with torch.no_grad():
            return lin.weight

    cases.append(Case("torch householder", "peer", householder, V, D, peer="torch.nn.utils.parametrizations."
                      "orthogonal(householder, use_trivialization=False)"))
    try:
        import geoopt
    except ImportError:
        notes.append({"peer": "geoopt", "vocab": V, "dim": D, "status": "not installed (pip install pitcheck[bench])"})
    else:
        es = geoopt.EuclideanStiefel()
        cases.append(Case("geoopt QR", "peer", lambda: es.retr(Z, xi), V, D, peer="geoopt.EuclideanStiefel.retr"))
        cs = geoopt.CanonicalStiefel()
        if V <= VV_LIMIT[mode] and _vv_bytes(V) * 6 < (available_memory() or 0):
            cases.append(Case("geoopt Cayley", "peer", lambda: cs.retr(Z, xi), V, D,
                              peer="geoopt.CanonicalStiefel.retr", note="forms V x V"))
        else:
            notes.append({"peer": "geoopt Cayley", "vocab": V, "dim": D, "status": _vv_status(V, mode)})
    try:
        import geotorch
    except ImportError:
        notes.append({"peer": "geotorch", "vocab": V, "dim": D, "status": "not installed (pip install pitcheck[bench])"})
    else:
        if V <= VV_LIMIT[mode] and _vv_bytes(V) * 8 < (available_memory() or 0):
            glin = torch.nn.Linear(D, V, bias=False)
            geotorch.orthogonal(glin, "weight")

            def geo():
                with torch.no_grad():
                    return glin.weight

            cases.append(Case("geotorch", "peer", geo, V, D, peer="geotorch.orthogonal (Stiefel, pads to SO(V))",
                              note="forms V x V"))
        else:
            notes.append({"peer": "geotorch", "vocab": V, "dim": D, "status": _vv_status(V, mode)})
    try:  # NVIDIA's Newton-Schulz coefficient sets: no adapter until it installs beside torch here
        import emerging_optimizers  # noqa: F401
    except ImportError:
        why = ("its releases require Python >= 3.12 (pip: 'Ignored the following versions that require a different "
               "python version: 0.3.0 Requires-Python >=3.12')" if sys.version_info < (3, 12)
               else "not installed (pip install emerging-optimizers)")
        notes.append({"peer": "emerging-optimizers", "vocab": V, "dim": D, "status": f"not run: {why}"})
    else:
        notes.append({"peer": "emerging-optimizers", "vocab": V, "dim": D,
                      "status": "not run: installed, but pitcheck has no adapter for it yet"})
    return cases, notes


def _vv_status(V: int, mode: str) -> str:
    need = _vv_bytes(V) * 6
    have = available_memory() or 0
    if need >= have:
        return f"does not fit (V x V work space ~{need / 2**30:.3g} GiB, {have / 2**30:.3g} GiB available)"
    return f"not run: forms a V x V matrix ({_vv_bytes(V) / 2**30:.3g} GiB), over the {mode} limit V <= {VV_LIMIT[mode]}"


def retraction_cases(V: int, D: int, Z, xi, names) -> list[Case]:
    ops = TorchOps()
    return [Case(n, "retraction", (lambda f=RETRACTIONS[n]: f(Z, xi, ops)), V, D, approximate=n in APPROXIMATE)
            for n in names]


def step_cases(V: int, D: int, retractions, precisions=("fp32",), device: str = "cpu",
               gradient_stream: str = "numpy") -> list[Case]:
    """A full engine step (gradients in the engine's stream, optimizer, retraction), and one metrics
    record, on a torch engine on `device` without the float64 shadow, drawing from `gradient_stream`."""
    cases = []
    for prec in precisions:
        for r in retractions:
            cfg = RunConfig(backend="torch", precision=prec, retraction=r, vocab=V, dim=D, device=device, shadow=False,
                            gradient_stream=gradient_stream)
            plan = cfg.resolve()
            eng = make_engine(plan, "torch", plan.policy, device)
            eng.initialise(*initial_state(plan))
            names, params, counter = list(plan.adversaries), AdversaryParams(), [0]

            def one_step(eng=eng, names=names, params=params, counter=counter, seed=cfg.seed):
                grads = eng.gradients(names, seed, counter[0], params, None)
                eng.step(grads, counter[0])
                counter[0] += 1

            cases.append(Case(f"step:{r}", "step", one_step, V, D, precision=prec))
            if r == retractions[0]:
                cases.append(Case("metrics", "metrics", eng.interface, V, D, precision=prec))
    return cases


def run_cases(V: int, D: int, device: str = "cpu", gradient_stream: str = "numpy") -> tuple[list[Case], list[RunTimer]]:
    """A whole run step (gradients, model, float64 shadow) and a record (metrics row and checkpoint
    commit) of an fp32 qr run on the torch backend on `device`, built as `pitcheck run` builds it; and the
    record's two parts apart: the metrics row, and the commit written through (not left to the commit thread)."""
    config = RunConfig(backend="torch", precision="fp32", retraction=RUN_STEP_RETRACTION, vocab=V, dim=D,
                       device=device, steps=AMORTISED_STEPS, gradient_stream=gradient_stream)
    timer = RunTimer.build(config)
    return [Case(f"run:{RUN_STEP_RETRACTION}", "run", timer.step, V, D),
            Case("run record", "record", timer.record, V, D),
            Case("run metrics row", "measure", timer.measure, V, D),
            Case("run commit", "commit", timer.commit, V, D)], [timer]


def run_step_rows(results: list[dict], V: int, D: int) -> list[dict]:
    """The amortised row of a shape's run step and record: step + records_per_step x record, in GEMM units."""
    step = next((r for r in results if r["kind"] == "run" and (r["vocab"], r["dim"]) == (V, D)), None)
    record = next((r for r in results if r["kind"] == "record" and (r["vocab"], r["dim"]) == (V, D)), None)
    if not (step and record):
        return []
    ms = amortised_ms(step["ms"], record["ms"])
    return [{**step, "retraction": f"run step:{RUN_STEP_RETRACTION}", "kind": "runstep", "ms": round(ms, 4),
             "ratio": round(ms / step["gemm_ms"], 3), "spread": None,
             "amortised": {"steps": AMORTISED_STEPS, "records_per_step": round(records_per_step(), 6),
                           "step_ms": step["ms"], "record_ms": record["ms"]}}]


def significant(value: float, digits: int = 4) -> float:
    """value to `digits` significant figures: a fixed number of decimals loses a small grid's cost
    (0.38 s for 15.6 s of cells) while printing noise digits for the default grid's thousands."""
    return float(f"{value:.{digits}g}")


def grid_rate(rounds: int = 3, echo=None, grid=None, batch: int = 1, device: str = "cpu") -> dict:
    """The default compare grid's cells per second of one core: each cost class (a cell less its seed)
    built as a run, its whole step and its record timed (CPU time, minimum of `rounds`), the grid's cells
    costed at their steps and records. A pool of n workers on n free cores does about n times this.
    grid: a loaded sweep Grid (None: the default grid). batch > 1: also as compare batches it ("batched").
    device (a GPU's): also the torch cells on that device ("on_device", device_grid_rate)."""
    from ..compare import load_grid
    from ..compare.grid import configs

    grid = grid or load_grid()
    classes = cost_classes(config for _, config in configs(grid))
    total, rows = 0.0, []
    for configs_of_class in classes.values():
        timer = RunTimer.build(configs_of_class[0])
        try:
            step = Case("run", "run", timer.step, timer.config.vocab, timer.config.dim)
            record = Case("record", "record", timer.record, timer.config.vocab, timer.config.dim)
            time_interleaved([step, record], rounds)
        finally:
            timer.close()
        seconds = cell_seconds(min(step.times) * 1e3, min(record.times) * 1e3, grid.steps, grid.records_per_decade)
        total += seconds * len(configs_of_class)
        first = configs_of_class[0]
        rows.append({"precision": first.precision, "retraction": first.retraction, "adversary": first.adversary,
                     "optimizer": first.optimizer, "vocab": first.vocab, "dim": first.dim, "cells": len(configs_of_class),
                     "seconds_per_cell": significant(seconds)})
        if echo:
            echo(f"grid: {configs_of_class[0].precision} {configs_of_class[0].retraction} "
                 f"{configs_of_class[0].adversary}: {seconds:.2f} s a cell")
    cells = sum(len(c) for c in classes.values())
    cores = available_cores()
    out = {"grid": grid.description, "cells": cells, "cost_classes": len(classes), "steps": grid.steps,
           "cell_seconds": significant(total), "cells_per_second": significant(cells / total), "cores": cores,
           "wall_estimate_s": significant(total / cores), "classes": rows}
    if batch > 1:
        out["batched"] = batched_grid_rate(grid, classes, rows, batch, rounds, echo)
    if device != "cpu":
        out["on_device"] = device_grid_rate(grid, classes, rows, device, rounds, echo)
    return out


def device_grid_rate(grid, classes: dict, class_rows: list[dict], device: str, rounds: int, echo=None) -> dict:
    """The grid's torch cells on one `device`: each torch cost class built as a run there, its whole step and
    record timed (on the device's clock, minimum of `rounds`), beside the same class's CPU cost from grid_rate
    (class_rows) in this process. The cells run one after another on the one device, where compare's CPU pool
    runs one per core; the numpy cells stay on the CPU. `faster` says which placement finishes the torch cells
    first: one device, or the pool's cores."""
    cpu_seconds = dict(zip(classes, (r["seconds_per_cell"] for r in class_rows)))
    clock = device_clock(device)
    device_total = cpu_total = 0.0
    cells, rows = 0, []
    for key, configs_of_class in classes.items():
        first = configs_of_class[0]
        if first.backend != "torch":
            continue
        timer = RunTimer.build(replace(first, device=device))
        try:
            step = Case("run", "run", timer.step, first.vocab, first.dim)
            record = Case("record", "record", timer.record, first.vocab, first.dim)
            time_interleaved([step, record], rounds, clock=clock)
        finally:
            timer.close()
        seconds = cell_seconds(min(step.times) * 1e3, min(record.times) * 1e3, grid.steps, grid.records_per_decade)
        n = len(configs_of_class)
        cells += n
        device_total += n * seconds
        cpu_total += n * cpu_seconds[key]
        rows.append({"precision": first.precision, "retraction": first.retraction, "adversary": first.adversary,
                     "vocab": first.vocab, "dim": first.dim, "cells": n, "device_seconds_per_cell": significant(seconds),
                     "cpu_seconds_per_cell": cpu_seconds[key]})
        if echo:
            echo(f"grid on {device}: {first.precision} {first.retraction} {first.adversary}: {seconds:.2f} s a cell "
                 f"(CPU {cpu_seconds[key]:.2f} s)")
    cores = available_cores()
    return {"device": device, "cells": cells, "device_cell_seconds": significant(device_total),
            "cpu_cell_seconds": significant(cpu_total), "cores": cores, "cpu_pool_wall_s": significant(cpu_total / cores),
            "faster": faster_placement(device, device_total, cpu_total, cores), "classes": rows}


def faster_placement(device: str, device_seconds: float, cpu_seconds: float, cores: int) -> str:
    """Where a set of cells finishes first: on one `device`, one after another (device_seconds in all), or on a
    pool of `cores` CPU workers (cpu_seconds of one core's time in all); the CPU on a tie or with no cells."""
    return device if 0 < device_seconds < cpu_seconds / cores else "cpu"


def batched_grid_rate(grid, classes: dict, class_rows: list[dict], batch: int, rounds: int, echo=None) -> dict:
    """The same grid as `pitcheck compare --batch N` hands it out (sweep.batch_tasks): each batch built as
    one stack of its cells and its stack step and record timed (CPU time, minimum of `rounds`); cells that
    run alone cost what their class costs unbatched."""
    from ..compare import batch_tasks
    from ..compare.grid import configs

    alone_seconds = dict(zip(classes, (r["seconds_per_cell"] for r in class_rows)))
    tasks = [{"config": config.to_json()} for _, config in configs(grid)]
    total, rows = 0.0, []
    for task in batch_tasks(tasks, batch):
        if "cells" not in task:
            total += alone_seconds[cost_class(RunConfig.from_json(task["config"]))]
            continue
        stack_configs = [RunConfig.from_json(c["config"]) for c in task["cells"]]
        timer = StackTimer.build(stack_configs)
        try:
            step = Case("stack", "run", timer.step, stack_configs[0].vocab, stack_configs[0].dim)
            record = Case("stack record", "record", timer.record, stack_configs[0].vocab, stack_configs[0].dim)
            time_interleaved([step, record], rounds)
        finally:
            timer.close()
        seconds = cell_seconds(min(step.times) * 1e3, min(record.times) * 1e3, grid.steps, grid.records_per_decade)
        total += seconds
        rows.append({"precision": stack_configs[0].precision, "retraction": stack_configs[0].retraction,
                     "vocab": stack_configs[0].vocab, "dim": stack_configs[0].dim, "cells": len(stack_configs),
                     "seconds_per_cell": significant(seconds / len(stack_configs))})
        if echo:
            echo(f"grid, batched: {stack_configs[0].precision} {stack_configs[0].retraction} x {len(stack_configs)}: "
                 f"{seconds / len(stack_configs):.2f} s a cell")
    cores = available_cores()
    return {"batch": batch, "batches": len(rows), "cells_batched": sum(r["cells"] for r in rows),
            "cell_seconds": significant(total), "cells_per_second": significant(len(tasks) / total),
            "wall_estimate_s": significant(total / cores), "stacks": rows}


def machine(device: str = "cpu") -> dict:
    import torch

    out = {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
           "cpus": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
           "numpy": np.__version__, "threads": policy_threads(), "clock": "process CPU time",
           "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}
    if device.startswith("cuda"):
        out.update(device=device, gpu=torch.cuda.get_device_name(device), clock="wall time between CUDA synchronisations")
    return out


def fit_scaling(results: list[dict]) -> dict:
    """Least-squares exponents (a, b) of ms ~ V^a D^b per retraction, over the shapes timed."""
    out = {}
    names = sorted({r["retraction"] for r in results if r["kind"] in ("retraction", "gemm")})
    for n in names:
        pts = [(math.log(r["vocab"]), math.log(r["dim"]), math.log(r["ms"])) for r in results
               if r["retraction"] == n and r["kind"] in ("retraction", "gemm") and r["ms"] > 0]
        if len(pts) < 3 or len({p[0] for p in pts}) < 2 or len({p[1] for p in pts}) < 2:
            continue
        A = np.array([[1.0, p[0], p[1]] for p in pts])
        coef = np.linalg.lstsq(A, np.array([p[2] for p in pts]), rcond=None)[0]
        out[n] = {"V": round(float(coef[1]), 2), "D": round(float(coef[2]), 2), "shapes": len(pts)}
    return out


def tracking_fraction(results: list[dict], steps_list=(300, 2000)) -> list[dict]:
    """Share of a run spent in metric records on the default recording schedule, from the timed step and
    record costs at each shape (checkpoint writes not included)."""
    out = []
    for r in results:
        if r["kind"] != "metrics":
            continue
        step = next((s for s in results if s["kind"] == "step" and s["vocab"] == r["vocab"]
                     and s["dim"] == r["dim"] and s["precision"] == r["precision"]), None)
        if not step:
            continue
        for steps in steps_list:
            n = len(recorded_steps(steps, RunConfig.records_per_decade))
            total = steps * step["ms"] + n * r["ms"]
            out.append({"vocab": r["vocab"], "dim": r["dim"], "precision": r["precision"], "steps": steps,
                        "records": n, "fraction": round(n * r["ms"] / total, 4), "step_with": step["retraction"]})
    return out


def _shape_pair(shape) -> tuple[int, int]:
    """One (V, D) of bench's shapes: two ints with 1 <= D <= V (the CLI's VxD rule), else a one-line refusal."""
    check_argument("bench: each of shapes", shape, (tuple, list), "a (V, D) pair of ints")
    if len(shape) != 2 or not all(is_int(n) for n in shape):
        raise PitcheckError(f"bench: each of shapes must be a (V, D) pair of ints, got {shape!r}")
    V, D = (int(n) for n in shape)
    if not (V >= 2 and 1 <= D <= V):
        raise PitcheckError(f"bench: shape {V}x{D}: need 1 <= D <= V and V >= 2")
    return V, D


def bench_arguments(shapes, retractions, rounds, json_path, out) -> None:
    """bench()'s arguments of their types (a str would be iterated letter by letter), one line otherwise."""
    check_argument("bench: shapes", shapes, (list, tuple, type(None)), "a list of (V, D) pairs, e.g. [(8192, 128)]")
    check_argument("bench: retractions", retractions, (list, tuple, type(None)), "a list of retraction names")
    for name in retractions or ():
        check_argument("bench: each of retractions", name, (str,), "a retraction name (str)")
    check_argument("bench: rounds", rounds, (int, type(None)), "an int >= 1 or None")
    for name, value in (("json_path", json_path), ("out", out)):
        check_argument(f"bench: {name}", value, (str, os.PathLike, type(None)), "a path (str or pathlib.Path) or None")


def bench_device(device: str, grid: bool) -> str:
    """The device bench times on: cpu, cuda or cuda:N as given, auto as CUDA where torch sees one; a one-line
    refusal for another name or a CUDA device this machine lacks. --grid beside a GPU costs the grid's torch
    cells on it too (device_grid_rate)."""
    check_argument("bench: device", device, (str,), "cpu, cuda, cuda:N or auto")
    check_device(device, "torch")
    if device == "auto":
        import torch  # bench needs it anyway

        device = "cuda" if torch.cuda.is_available() else "cpu"
    check_device_present(device)
    return device


def bench_inputs(shapes, retractions, quick: bool = False) -> tuple[list, list[str]]:
    """The shapes and retractions to time (None: the defaults), refused before anything is timed when a
    list is empty, names something that is not a retraction, or repeats an entry (it would be timed twice
    and give two rows of one name)."""
    timed = [n for n in RETRACTIONS if n != "none"]  # 'none' leaves Z as it is: nothing to time
    if retractions is None:
        names = timed
    else:
        names = list(retractions)
        if not names:
            raise PitcheckError("--retractions is empty: name at least one of " + ", ".join(timed))
        for n in names:
            if n not in timed:
                what = ("'none' is the baseline without a retraction, not a retraction: nothing to time"
                        if n == "none" else f"unknown retraction {n!r}")
                raise PitcheckError(f"--retractions: {what}; choose from {', '.join(timed)}")
        if len(set(names)) < len(names):
            twice = next(n for n in names if names.count(n) > 1)
            raise PitcheckError(f"--retractions: {twice} given twice; name each retraction once")
    if shapes is None:
        shapes = QUICK_SHAPES if quick else FULL_SHAPES
    else:
        shapes = [_shape_pair(s) for s in shapes]
        if not shapes:
            raise PitcheckError("--shape: no shapes given")
        if len(set(shapes)) < len(shapes):
            V, D = next(s for s in shapes if shapes.count(s) > 1)
            raise PitcheckError(f"--shape {V}x{D} given twice; name each shape once")
    return shapes, names


def run_bench(shapes=None, quick: bool = False, rounds: int | None = None, retractions=None, peers: bool = True,
              steps: bool = True, echo=None, grid: bool = False, device: str = "cpu",
              gradient_stream: str = "numpy") -> dict:
    """Time every retraction, peer, full step and metrics record at each shape, against Z^T Z of the
    same shape and dtype timed in the same interleaved rounds on `device`. Returns the JSON document."""
    import torch

    on_gpu = device.startswith("cuda")
    clock = device_clock(device)
    mode = "quick" if quick else "full"
    shapes, names = bench_inputs(shapes, retractions, quick)
    rounds = rounds or (5 if quick else 9)
    pinned = pin_threads(policy_threads())  # one thread unless --threads chose more
    results, notes = [], []
    if on_gpu and peers:  # the peers' V x V forms and host-side set-up are a CPU comparison
        notes.append({"peer": "torch/geoopt/geotorch peers", "vocab": 0, "dim": 0, "status": f"not run on {device}"})
    # the run step's own shape, when the shapes asked for do not include it: the GEMM and the run step only
    extra = [RUN_STEP_SHAPE] if steps and RUN_STEP_SHAPE not in shapes else []
    for V, D in [*shapes, *extra]:
        check_memory(V, D, "the benchmark")
        Z, xi = _tall_point(V, D, torch.float32, device=device)
        # the unit is torch's GEMM (what the retractions call); on the CPU numpy's BLAS doing the same product
        # is timed beside it, for where the unit itself is not the machine's fastest GEMM
        cases = [Case("gemm", "gemm", lambda Z=Z: Z.T @ Z, V, D)]
        if not on_gpu:
            Zn = Z.numpy()
            cases.append(Case(NUMPY_GEMM, "floor", lambda Zn=Zn: Zn.T @ Zn, V, D))
        timers = []
        if (V, D) not in extra:
            cases += retraction_cases(V, D, Z, xi, names)
            if peers and not on_gpu:
                pc, pn = peer_cases(V, D, Z, xi, mode)
                cases += pc
                notes += pn
            if steps:
                cases += step_cases(V, D, [r for r in STEP_RETRACTIONS if r in names] or names[:1], device=device,
                                    gradient_stream=gradient_stream)
        if steps:
            run, timers = run_cases(V, D, device, gradient_stream)
            cases += run
        try:
            time_interleaved(cases, rounds, clock=clock)
        finally:
            for timer in timers:
                timer.close()
        gemm = {c.precision: min(c.times) for c in cases if c.kind == "gemm"}
        g = gemm["fp32"]
        for c in cases:
            ms = min(c.times) * 1e3
            results.append({"retraction": c.name, "kind": c.kind, "precision": c.precision, "vocab": V, "dim": D,
                            "ms": significant(ms), "gemm_ms": significant(g * 1e3), "ratio": round(ms / (g * 1e3), 3),
                            "peer": c.peer, "approximate": c.approximate, "rounds": len(c.times), "reps": c.reps,
                            "spread": round(max(c.times) / min(c.times), 2) if min(c.times) > 0 else None})
        results += run_step_rows(results, V, D)
        if echo:
            echo(V, D, [r for r in results if r["vocab"] == V and r["dim"] == D])
    doc = {"machine": {**machine(device), "pinned": pinned}, "mode": mode, "rounds": rounds, "results": results,
           "not_run": notes, "gradient_stream": gradient_stream}
    doc["scaling"] = fit_scaling(results)
    doc["tracking"] = tracking_fraction(results)
    doc["targets"] = check_targets(results, doc["tracking"])
    if grid:
        from ..compare import DEFAULT_BATCH

        doc["grid"] = grid_rate(echo=(lambda line: print(line, file=sys.stderr, flush=True)) if echo else None,
                                batch=DEFAULT_BATCH, device=device)
    return doc


def check_targets(results: list[dict], tracking: list[dict]) -> list[dict]:
    out = []
    tall = sorted({(r["vocab"], r["dim"]) for r in results})
    for what, shape, limit in TARGETS:
        for V, D in ([shape] if shape else tall):
            r = next((x for x in results if x["retraction"] == what and (x["vocab"], x["dim"]) == (V, D)), None)
            if r is None:
                continue
            out.append({"target": f"{what} <= {limit:g}", "vocab": V, "dim": D, "ratio": r["ratio"],
                        "reached": r["ratio"] <= limit})
    for V, D in tall:
        qr = next((x for x in results if x["retraction"] == "qr" and (x["vocab"], x["dim"]) == (V, D)), None)
        peers = [x for x in results if x["kind"] == "peer" and (x["vocab"], x["dim"]) == (V, D)]
        if qr and peers:
            best = min(peers, key=lambda x: x["ratio"])
            out.append({"target": "qr <= fastest peer", "vocab": V, "dim": D, "ratio": qr["ratio"],
                        "peer": best["retraction"], "peer_ratio": best["ratio"], "reached": qr["ratio"] <= best["ratio"]})
    for t in tracking:
        if t["steps"] == 2000:
            out.append({"target": "metric tracking <= 10% of a run", "vocab": t["vocab"], "dim": t["dim"],
                        "ratio": t["fraction"], "reached": t["fraction"] <= 0.10})
    return out


# ---------------------------------------------------------------- output

NUMPY_GEMM = "numpy Z^T Z"

# the retraction columns come in the registry's table order (retractions.in_table_order); the peers' order:
PEER_ORDER = ["torch householder", "geoopt QR", "geoopt Cayley", "geotorch"]


def table(doc: dict) -> str:
    """Markdown: one row per shape, ratios to the GEMM floor; peers and steps after the retractions."""
    res = doc["results"]
    shapes = sorted({(r["vocab"], r["dim"]) for r in res}, key=lambda s: (s[1], s[0]))
    timed = {r["retraction"] for r in res if r["kind"] == "retraction"}
    names = in_table_order(timed)
    names += sorted(timed - set(names))  # a name the registry does not know (an older bench.json) goes last
    peers = sorted({r["retraction"] for r in res if r["kind"] == "peer"},
                   key=lambda n: PEER_ORDER.index(n) if n in PEER_ORDER else 9)
    steps = sorted({r["retraction"] for r in res if r["kind"] in ("step", "metrics", "runstep", "measure", "commit")},
                   key=lambda n: (n == "metrics", n.startswith("run"), n))
    floors = sorted({r["retraction"] for r in res if r["kind"] == "floor"})
    cols = floors + names + peers + steps
    label = {n: (f"{n} (approx.)" if any(r["retraction"] == n and r.get("approximate") for r in res) else n)
             for n in cols}
    label.update({n: f"full {n}" for n in steps if n.startswith("step:")})
    label["metrics"] = "metrics record"
    label.update({n: f"whole run {n[4:]} (amortised)" for n in steps if n.startswith("run step:")})
    lines = ["| V x D (fp32) | GEMM ms | " + " | ".join(label[c] for c in cols) + " |",
             "|---|---|" + "---|" * len(cols)]
    notes = {(n["vocab"], n["dim"], n["peer"]): n["status"] for n in doc.get("not_run", [])}
    for V, D in shapes:
        row = {r["retraction"]: r for r in res if (r["vocab"], r["dim"]) == (V, D)}
        cells = []
        for c in cols:
            if c in row:
                cells.append(f"{row[c]['ratio']:.3g}")
            else:
                st = notes.get((V, D, c), "")
                cells.append("does not fit" if st.startswith("does not fit") else ("not run" if st else "-"))
        gemm = next(r["gemm_ms"] for r in res if (r["vocab"], r["dim"]) == (V, D))
        lines.append(f"| {V} x {D} | {gemm:.3g} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _threads_text(m: dict) -> str:
    n = m.get("threads", 1)
    return "one thread" if n == 1 else f"{n} threads (CPU time: the threads' sum)"


def report(doc: dict) -> str:
    m = doc["machine"]
    out = [f"# pitcheck bench ({doc['mode']})", "",
           (f"{m['gpu']} ({m['device']}), " if m.get("gpu") else "") +
           f"{m['processor']}, {m['cpus']} CPUs, torch {m['torch']}, numpy {m['numpy']}, {_threads_text(m)} "
           f"({', '.join(m.get('pinned', []))} pinned), {m['clock']}, minimum of {doc['rounds']} interleaved rounds; "
           f"load average at the end {m.get('load_average')}." +
           (f" The steps drew their gradients from the counter stream on {m.get('device', 'the CPU')} "
            "(`--gradient-stream counter`)."
            if doc.get("gradient_stream", "numpy") != "numpy" and any(r["kind"] in ("step", "run")
                                                                      for r in doc["results"]) else ""), "",
           "Ratios to the Z^T Z GEMM of the same shape and dtype (torch's, which the retractions call), timed in "
           f"the same rounds. `{NUMPY_GEMM}`: numpy's BLAS doing the same product on the same memory; below 1, "
           "this machine has a faster GEMM than the unit.", "", table(doc), ""]
    if doc.get("not_run"):
        out += ["Not run:", ""] + [f"- {n['peer']} at {n['vocab']} x {n['dim']}: {n['status']}" for n in doc["not_run"]] + [""]
    if doc.get("scaling"):
        out += ["Fitted scaling ms ~ V^a D^b (expected a = 1, b = 2 for O(V D^2)):", "",
                "| | a (V) | b (D) |", "|---|---|---|"]
        out += [f"| {n} | {s['V']} | {s['D']} |" for n, s in doc["scaling"].items()] + [""]
    if doc.get("tracking"):
        out += ["Metric tracking as a share of a run on the default schedule (records_per_decade = 10; checkpoint "
                "writes not included):", "", "| V x D | steps | records | share |", "|---|---|---|---|"]
        out += [f"| {t['vocab']} x {t['dim']} | {t['steps']} | {t['records']} | {100 * t['fraction']:.1f}% |"
                for t in doc["tracking"]] + [""]
    runs = [r for r in doc["results"] if r["kind"] == "runstep"]
    if runs:
        a = runs[0]["amortised"]
        out += [f"Whole run step: gradients, the fp32 model's step and its float64 shadow's, plus a record (metrics "
                f"row and checkpoint commit, CPU time: fsync waits not counted) x {a['records_per_step']:.4g} per "
                f"step, the default schedule over {a['steps']} steps:", "",
                "| V x D | step ms | record ms | amortised ms | GEMM units |", "|---|---|---|---|---|"]
        out += [f"| {r['vocab']} x {r['dim']} | {r['amortised']['step_ms']:.3g} | {r['amortised']['record_ms']:.3g} | "
                f"{r['ms']:.3g} | {r['ratio']:.3g} |" for r in runs] + [""]
    if doc.get("grid"):
        g = doc["grid"]
        out += [f"Default grid ({g['cells']} cells of {g['steps']} steps, {g['cost_classes']} cost classes timed): "
                f"{g['cell_seconds']:.4g} s of cell time, {g['cells_per_second']:.3g} cells per second of one "
                f"core; about {g['wall_estimate_s']:.4g} s of wall on this machine's {g['cores']} cores, every cell "
                "alone.", ""]
        if g.get("batched"):
            b = g["batched"]
            out += [f"As `pitcheck compare` hands it out (--batch {b['batch']}): {b['cells_batched']} cells in "
                    f"{b['batches']} batches, each stack's step and record timed as one; {b['cell_seconds']:.4g} s of "
                    f"cell time, {b['cells_per_second']:.3g} cells per second of one core; about "
                    f"{b['wall_estimate_s']:.4g} s of wall on {g['cores']} cores.", ""]
        if g.get("on_device"):
            d = g["on_device"]
            out += [f"Its {d['cells']} torch cells on {d['device']}, one after another: {d['device_cell_seconds']:.4g} s, "
                    f"against {d['cpu_cell_seconds']:.4g} s of one core's time, {d['cpu_pool_wall_s']:.4g} s of wall on "
                    f"{d['cores']} cores, every cell alone: faster on {d['faster']}.", ""]
    if doc.get("targets"):
        out += ["Targets:", "", "| target | V x D | measured | reached |", "|---|---|---|---|"]
        for t in doc["targets"]:
            extra = f" (fastest peer {t['peer']} {t['peer_ratio']:.3g})" if "peer" in t else ""
            out.append(f"| {t['target']} | {t['vocab']} x {t['dim']} | {t['ratio']:.3g}{extra} | "
                       f"{'yes' if t['reached'] else 'no'} |")
        out.append("")
    return "\n".join(out)


def plot(doc: dict, path: Path) -> Path:
    """Left: time against V D^2 (an O(V D^2) method is a line of slope 1); right: ratio to the GEMM
    floor at each shape. Retractions solid, peers dashed, the floor thick."""
    plt = pyplot()
    res = [r for r in doc["results"] if r["kind"] in ("retraction", "gemm", "peer")]
    shapes = sorted({(r["vocab"], r["dim"]) for r in res}, key=lambda s: s[0] * s[1] ** 2)
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.6))
    names = sorted({r["retraction"] for r in res} - {"gemm"})
    colours = plt.get_cmap("tab20")
    for i, n in enumerate(["gemm"] + names):
        pts = sorted((r["vocab"] * r["dim"] ** 2, r["ms"], shapes.index((r["vocab"], r["dim"])), r["ratio"], r["kind"])
                     for r in res if r["retraction"] == n)
        if n == "gemm":
            style = dict(lw=2.5, color="k")
        else:  # one colour per method (tab20 has 20), peers dashed with square markers
            peer = pts[0][4] == "peer"
            style = dict(lw=1, color=colours(i - 1), ls="--" if peer else "-", marker="s" if peer else "o")
        # shapes with the same V D^2 (16384 x 64 and 65536 x 32) share an x: points only, no zigzag
        ax.loglog([p[0] for p in pts], [p[1] for p in pts], ls="none" if n != "gemm" else "-",
                  **{k: v for k, v in style.items() if k != "ls"}, **({"marker": "o"} if n == "gemm" else {}),
                  label="Z^T Z GEMM (the floor)" if n == "gemm" else None)
        if n != "gemm":
            bx.semilogy([p[2] for p in pts], [p[3] for p in pts], label=n, **style)
    ax.legend(fontsize=7, loc="upper left")
    ax.set_xlabel("V D^2")
    ax.set_ylabel("ms (CPU time, one thread, min of rounds)")
    bx.set_xticks(range(len(shapes)), [f"{v} x {d}" for v, d in shapes])
    bx.set_ylabel("x Z^T Z GEMM (same shape, same run)")
    for a_ in (ax, bx):
        a_.grid(True, which="both", alpha=0.3)
    bx.legend(fontsize=7, ncol=2, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle("cost of keeping Z on the manifold (fp32)", fontsize=10)
    fig.tight_layout()
    return save_figure(plt, fig, path)


# ---------------------------------------------------------------- the entry point

OUT_FILES = ("report.md", "bench.json", "bench.png")


def check_outputs(json_path, out) -> None:
    """json_path and the files of out, each writable and no two the same file, before anything is timed."""
    outputs = [("--json", json_path)]
    if out is not None:
        outputs += [("--out", out)] + [(f"--out's {name}", Path(out) / name) for name in OUT_FILES]
    check_distinct_outputs(outputs)
    if json_path is not None:
        check_out_file(json_path, "--json")
    if out is not None:
        out = check_out_path(out, "--out")
        if out.is_dir():
            for option, path in outputs[2:]:
                check_out_file(path, option)


def _echo_shape(V: int, D: int, rows: list[dict]) -> None:
    print(f"{V} x {D}: " + ", ".join(f"{r['retraction']} {r['ratio']:.3g}" for r in rows), file=sys.stderr, flush=True)


def bench(shapes=None, quick: bool = False, rounds: int | None = None, retractions=None, peers: bool = True,
          steps: bool = True, json_path: str | Path | None = None, out: str | Path | None = None,
          progress: bool = False, grid: bool = False, device: str = "cpu", gradient_stream: str = "numpy") -> dict:
    """Time each retraction, peer, full engine step and metrics record as a ratio to the Z^T Z GEMM of the
    same shape, timed in the same interleaved rounds on one pinned thread; return the results document.

    shapes: (V, D) pairs (None: QUICK_SHAPES with quick, else FULL_SHAPES); quick also means 5 rounds and
    V x V peers only up to V = 2048. rounds: interleaved rounds, the minimum taken (None: 5 quick, 9 full).
    retractions: names to time (None: every one but 'none'). peers: time torch/geoopt/geotorch's peers;
    steps: time full steps, metrics records and the whole run step (runcost.py; also at RUN_STEP_SHAPE);
    grid: also cost the default compare grid in cells per second (about a minute). json_path: write the document there; out: write
    report.md, bench.json and bench.png into that directory. progress: one line per shape on stderr.
    device: cpu, cuda or cuda:N (auto: CUDA where torch sees one): on CUDA every case runs on that device and is
    timed as wall time between synchronisations; the peers and numpy's GEMM are CPU comparisons, not run there.
    Bad input (an empty or repeated list, an unknown retraction, rounds < 1, outputs that cannot be
    written or name one file twice) raises PitcheckError before anything is timed.
    """
    bench_arguments(shapes, retractions, rounds, json_path, out)
    if rounds is not None and rounds < 1:
        raise PitcheckError(f"--rounds must be >= 1, got {rounds}")
    bench_inputs(shapes, retractions, quick)
    device = bench_device(device, grid)
    check_stream(gradient_stream, ["gaussian"])  # the steps' and the run's adversary
    check_outputs(json_path, out)
    doc = run_bench(shapes, quick=quick, rounds=rounds, retractions=retractions, peers=peers, steps=steps,
                    echo=_echo_shape if progress else None, grid=grid, device=device, gradient_stream=gradient_stream)
    payload = (json.dumps(doc, indent=2) + "\n").encode()
    if json_path:
        write_atomic(json_path, payload)
    if out:
        out = Path(out)
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise PitcheckError(f"cannot create {out}: {exc.strerror or exc}") from None
        write_atomic(out / "report.md", (report(doc) + "\n").encode())
        write_atomic(out / "bench.json", payload)
        plot(doc, out / "bench.png")
    return doc
