"""Sweeps: a grid of runs from a TOML file, one run directory per cell, a summary with growth rates,
storage floors and a verdict.

A grid file names the axes (every combination is a cell) and the options every cell shares:

    steps = 10000               # trajectory length of every cell
    records_per_decade = 10     # recorded steps per decade (the growth fit uses them)

    [axes]                      # each a list (a single value is a list of one)
    retraction = ["qr", "polar", "cayley"]
    precision = ["fp64", "fp32", "bf16"]
    adversary = ["gaussian", "dense_output+sparse_input"]   # '+' sums gradient models
    optimizer = ["sgd"]
    lr = [0.01]
    head = ["pit"]              # pit; the baselines tied/untied have no retraction (one cell each)
    shape = ["256x16"]          # vocab x dim
    seed = [0, 1, 2]            # cells that differ only in the seed form one summary row

    [fixed]                     # any other RunConfig field, e.g. cond = 10.0, device = "cuda"
    [fixed.adversary_params]    # e.g. input_scale = 4.0

Each cell is a run directory of `pitcheck run` under DIR/cells/, named by its config (the axes in
words, then a hash of the whole config but its length), so an interrupted sweep resumes where each
cell stopped, a finished sweep re-renders without computing anything, and one cell can be run alone with
`pitcheck run --resume --out DIR/cells/NAME` and the same options. fp64 cells run on the float64 numpy
reference, every other precision on the torch backend with a float64 shadow (unless fixed.backend says).

growth_exponent is the slope of log ||Z^T Z - I||_F against log step over the second half of the run on
the log-step axis the records are spaced on (steps sqrt(N)..N), fitted jointly over the seeds with one
intercept per seed; its uncertainty is the slope's standard error. About 0 is bounded error, 0.5 a
random walk, 1 linear growth. The floor is measured: an exactly orthonormal V x D Q (float64
Householder QR of a Gaussian) rounded to the format Z is stored in, ||Q^T Q - I||_F.
"""
from __future__ import annotations

import csv
import hashlib
import io
import itertools
import json
import math
import os
import platform
import sys
import time
import tomllib
from dataclasses import dataclass, field, fields, replace
from importlib import resources
from pathlib import Path

from .errors import PitcheckError

AXES = ("retraction", "precision", "adversary", "optimizer", "lr", "head", "shape", "seed")
GRID_KEYS = ("steps", "records_per_decade", "axes", "fixed", "description")
# RunConfig fields that are axes (or derived from one), so not allowed in [fixed]
AXIS_FIELDS = {"retraction", "precision", "adversary", "optimizer", "lr", "head", "vocab", "dim", "seed", "steps",
               "records_per_decade"}
# a row's key: what its cells share (they differ only in the seed)
KEY_COLUMNS = ["retraction", "precision", "adversary", "optimizer", "lr", "head", "vocab", "dim", "steps", "seeds"]
# summary.csv: computed values only, so the same grid gives the same bytes whichever executor ran it
SUMMARY_COLUMNS = KEY_COLUMNS + [
    "final_orthonormality", "final_orthonormality_min", "final_orthonormality_max", "max_orthonormality",
    "growth_exponent", "growth_exponent_err", "final_pinv_drift", "drift_bound", "max_cond_T", "shadow_Z",
    "floor", "error_over_floor", "events", "failed_retractions", "breakdowns", "breakdowns_T",
]
# cost.csv: measured times, which no rerun repeats (median over seeds; min and max beside it)
COST_COLUMNS = KEY_COLUMNS + ["ms_per_step", "ms_per_step_min", "ms_per_step_max", "hosts"]
# a breakdown of T (L's diagonal at 0: T singular) comes from the gradients and the learning rate, not from
# the retraction, which only moves Z
T_BREAKDOWN = ("L's diagonal", "T = L L^T")
# beyond this cond(T) the head's solves lose all of fp32's digits: T, not Z, is then the problem
UNSTABLE_COND_T = 1e8
# growth exponents below this are bounded error; at or above it the error grows without bound
BOUNDED_GROWTH = 0.25
# a retraction whose final error is within this factor of the best one's is as accurate; the cheapest wins
ACCURACY_TIE = 2.0
# more cells than this are refused unless --max-cells says otherwise: a grid typed by mistake (10^6 cells)
# would otherwise enumerate for minutes and start that many runs
MAX_CELLS = 10000
FLOOR_SAMPLES = 3
COST_STEPS, COST_WARMUP = 20, 3


# ---- the grid -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Grid:
    axes: dict
    steps: int
    records_per_decade: int = 10
    fixed: dict = field(default_factory=dict)
    description: str = ""
    source: str = ""

    def to_json(self) -> dict:
        return {"source": self.source, "description": self.description, "steps": self.steps,
                "records_per_decade": self.records_per_decade, "axes": self.axes, "fixed": self.fixed}


@dataclass(frozen=True)
class Cell:
    name: str
    config: object  # RunConfig
    group: tuple  # the summary row this cell belongs to (every axis but the seed)


def builtin_grid_path(name: str) -> str:
    return f"pitcheck/grids/{name}.toml"


def _builtin_text(name: str) -> str:
    return resources.files("pitcheck").joinpath("grids", f"{name}.toml").read_text()


def parse_shape(value) -> tuple[int, int]:
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value):
        return int(value[0]), int(value[1])
    if isinstance(value, str):
        parts = value.lower().replace(" ", "").split("x")
        if len(parts) == 2 and all(p.isascii() and p.isdigit() for p in parts):
            return int(parts[0]), int(parts[1])
    raise PitcheckError(f"shape must be 'VxD' (e.g. '256x16') or [V, D], got {value!r}")


def adversary_spec(value: str) -> str:
    """'dense_output+sparse_input' (or with commas) -> the RunConfig spec 'dense_output,sparse_input'."""
    if not isinstance(value, str):
        raise PitcheckError(f"adversary must be a string, got {value!r}")
    return ",".join(p.strip() for p in value.replace("+", ",").split(",") if p.strip())


def adversary_label(spec: str) -> str:
    return "+".join(spec.split(","))


