"""compare: which retraction, in which precision, at what cost. A grid of runs from a TOML file, one run
directory per cell, a summary with growth rates, storage floors and a verdict, a report with plots.

The package, by concept: grid (loading, overriding, checking grids), cells (one run directory each,
running and timing one), runner (the cells through an executor), summary (summary.csv, cost.csv, floors),
verdict (what to use where), report (report.md and the figures). compare() is the entry point.

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
    shards = [1, 2]             # optional: Z row-sharded over N gloo ranks on the CPU (run --shards)
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
random walk, 1 linear growth; the verdict calls a growth only where two standard errors exclude the other
model (verdict.growth_resolved). The floor is measured: an exactly orthonormal V x D Q (float64
Householder QR of a Gaussian) rounded to the format Z is stored in, ||Q^T Q - I||_F.
"""
from __future__ import annotations

import os
from pathlib import Path

from ...trajectory.config import check_argument
from .batches import DEFAULT_BATCH, batch_tasks, run_cell_batch, stack_key
from .cells import Cell, cell_dir, cell_name, cells, cost_path, finished, run_cell
from .grid import (AXES, MAX_CELLS, Grid, adversary_label, adversary_spec, cell_count, grid_from_dict, load_grid,
                   override, parse_shape)
from .report import render, table_lines
from .runner import read_timing, sweep
from .summary import COST_COLUMNS, SUMMARY_COLUMNS, read_summary, storage_floor, summarise
from .verdict import BOUNDED_GROWTH, judge, judgeable, own_breakdowns, t_instability_lines, verdict_lines, verdicts

__all__ = ["AXES", "BOUNDED_GROWTH", "COST_COLUMNS", "DEFAULT_BATCH", "MAX_CELLS", "SUMMARY_COLUMNS", "Cell", "Grid",
           "batch_tasks", "run_cell_batch", "stack_key",
           "adversary_label", "adversary_spec", "cell_count", "cell_dir", "cell_name", "cells", "compare",
           "cost_path", "finished", "grid_from_dict", "judge", "judgeable", "load_grid", "own_breakdowns", "override", "parse_shape",
           "read_summary", "read_timing", "render", "run_cell", "storage_floor", "summarise", "sweep",
           "t_instability_lines", "table_lines", "verdict_lines", "verdicts"]


def compare(out: Path | str, grid: Grid, executor: str = "local", workers: int | None = None,
            address: str | None = None, force: bool = False, progress: bool | None = None,
            batch: int = DEFAULT_BATCH) -> dict:
    """Sweep the grid into `out` and report: which retraction, in which precision, at what cost.

    Every cell not finished in out/cells/ runs (or resumes; all of them with `force`) on `executor`
    ("local": a pool of `workers` processes, default one per core; "ray": the cluster at `address`, or a
    local runtime; up to `batch` cells of one shape, precision and retraction stepped together, with the
    files and numbers of cells run alone: batches.py), then out/summary.csv, cost.csv, report.md and
    the plots are written. A progress bar goes to stderr when `progress` is true (None: only on a terminal).

    Returns {"rows": the summary rows, "cells", "computed", "wall_seconds", "cell_seconds", "executor",
    "workers", "computations"}. Raises PitcheckError for a grid or an --out that cannot be used, or a cell
    that could not run at all (after the others finish); a cell that breaks down is a result (its row says
    so, in "breakdowns", and by whose cause: "breakdowns_T", "breakdowns_own").
    """
    check_argument("compare: out", out, (str, os.PathLike), "a directory path (str or pathlib.Path)")
    check_argument("compare: grid", grid, (Grid,), "a pitcheck.verbs.compare.Grid (pitcheck.verbs.compare.load_grid(path) reads "
                   "a grid file; load_grid(quick=True) is the quick grid)")
    check_argument("compare: executor", executor, (str,), "'local' or 'ray'")
    check_argument("compare: force", force, (bool,), "True or False")
    check_argument("compare: progress", progress, (bool, type(None)), "True, False or None")
    info = sweep(out, grid, executor, workers, address, force, progress, batch)
    render(out, grid, info)
    return info
