"""`pitcheck compare`: a grid of runs, a verdict per precision, summary.csv, report.md and plots."""
from __future__ import annotations

import argparse

from ..infra.errors import PitcheckError
from ..infra.executors import EXECUTORS
from ..verbs.compare import (DEFAULT_BATCH, MAX_CELLS, Grid, compare, load_grid, override, own_breakdowns, parse_shape,
                     t_instability_lines, table_lines, verdict_lines)

NEEDS_TORCH = True
DEFAULT_OUT = "pitcheck-out/compare"
EXIT_STATUS = ("Exit status: 0 when the study ran, whatever its cells did (a cell that broke down is a result: "
               "its row and the verdict say so); 2 for bad input or a cell that could not run; when interrupted, "
               "2 while cells run (each saved its last step: the same command resumes), 130 at any other moment.")


def add_parser(sub) -> argparse.ArgumentParser:
    c = sub.add_parser("compare", help="sweep a grid of runs (retraction x precision x ...): a verdict, "
                       "summary.csv, report.md and plots",
                       epilog=EXIT_STATUS)
    add_compare_options(c)
    return c


def add_compare_options(c: argparse.ArgumentParser) -> None:
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
    c.add_argument("--shards", default=None, help="a shards axis (comma-separated rank counts, e.g. 1,2: Z "
                   "row-sharded over that many gloo ranks, as `pitcheck run --shards`)")
    c.add_argument("--steps", type=int, default=None, help="override the grid's steps")
    # one value for an axis, as `pitcheck run` takes them
    c.add_argument("--vocab", type=int, default=None, help="V of every cell (D: --dim or the grid's)")
    c.add_argument("--dim", type=int, default=None, help="D of every cell (V: --vocab or the grid's)")
    c.add_argument("--seed", type=int, default=None, help="one seed (same as --seeds N)")
    c.add_argument("--adversary", default=None, help="one gradient model spec, e.g. gaussian,spike (summed)")
    c.add_argument("--optimizer", default=None, help="one optimizer for every cell")
    c.add_argument("--lr", type=float, default=None, help="one learning rate for every cell")
    c.add_argument("--out", default=DEFAULT_OUT, help=f"output directory (default {DEFAULT_OUT}, under the "
                   "current directory)")
    c.add_argument("--batch", type=int, default=DEFAULT_BATCH, metavar="N",
                   help=f"step up to N cells of one shape, precision and retraction together (default "
                   f"{DEFAULT_BATCH}; 1: every cell alone); each keeps its own files and numbers")
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
            "shards": _list(getattr(args, "shards", None), "--shards", int),
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


def main(args) -> int:
    """The `compare` verb: prints the verdict and the table; 0 when the study ran (breakdowns are results)."""
    progress = False if args.no_progress else None
    grid = grid_from_args(args)
    info = compare(args.out, grid, args.executor, args.workers, args.address, args.force, progress,
                   getattr(args, "batch", DEFAULT_BATCH))
    rows = info["rows"]
    print("\n".join(verdict_lines(rows)))
    print("\n".join([""] + t_instability_lines(rows)))
    print()
    print("\n".join(table_lines(rows)))
    print(f"\n{info['cells']} cells ({info['computed']} computed; wall {info['wall_seconds']:.1f} s, cell time "
          f"{info['cell_seconds']:.1f} s) -> {args.out}/summary.csv, {args.out}/report.md, plots "
          f"(growth, retractions, cost; PNG and SVG) in {args.out}")
    broke = sum(r["breakdowns"] for r in rows)
    if broke:
        own = sum(own_breakdowns(r) for r in rows)
        print(f"{broke} of {info['cells']} runs broke down, kept as results: {own} counted against their "
              f"retraction, {broke - own} not the retraction's (T blew up, or every retraction broke down)")
    return 0