def grid_from_dict(data: dict, source: str, max_cells: int = MAX_CELLS) -> Grid:
    from .lm import uses_lm
    from .trajectory import RunConfig

    unknown = sorted(set(data) - set(GRID_KEYS))
    if unknown:
        raise PitcheckError(f"{source}: unknown key {unknown[0]!r}; a grid has {', '.join(GRID_KEYS)}")
    axes_in = data.get("axes", {})
    if not isinstance(axes_in, dict):
        raise PitcheckError(f"{source}: [axes] must be a table")
    bad = sorted(set(axes_in) - set(AXES))
    if bad:
        raise PitcheckError(f"{source}: unknown axis {bad[0]!r}; choose from {', '.join(AXES)}")
    defaults = RunConfig()
    axes = {}
    for name in AXES:
        if name in axes_in:
            values = axes_in[name] if isinstance(axes_in[name], list) else [axes_in[name]]
        elif name == "shape":
            values = [f"{defaults.vocab}x{defaults.dim}"]
        else:
            values = [getattr(defaults, name)]
        if not values:
            raise PitcheckError(f"{source}: axis {name!r} is empty")
        if name == "shape":
            values = [f"{v}x{d}" for v, d in (parse_shape(x) for x in values)]
        elif name == "adversary":
            values = [adversary_label(adversary_spec(v)) for v in values]
        elif name == "lr":
            if any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in values):
                raise PitcheckError(f"{source}: axis lr must hold numbers, got {values!r}")
            values = [float(v) for v in values]
        elif name == "seed":
            if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in values):
                raise PitcheckError(f"{source}: axis seed must hold integers >= 0, got {values!r}")
        elif any(not isinstance(v, str) for v in values):
            raise PitcheckError(f"{source}: axis {name} must hold strings, got {values!r}")
        if len(set(values)) != len(values):
            raise PitcheckError(f"{source}: axis {name} repeats a value: {values!r}")
        axes[name] = values
    fixed = data.get("fixed", {})
    if not isinstance(fixed, dict):
        raise PitcheckError(f"{source}: [fixed] must be a table")
    known = {f.name for f in fields(RunConfig)} - AXIS_FIELDS
    bad = sorted(set(fixed) - known)
    if bad:
        name = bad[0]
        if name in ("steps", "records_per_decade"):
            what = f"is a top-level key of the grid ({name} = ..., before any table)"
        elif name in ("vocab", "dim"):
            what = "is part of the shape axis (give shape = [\"VxD\"] under [axes])"
        elif name in AXIS_FIELDS:
            what = "is an axis (give it under [axes])"
        else:
            what = "is not a run option"
        raise PitcheckError(f"{source}: [fixed] {name!r} {what}; [fixed] takes {', '.join(sorted(known))}")
    steps = data.get("steps", defaults.steps)
    rpd = data.get("records_per_decade", defaults.records_per_decade)
    for name, value in (("steps", steps), ("records_per_decade", rpd)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise PitcheckError(f"{source}: {name} must be a positive integer, got {value!r}")
    count = cell_count(axes)
    if count > max_cells:
        raise PitcheckError(f"{source}: the grid has {count} cells, more than the limit of {max_cells} "
                            "(--max-cells N raises it)")
    if "lm" in fixed and not any(uses_lm(adversary_spec(a)) for a in axes["adversary"]):
        raise PitcheckError(f"{source}: [fixed.lm] sets options of the lm source, which no cell uses "
                            f"(adversaries {', '.join(axes['adversary'])})")
    grid = Grid(axes=axes, steps=steps, records_per_decade=rpd, fixed=dict(fixed),
                description=str(data.get("description", "")), source=source)
    cells(grid)  # every cell's config is checked now, before anything runs
    return grid


def cell_count(axes: dict) -> int:
    """The number of combinations of the axes, from their lengths alone (nothing enumerated); an upper
    bound on the cells, since the baseline heads take one cell for all the retractions."""
    return math.prod(len(v) for v in axes.values())


def load_grid(path: str | None = None, quick: bool = False, max_cells: int = MAX_CELLS) -> Grid:
    """The grid in a TOML file, or the built-in one (`quick`: the small one)."""
    if path is not None and quick:
        raise PitcheckError("--quick picks the built-in quick grid: give --config or --quick, not both")
    if path is None:
        name = "quick" if quick else "default"
        source, text = builtin_grid_path(name), _builtin_text(name)
    else:
        source = str(path)
        try:
            text = Path(path).read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise PitcheckError(f"cannot read grid {path}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PitcheckError(f"{source} is not valid TOML: {exc}") from None
    return grid_from_dict(data, source, max_cells)


def override(grid: Grid, max_cells: int = MAX_CELLS, **axes) -> Grid:
    """The grid with some axes replaced (values as in the TOML file); None leaves an axis as it is."""
    data = {"steps": grid.steps, "records_per_decade": grid.records_per_decade, "fixed": grid.fixed,
            "description": grid.description, "axes": dict(grid.axes)}
    changed = []
    for name, values in axes.items():
        if values is None:
            continue
        if name == "steps":
            data["steps"] = values
        else:
            data["axes"][name] = values
        changed.append(f"{name} {values if name == 'steps' else ','.join(str(v) for v in values)}")
    source = f"{grid.source}, overridden: {'; '.join(changed)}" if changed else grid.source
    return grid_from_dict(data, source, max_cells)


def cell_name(config) -> str:
    """The axes in words, then 8 hex digits of the whole config but its length and device."""
    d = config.to_json()
    for k in ("steps", "device"):
        d.pop(k)
    digest = hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:8]
    retraction = config.retraction if config.head == "pit" else "none"
    return (f"{config.precision}-{retraction}-{adversary_label(config.adversary)}-{config.head}-"
            f"{config.vocab}x{config.dim}-{config.optimizer}-lr{config.lr:g}-seed{config.seed}-{digest}")


def cells(grid: Grid) -> list[Cell]:
    """Every cell of the grid, in axis order; baseline heads (no retraction) appear once per precision."""
    from .gradients import AdversaryParams
    from .trajectory import RunConfig

    fixed = dict(grid.fixed)
    params = fixed.pop("adversary_params", {})
    if not isinstance(params, dict):
        raise PitcheckError(f"{grid.source}: [fixed.adversary_params] must be a table")
    try:
        params = AdversaryParams(**params)
    except TypeError:
        names = ", ".join(f.name for f in fields(AdversaryParams))
        raise PitcheckError(f"{grid.source}: [fixed.adversary_params] takes {names}, got "
                            f"{', '.join(sorted(params))}") from None
    out, seen = [], set()
    for combo in itertools.product(*(grid.axes[a] for a in AXES)):
        a = dict(zip(AXES, combo))
        vocab, dim = parse_shape(a["shape"])
        backend = fixed.get("backend") or ("numpy" if a["precision"] == "fp64" else "torch")
        retraction = a["retraction"] if a["head"] == "pit" else RunConfig.retraction
        try:
            config = RunConfig(**{**fixed, "backend": backend}, precision=a["precision"], retraction=retraction,
                               adversary=adversary_spec(a["adversary"]), optimizer=a["optimizer"], lr=a["lr"],
                               head=a["head"], vocab=vocab, dim=dim, seed=a["seed"], steps=grid.steps,
                               records_per_decade=grid.records_per_decade, adversary_params=params)
            config.validate(here=True)
        except TypeError as exc:
            raise PitcheckError(f"{grid.source}: {exc}") from None
        except PitcheckError as exc:
            raise PitcheckError(f"{grid.source}: {exc}") from None
        name = cell_name(config)
        if name in seen:
            continue
        seen.add(name)
        group = (a["retraction"] if a["head"] == "pit" else "-", a["precision"], a["adversary"], a["optimizer"],
                 a["lr"], a["head"], vocab, dim)
        out.append(Cell(name, config, group))
    return out


# ---- one cell (in a worker) -----------------------------------------------------------------------
def time_steps(config, steps: int = COST_STEPS, warmup: int = COST_WARMUP) -> float:
    """Milliseconds per optimizer step of this cell's model alone (retraction included; no shadow, no
    metrics, gradients drawn beforehand): the median over `steps` timed steps after `warmup`."""
    import numpy as np

    from .gradients import parse_adversary
    from .policy import get_policy
    from .trajectory import initial_state, make_engine

    engine = make_engine(config, config.backend, get_policy(config.precision), config.device)
    engine.initialise(*initial_state(config))
    names = parse_adversary(config.adversary)
    grads = [engine.gradients([n for n in names if n != "adaptive"] or ["gaussian"], config.seed, k,
                              config.adversary_params) for k in range(steps + warmup)]
    times = []
    sync = None
    if engine.backend == "torch" and engine.device.startswith("cuda"):
        import torch

        sync = torch.cuda.synchronize
    for k, g in enumerate(grads):
        t0 = time.perf_counter()
        engine.step(g, k)
        if sync:
            sync()
        if k >= warmup:
            times.append(time.perf_counter() - t0)
    return float(np.median(times) * 1e3)


def run_cell(task: dict) -> dict:
    """Run (or resume) one cell and time its step; never raises for the cell's own failures."""
    from .rundir import write_atomic
    from .trajectory import RunBreakdown, RunConfig, run

    config = RunConfig.from_json(task["config"])
    result = {"name": task["name"], "status": "done", "error": None, "seconds": 0.0}
    t0 = time.perf_counter()
    try:
        try:
            # a cell not yet begun has no directory: it starts; one that has, resumes
            run(config, task["dir"], resume=not task["force"] and Path(task["dir"]).exists(), progress=False,
                force=task["force"])
        except RunBreakdown:
            result["status"] = "breakdown"
        seconds = time.perf_counter() - t0
        ms = time_steps(config)
        cost = {"ms_per_step": ms, "run_seconds": seconds, "pid": os.getpid(), "host": platform.node()}
        write_atomic(task["cost"], (json.dumps(cost, indent=1) + "\n").encode())
    except PitcheckError as exc:
        result.update(status="error", error=str(exc))
    result["seconds"] = time.perf_counter() - t0
    return result


# ---- the sweep ------------------------------------------------------------------------------------
def cell_dir(out: Path, cell: Cell) -> Path:
    return out / "cells" / cell.name


def cost_path(out: Path, cell: Cell) -> Path:
    return out / "costs" / f"{cell.name}.json"


def finished(out: Path, cell: Cell) -> bool:
    """True when the cell's directory holds this very run to its last step (or to its breakdown) and its
    cost was measured: nothing to compute. Anything else is left to the run, which resumes or refuses."""
    from .rundir import read_events, read_manifest, read_metrics

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


class SweepProgress:
    """cells done/total and the ETA, on one line of stderr (only on a terminal)."""

    def __init__(self, total: int, done: int, enabled: bool | None = None):
        self.total, self.done, self.start_done = total, done, done
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.t0 = time.monotonic()

    def draw(self, last: str = "") -> None:
        if not self.enabled:
            return
        frac = self.done / self.total if self.total else 1.0
        computed = self.done - self.start_done
        elapsed = time.monotonic() - self.t0
        if computed and self.done < self.total:
            eta = _hms(elapsed / computed * (self.total - self.done))
        else:
            eta = "--:--" if self.done < self.total else _hms(elapsed)
        label = "ETA" if self.done < self.total else "took"
        line = f"\rcompare [{'#' * int(30 * frac):<30}] {self.done}/{self.total} cells  {label} {eta}  {last.rsplit('-', 1)[0][:60]}"
        sys.stderr.write(line.ljust(130))
        if self.done >= self.total:
            sys.stderr.write("\n")
        sys.stderr.flush()

    def advance(self, name: str) -> None:
        self.done += 1
        self.draw(name)


def _hms(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 else \
        f"{seconds // 60}:{seconds % 60:02d}"


def sweep(out: Path | str, grid: Grid, executor: str = "local", workers: int | None = None,
          address: str | None = None, force: bool = False, progress: bool | None = None) -> dict:
    """Run every cell of the grid that is not finished (all of them with `force`), then summarise.

    Returns {"rows": summary rows, "cells": n, "computed": n, "wall_seconds": s, "cell_seconds": s,
    "errors": [...]}. A cell that breaks down is a result (its row says so); a cell that cannot run at
    all (a directory it must not touch, say) is an error, and the sweep raises after the others finish.
    """
    from .executors import execute
    from .rundir import check_out_path, write_atomic

    from .executors import EXECUTORS, check_workers

    if executor not in EXECUTORS:
        raise PitcheckError(f"unknown executor {executor!r}; choose from {', '.join(EXECUTORS)}")
    if workers is not None:
        check_workers(workers)
    if executor == "local" and address:
        raise PitcheckError("--address names a Ray cluster: use it with --executor ray")
    out = check_out_path(out)
    check_sweep_dir(out)
    all_cells = cells(grid)
    todo = all_cells if force else [c for c in all_cells if not finished(out, c)]
    try:
        (out / "cells").mkdir(parents=True, exist_ok=True)
        (out / "costs").mkdir(exist_ok=True)
    except OSError as exc:
        raise PitcheckError(f"cannot create {out}: {exc.strerror or exc}") from None
    write_atomic(out / "grid.json", (json.dumps(grid.to_json(), indent=1) + "\n").encode())
    tasks = [{"name": c.name, "config": c.config.to_json(), "dir": str(cell_dir(out, c)),
              "cost": str(cost_path(out, c)), "force": force} for c in todo]
    bar = SweepProgress(len(all_cells), len(all_cells) - len(todo), progress)
    bar.draw()
    results = []

    def on_result(result: dict) -> None:
        results.append(result)
        bar.advance(result["name"])

    t0 = time.perf_counter()
    try:
        execute(executor, tasks, on_result, workers=workers, address=address)
    except KeyboardInterrupt:
        bar.enabled and sys.stderr.write("\n")
        raise PitcheckError(f"interrupted with {bar.done} of {bar.total} cells finished; each running cell saved "
                            "its last step: the same command resumes the sweep") from None
    wall = time.perf_counter() - t0
    errors = [r for r in results if r["status"] == "error"]
    if errors:
        more = f" (and {len(errors) - 1} more cells)" if len(errors) > 1 else ""
        raise PitcheckError(f"cell {errors[0]['name']}: {errors[0]['error']}{more}")
    rows = summarise(out, grid, all_cells)
    write_atomic(out / "summary.csv", summary_csv(rows))
    write_atomic(out / "cost.csv", cost_csv(rows))
    used = min(check_workers(workers), max(1, len(todo))) if executor == "local" else (workers or "cluster's")
    timing = {"executor": executor, "workers": used, "cells": len(all_cells), "computed": len(todo),
              "wall_seconds": wall, "cell_seconds": sum(r["seconds"] for r in results)}
    # every invocation that computed something, in order: a re-render reports them too
    history = read_timing(out)
    if todo:
        history.append(dict(timing))
        write_atomic(out / "timing.json", (json.dumps({"computations": history}, indent=1) + "\n").encode())
    timing["computations"] = history
    return {"rows": rows, **timing}


def check_sweep_dir(out: Path) -> None:
    """Refuse to sweep into a `pitcheck run` directory (a run's files and no grid.json): the sweep's files
    would be written among the run's."""
    from .rundir import COMMIT, RUN_FILES

    if (out / "grid.json").exists():
        return
    found = [n for n in (*RUN_FILES, COMMIT) if (out / n).exists()]
    if found:
        raise PitcheckError(f"--out {out} holds a pitcheck run ({', '.join(found)}), not a sweep: choose another "
                            "--out for compare")


def read_timing(out: Path) -> list[dict]:
    """The computations recorded in out/timing.json (an older single record counts as one)."""
    try:
        data = json.loads((out / "timing.json").read_text())
    except (OSError, ValueError):
        return []
    if isinstance(data, dict) and isinstance(data.get("computations"), list):
        return [c for c in data["computations"] if isinstance(c, dict)]
    return [data] if isinstance(data, dict) and "wall_seconds" in data else []


# ---- the summary ----------------------------------------------------------------------------------
def storage_floor(precision: str, vocab: int, dim: int) -> float:
    """||Q^T Q - I||_F of an exactly orthonormal V x D Q rounded to the format Z is stored in (median of
    FLOOR_SAMPLES seeded Q's): no retraction can keep Z closer to the manifold than this."""
    import numpy as np

    from .formats import FORMATS, round_to
    from .metrics import orthonormality_loss
    from .policy import get_policy

    fmt = FORMATS[get_policy(precision).storage]
    values = []
    for seed in range(FLOOR_SAMPLES):
        rng = np.random.default_rng([seed, vocab, dim, 7])
        Q, R = np.linalg.qr(rng.standard_normal((vocab, dim)))
        Q = Q * np.where(np.diag(R) < 0, -1.0, 1.0)
        values.append(orthonormality_loss(Q if fmt.name == "fp64" else round_to(Q, fmt)))
    return float(np.median(values))


def growth_fit(runs: list[list[dict]], steps: int, metric: str = "orthonormality") -> tuple[float, float]:
    """Slope of log(metric) against log(step) over steps sqrt(N)..N, one intercept per run (seed), and
    the slope's standard error; NaN when fewer than 3 usable points (or no spread in step)."""
    import numpy as np

    lo = math.sqrt(steps)
    sxy = sxx = 0.0
    resid_data = []
    for rows in runs:
        pts = [(math.log(r["step"]), math.log(r[metric])) for r in rows
               if r["step"] >= max(lo, 1) and math.isfinite(r[metric]) and r[metric] > 0]
        if len(pts) < 2:
            continue
        x, y = np.array(pts).T
        xc, yc = x - x.mean(), y - y.mean()
        sxy += float(xc @ yc)
        sxx += float(xc @ xc)
        resid_data.append((xc, yc))
    n = sum(len(xc) for xc, _ in resid_data)
    if n < 3 or sxx <= 0:
        return float("nan"), float("nan")
    slope = sxy / sxx
    dof = n - len(resid_data) - 1
    rss = sum(float(((yc - slope * xc) ** 2).sum()) for xc, yc in resid_data)
    err = math.sqrt(rss / dof / sxx) if dof > 0 else float("nan")
    return slope, err


def _median(values):
    import numpy as np

    vals = [v for v in values if v is not None and math.isfinite(v)]
    return float(np.median(vals)) if vals else float("nan")


def summarise(out: Path, grid: Grid, all_cells: list[Cell]) -> list[dict]:
    """One row per group of cells that differ only in the seed."""
    from .formats import FORMATS
    from .policy import get_policy
    from .rundir import read_events, read_metrics

    groups: dict[tuple, list[Cell]] = {}
    for c in all_cells:
        groups.setdefault(c.group, []).append(c)
    floors: dict[tuple, float] = {}
    rows = []
    for group, members in groups.items():
        retraction, precision, adversary, optimizer, lr, head, vocab, dim = group
        runs, events, costs, hosts, broke, failed, broke_T = [], 0, [], set(), 0, 0, 0
        for c in members:
            runs.append(read_metrics(cell_dir(out, c) / "metrics.csv"))
            evs = read_events(cell_dir(out, c) / "events.jsonl")
            events += sum(1 for e in evs if e["event"] not in ("threshold_crossed", "breakdown"))
            broke += any(e["event"] == "breakdown" for e in evs)
            broke_T += any(e["event"] == "breakdown" and any(t in e.get("reason", "") for t in T_BREAKDOWN)
                           for e in evs)
            failed += sum(1 for e in evs if e["event"] == "retraction_failed")
            try:
                cost = json.loads(cost_path(out, c).read_text())
                costs.append(float(cost["ms_per_step"]))
                hosts.add(str(cost.get("host", "")))
            except (OSError, ValueError, KeyError, TypeError):
                pass
        finals = [r[-1]["orthonormality"] for r in runs]
        key = (get_policy(precision).storage, vocab, dim)
        if key not in floors:
            floors[key] = storage_floor(precision, vocab, dim)
        slope, err = growth_fit(runs, grid.steps)
        policy = get_policy(precision)
        factor_u = FORMATS[policy.factor].u
        bounds = [r[-1]["cond_T"] * (r[-1]["orthonormality"] + factor_u) for r in runs]
        row = {
            "retraction": retraction, "precision": precision, "adversary": adversary, "optimizer": optimizer,
            "lr": lr, "head": head, "vocab": vocab, "dim": dim, "steps": grid.steps, "seeds": len(members),
            "final_orthonormality": _median(finals),
            "final_orthonormality_min": min(finals), "final_orthonormality_max": max(finals),
            "max_orthonormality": max(x["orthonormality"] for r in runs for x in r),
            "growth_exponent": slope, "growth_exponent_err": err,
            "final_pinv_drift": _median(r[-1]["pinv_drift"] for r in runs),
            "drift_bound": _median(bounds),
            "max_cond_T": max(x["cond_T"] for r in runs for x in r),
            "shadow_Z": _median(r[-1]["shadow_Z"] for r in runs),
            "ms_per_step": _median(costs),
            "ms_per_step_min": min(costs, default=float("nan")), "ms_per_step_max": max(costs, default=float("nan")),
            "hosts": " ".join(sorted(h for h in hosts if h)),
            "floor": floors[key],
            "events": events, "failed_retractions": failed, "breakdowns": broke, "breakdowns_T": broke_T,
        }
        row["error_over_floor"] = row["final_orthonormality"] / row["floor"]
        rows.append(row)
    return rows


def _cell_text(value) -> str:
    if isinstance(value, float):
        return "" if not math.isfinite(value) else repr(value)
    return str(value)


def summary_csv(rows: list[dict], columns: list[str] = SUMMARY_COLUMNS) -> bytes:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(columns)
    for row in rows:
        w.writerow([_cell_text(row[k]) for k in columns])
    return buf.getvalue().encode()


def cost_csv(rows: list[dict]) -> bytes:
    return summary_csv(rows, COST_COLUMNS)


def _read_rows(path: Path) -> list[dict]:
    rows = []
    for raw in csv.DictReader(io.StringIO(path.read_text())):
        row = {}
        for k, v in raw.items():
            if k in ("retraction", "precision", "adversary", "optimizer", "head", "hosts"):
                row[k] = v
            elif k in ("vocab", "dim", "steps", "seeds", "events", "failed_retractions", "breakdowns", "breakdowns_T"):
                row[k] = int(v)
            else:
                row[k] = float(v) if v else float("nan")
        rows.append(row)
    return rows


def read_summary(path: Path | str) -> list[dict]:
    """summary.csv's rows, each joined with its cost.csv row (same key) when that file is beside it."""
    path = Path(path)
    rows = _read_rows(path)
    cost_file = path.with_name("cost.csv")
    if cost_file.is_file():
        costs = {tuple(r[k] for k in KEY_COLUMNS): r for r in _read_rows(cost_file)}
        for row in rows:
            row.update(costs.get(tuple(row[k] for k in KEY_COLUMNS), {}))
    return rows


# ---- the verdict ----------------------------------------------------------------------------------
def measurable(row: dict) -> bool:
    """Whether the row's growth could be measured: a finite exponent with a finite error (too few recorded
    steps past sqrt(N) give neither, and a row that may grow like k^1 must not pass for bounded)."""
    return math.isfinite(row["growth_exponent"]) and math.isfinite(row["growth_exponent_err"])


def judge(row: dict) -> tuple[bool, str]:
    """(unsafe, why) for one summary row."""
    reasons = []
    z_breakdowns = row["breakdowns"] - row.get("breakdowns_T", 0)
    if z_breakdowns:
        reasons.append(f"Z broke down in {z_breakdowns} of {row['seeds']} seeds")
    if row.get("failed_retractions"):
        reasons.append(f"the retraction failed in {row['failed_retractions']} steps (skipped)")
    g = row["growth_exponent"]
    if math.isfinite(g) and g >= BOUNDED_GROWTH:
        reasons.append(f"error grows like k^{g:.2f}: {row['error_over_floor']:.2g}x the floor at step {row['steps']}")
    if not math.isfinite(row["final_orthonormality"]):
        reasons.append("non-finite error")
    return bool(reasons), "; ".join(reasons)


def verdicts(rows: list[dict]) -> list[dict]:
    """Per precision: the recommended retraction and why, the unsafe combinations and the inconclusive ones.

    A retraction is unsafe in a precision when, in any row of that precision (adversary, head, shape...),
    it broke down or its error grows (growth exponent >= BOUNDED_GROWTH). It is inconclusive, never safe,
    when it is not unsafe but some row's growth could not be measured (too few recorded steps). Among the
    safe ones its error is its worst final ||Z^T Z - I||_F / floor over those rows; the most accurate wins,
    unless a cheaper one is within ACCURACY_TIE of its error, in which case the cheapest of those wins.
    """
    out = []
    precisions = list(dict.fromkeys(r["precision"] for r in rows))
    for p in precisions:
        prow = [r for r in rows if r["precision"] == p and r["head"] == "pit"]
        by_ret: dict[str, list[dict]] = {}
        for r in prow:
            by_ret.setdefault(r["retraction"], []).append(r)
        unsafe, safe, inconclusive = [], [], []
        for ret, rs in by_ret.items():
            bad = [(r, why) for r in rs for bad_, why in [judge(r)] if bad_]
            unmeasured = [r for r in rs if not measurable(r)]
            if bad:
                r, why = max(bad, key=lambda b: b[0]["growth_exponent"] if math.isfinite(b[0]["growth_exponent"])
                             else math.inf)
                where = f" ({r['adversary']})" if len({x['adversary'] for x in rs}) > 1 else ""
                unsafe.append({"retraction": ret, "why": why + where})
            elif unmeasured:
                r = unmeasured[0]
                where = f" ({r['adversary']})" if len({x['adversary'] for x in rs}) > 1 else ""
                inconclusive.append({"retraction": ret, "why": "growth exponent not measurable (too few recorded "
                                     f"steps between sqrt(N) and N = {r['steps']}: give more steps){where}"})
            else:
                worst = max(rs, key=lambda r: r["error_over_floor"])
                safe.append({"retraction": ret, "ratio": worst["error_over_floor"], "row": worst,
                             "growth": max(r["growth_exponent"] for r in rs),
                             "growth_err": max(r["growth_exponent_err"] for r in rs),
                             "ms": _median(r["ms_per_step"] for r in rs)})
        best = None
        if safe:
            top = min(s["ratio"] for s in safe)
            tied = [s for s in safe if s["ratio"] <= ACCURACY_TIE * top]
            best = min(tied, key=lambda s: (s["ms"] if math.isfinite(s["ms"]) else math.inf, s["ratio"]))
            best["because"] = ("the most accurate" if best["ratio"] == top and len(tied) == 1 else
                               "the most accurate, and the cheapest of those within "
                               f"{ACCURACY_TIE:g}x of it" if best["ratio"] == top else
                               f"within {ACCURACY_TIE:g}x of the most accurate and the cheapest of those")
        out.append({"precision": p, "best": best, "safe": safe, "unsafe": unsafe, "inconclusive": inconclusive,
                    "judged": bool(by_ret)})
    return out


def t_instability_lines(rows: list[dict]) -> list[str]:
    """Rows where T, not Z, failed: cond(T) beyond UNSTABLE_COND_T or L's diagonal reached 0. These come
    from the gradient model and learning rate, so they are reported apart from the retractions."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["head"] == "pit" and (r.get("breakdowns_T") or r["max_cond_T"] > UNSTABLE_COND_T):
            groups.setdefault((r["adversary"], r["optimizer"], r["lr"]), []).append(r)
    lines = []
    for (adv, opt, lr), rs in groups.items():
        seeds = sum(r["seeds"] for r in rs)
        broke = sum(r.get("breakdowns_T", 0) for r in rs)
        worst = max(r["max_cond_T"] for r in rs)
        lines.append(f"- T, not Z, is unstable under {adv} with {opt} lr={lr:g}: cond(T) reached {worst:.1e} in "
                     f"{len(rs)} rows, and L's diagonal reached 0 (T singular, run ended) in {broke} of {seeds} "
                     "runs, whichever the retraction; gradient overflows and skipped steps in these rows follow "
                     "from it. Their Z errors are still comparable; their pinv drift is not.")
    return lines


def verdict_lines(rows: list[dict]) -> list[str]:
    lines = ["| precision | recommended | why | unsafe |", "|---|---|---|---|"]
    for v in verdicts(rows):
        b = v["best"]
        if b:
            why = (f"{b['because']}: error {b['ratio']:.2g}x the storage floor, growth exponent "
                   f"{b['growth']:+.2f} ± {b['growth_err']:.2f}, {b['ms']:.3g} ms/step")
            rec = f"**{b['retraction']}**"
        elif not v["judged"]:
            rec, why = "none", "no retraction to judge: only the baseline heads (tied, untied), which have none"
        elif v["inconclusive"]:
            rec, why = "none", ("inconclusive: no retraction was shown safe; "
                                + "; ".join(f"{u['retraction']}: {u['why']}" for u in v["inconclusive"]))
        else:
            rec, why = "none", "every retraction tried is unsafe here"
        unsafe = "; ".join(f"{u['retraction']} ({u['why']})" for u in v["unsafe"]) or "none"
        if b and v["inconclusive"]:
            why += "; not judged: " + "; ".join(f"{u['retraction']} ({u['why']})" for u in v["inconclusive"])
        lines.append(f"| {v['precision']} | {rec} | {why} | {unsafe} |")
    return lines


# ---- the report -----------------------------------------------------------------------------------
def _fmt(x, spec=".2e") -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


def table_lines(rows: list[dict]) -> list[str]:
    multi = {k for k in ("adversary", "optimizer", "lr", "head", "vocab", "dim")
             if len({r[k] for r in rows}) > 1}
    keys = ["precision", "retraction"] + [k for k in ("adversary", "optimizer", "lr", "head", "vocab", "dim")
                                          if k in multi]
    head = keys + ["final ‖ZᵀZ-I‖ (min-max)", "floor", "x floor", "growth exp.", "pinv drift",
                   "drift bound", "max cond T", "shadow Z", "ms/step", "events", "failed retr.", "breakdowns (of T)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [str(r[k]) if not isinstance(r[k], float) else f"{r[k]:g}" for k in keys]
        cells += [f"{_fmt(r['final_orthonormality'])} ({_fmt(r['final_orthonormality_min'], '.1e')}-"
                  f"{_fmt(r['final_orthonormality_max'], '.1e')})",
                  _fmt(r["floor"], ".1e"), _fmt(r["error_over_floor"], ".3g"),
                  f"{_fmt(r['growth_exponent'], '+.2f')} ± {_fmt(r['growth_exponent_err'], '.2f')}",
                  _fmt(r["final_pinv_drift"]), _fmt(r["drift_bound"]), _fmt(r["max_cond_T"], ".3g"),
                  _fmt(r["shadow_Z"]), _fmt(r["ms_per_step"], ".3g"), str(r["events"]), str(r["failed_retractions"]),
                  f"{r['breakdowns']} ({r.get('breakdowns_T', 0)})"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def machine_lines() -> list[str]:
    from .executors import available_cores
    from .trajectory import versions

    v = versions()
    return [f"- machine: {platform.platform()}, {platform.processor() or platform.machine()}, "
            f"{available_cores()} cores",
            "- versions: " + ", ".join(f"{k} {val}" for k, val in v.items() if val is not None)]


def timing_lines(info: dict) -> list[str]:
    history = info.get("computations") or []
    if not history:
        return ["- the cells were computed by an earlier pitcheck (no timing.json)"]
    lines = []
    for c in history:
        workers = f"{c['workers']} workers" if c.get("workers") else "one worker per core"
        busy = c["cell_seconds"] / c["wall_seconds"] if c["wall_seconds"] > 0 else float("nan")
        lines.append(f"- computed {c['computed']} cells on the {c['executor']} executor ({workers}): wall "
                     f"{c['wall_seconds']:.1f} s against {c['cell_seconds']:.1f} s of cell time, the serial sum "
                     f"({busy:.2f} cells running at once on average)")
    return lines


def report_markdown(out: Path, grid: Grid, info: dict, plots: list[str]) -> str:
    """report.md: the verdict first, then the table, the floors and bounds, the machine, the plots."""
    rows = info["rows"]
    g = grid
    axes = ", ".join(f"{k} {'/'.join(str(v) for v in vals)}" for k, vals in g.axes.items())
    lines = [
        f"# pitcheck compare: which retraction, in which precision, at what cost",
        "",
        f"Grid {g.source}: {g.description or ''}" if g.description else f"Grid {g.source}.",
        "",
        f"As run: {g.steps} steps per cell, {len(cells(g))} cells ({axes}).",
        "",
        "## Verdict",
        "",
        f"Per precision, among the retractions that neither broke down nor let the error grow (growth exponent "
        f"below {BOUNDED_GROWTH}, measured: a retraction whose growth could not be measured is inconclusive, "
        f"never safe), the most accurate (final ||Z^T Z - I||_F against the storage floor, worst "
        f"row), or the cheapest of those within {ACCURACY_TIE:g}x of it.",
        "",
        *verdict_lines(rows),
        "",
        *(t_instability_lines(rows) + [""] if t_instability_lines(rows) else []),
        "## Table",
        "",
        "One row per cell group, aggregated over seeds: final ||Z^T Z - I||_F (median, min-max over seeds); "
        "floor = that of an exactly orthonormal Q rounded to the storage format (measured, same shape); "
        "growth exponent = slope of log error against log step over steps sqrt(N)..N (0 bounded, 0.5 random "
        "walk, 1 linear) ± its standard error; pinv drift = ||W E - I||_F at the end (median); drift bound = "
        "cond(T) (||Z^T Z - I||_F + u_factor), the first-order bound W E - I = T (Z^T Z - I) T^{-1} plus the "
        "solves' cond(T) u; shadow Z = relative distance from the float64 run on the same gradients; ms/step "
        "= the model's optimizer step alone (retraction included, no shadow or metrics), median of "
        f"{COST_STEPS} steps, measured in the worker while the others ran; events = skipped steps, overflows, "
        "failed retractions (threshold crossings not counted); failed retr. = steps the retraction could not "
        "take (skipped), which makes it unsafe.",
        "",
        *table_lines(rows),
        "",
        "## Floors and bounds",
        "",
        "The floor is measured; beside it, the first-order estimate for a Gaussian-like Q whose entries are "
        "rounded with relative errors uniform in ±u: ‖QᵀQ - I‖_F ≈ u sqrt((2D(D-1)/3 + 4D)/V). A final error "
        "near 1x the floor is as good as the format allows. In fp64 no exactly orthonormal Q can be stored to "
        "measure from: the measured value is Householder QR's own orthogonality error and the float64 Gram "
        "product's, the resolution of the runs' own metric.",
        "",
        "| storage format | u | measured floor ‖QᵀQ - I‖_F (V x D) | first-order estimate |",
        "|---|---|---|---|",
    ]
    from .formats import FORMATS
    from .policy import get_policy

    seen = set()
    for r in rows:
        fmt = get_policy(r["precision"]).storage
        key = (fmt, r["vocab"], r["dim"])
        if key in seen:
            continue
        seen.add(key)
        u = FORMATS[fmt].u
        D, V = r["dim"], r["vocab"]
        est = u * math.sqrt((2 * D * (D - 1) / 3 + 4 * D) / V)
        lines.append(f"| {fmt} | {u:.3g} | {r['floor']:.2e} ({r['vocab']} x {r['dim']}) | {est:.1e} |")
    lines += [
        "",
        "## How it ran",
        "",
        f"- grid: {g.source}; cells: {info['cells']}, computed in this invocation: {info['computed']}",
        *timing_lines(info),
        *machine_lines(),
        "",
        "## Plots",
        "",
    ]
    for p in plots:
        lines += [f"![{p}]({p})", ""]
    return "\n".join(lines) + "\n"


def render(out: Path | str, grid: Grid, info: dict) -> None:
    """summary.csv is written by the sweep; this writes report.md and the plots from the cells on disk."""
    from .report import plot_sweep
    from .rundir import write_atomic

    out = Path(out)
    plots = plot_sweep(out, grid, info["rows"])
    write_atomic(out / "report.md", report_markdown(out, grid, info, plots).encode())


def compare(out: Path | str, grid: Grid, executor: str = "local", workers: int | None = None,
            address: str | None = None, force: bool = False, progress: bool | None = None) -> dict:
    """Sweep the grid into out (resuming), then write summary.csv, report.md and the plots."""
    info = sweep(out, grid, executor, workers, address, force, progress)
    render(out, grid, info)
    return info


# ---- the command line (wired into cli.py's `compare` verb) ------------------------------------------
def add_compare_options(c) -> None:
    from .executors import EXECUTORS

    c.add_argument("--config", default=None, metavar="FILE.toml", help="grid file (default: the built-in grid)")
    c.add_argument("--quick", action="store_true", help="the built-in quick grid (under 2 minutes on 2 cores)")
    c.add_argument("--executor", default="local", choices=EXECUTORS,
                   help="local process pool (default) or a Ray cluster")
    c.add_argument("--workers", type=int, default=None, help="local: processes (default: every core); "
                   "ray without --address: CPUs of the local runtime")
    c.add_argument("--address", default=None, help="Ray cluster address (default: start a local runtime)")
    c.add_argument("--retractions", default=None, help="override the grid's retraction axis (comma-separated)")
    c.add_argument("--precisions", default=None, help="override the grid's precision axis (comma-separated)")
    c.add_argument("--adversaries", default=None,
                   help="override the adversary axis (comma-separated; '+' sums models, e.g. dense_output+sparse_input)")
    c.add_argument("--seeds", default=None, help="override the seed axis (comma-separated integers)")
    c.add_argument("--shapes", default=None, help="override the shape axis (comma-separated VxD)")
    c.add_argument("--steps", type=int, default=None, help="override the grid's steps")
    # one value for an axis, as `pitcheck run` takes them
    c.add_argument("--vocab", type=int, default=None, help="V of every cell (D: --dim or the grid's)")
    c.add_argument("--dim", type=int, default=None, help="D of every cell (V: --vocab or the grid's)")
    c.add_argument("--seed", type=int, default=None, help="one seed (same as --seeds N)")
    c.add_argument("--adversary", default=None, help="one gradient model spec, e.g. gaussian,spike (summed)")
    c.add_argument("--optimizer", default=None, help="one optimizer for every cell")
    c.add_argument("--lr", type=float, default=None, help="one learning rate for every cell")
    c.add_argument("--out", default="results/compare")
    c.add_argument("--force", action="store_true", help="recompute every cell instead of resuming")
    c.add_argument("--max-cells", type=int, default=MAX_CELLS, metavar="N",
                   help=f"refuse a grid of more cells than this (default {MAX_CELLS})")
    c.add_argument("--no-progress", action="store_true", help="no progress bar")


def _list(value: str | None, what: str, cast=str):
    if value is None:
        return None
    items = [v.strip() for v in value.split(",")]
    if not items or any(not v for v in items):
        raise PitcheckError(f"{what} must be a comma-separated list, got {value!r}")
    try:
        return [cast(v) for v in items]
    except ValueError:
        raise PitcheckError(f"{what} must be a comma-separated list of integers, got {value!r}") from None


def grid_from_args(args) -> Grid:
    max_cells = getattr(args, "max_cells", MAX_CELLS)
    if isinstance(max_cells, bool) or not isinstance(max_cells, int) or max_cells < 1:
        raise PitcheckError(f"--max-cells must be a positive integer, got {max_cells!r}")
    grid = load_grid(args.config, args.quick, max_cells)
    over = {"retraction": _list(args.retractions, "--retractions"),
            "precision": _list(args.precisions, "--precisions"),
            "adversary": _list(args.adversaries, "--adversaries"),
            "seed": _list(args.seeds, "--seeds", int), "shape": _list(args.shapes, "--shapes"),
            "steps": args.steps}
    for one, axis, many in (("seed", "seed", "--seeds"), ("adversary", "adversary", "--adversaries"),
                            ("optimizer", "optimizer", None), ("lr", "lr", None)):
        value = getattr(args, one, None)
        if value is None:
            continue
        if many and over[axis] is not None:
            raise PitcheckError(f"give --{one} or {many}, not both")
        over[axis] = [value]
    vocab, dim = getattr(args, "vocab", None), getattr(args, "dim", None)
    if vocab is not None or dim is not None:
        if over["shape"] is not None:
            raise PitcheckError("give --vocab/--dim or --shapes, not both")
        v0, d0 = parse_shape(grid.axes["shape"][0])
        over["shape"] = [f"{v0 if vocab is None else vocab}x{d0 if dim is None else dim}"]
    return override(grid, max_cells, **over) if any(v is not None for v in over.values()) else grid


def main_compare(args) -> int:
    """The `compare` verb: prints the verdict and the table; 0, or 1 when a cell broke down."""
    progress = False if args.no_progress else None
    grid = grid_from_args(args)
    info = compare(args.out, grid, args.executor, args.workers, args.address, args.force, progress)
    rows = info["rows"]
    print("\n".join(verdict_lines(rows)))
    print("\n".join([""] + t_instability_lines(rows)))
    print()
    print("\n".join(table_lines(rows)))
    print(f"\n{info['cells']} cells ({info['computed']} computed; wall {info['wall_seconds']:.1f} s, cell time "
          f"{info['cell_seconds']:.1f} s) -> {args.out}/summary.csv, {args.out}/report.md, plots "
          f"(growth, retractions, cost; PNG and SVG) in {args.out}")
    broken = [f"{r['precision']}-{r['retraction']}" for r in rows if r["breakdowns"]]
    if broken:
        print(f"pitcheck: breakdown: {', '.join(broken)} broke down in some seeds (kept as results)", file=sys.stderr)
        return 1
    return 0
