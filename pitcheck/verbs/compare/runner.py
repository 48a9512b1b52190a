"""Running a sweep: every cell not yet finished, through an executor, then the summary and the record of
how long it took (timing.json, every invocation that computed something)."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from ...infra.errors import PitcheckError
from ...infra.executors import EXECUTORS, check_workers, map_tasks
from ...infra.progress import Progress
from ...infra.rundir import COMMIT, RUN_FILES, check_out_path, write_atomic
from .batches import DEFAULT_BATCH, batch_tasks, check_batch, run_task
from .cells import cell_dir, cells, cost_path, finished, needs_gpu
from .grid import Grid
from .summary import COST_COLUMNS, SUMMARY_COLUMNS, sharded_columns, summarise, summary_csv


def sweep(out: Path | str, grid: Grid, executor: str = "local", workers: int | None = None,
          address: str | None = None, force: bool = False, progress: bool | None = None,
          batch: int = DEFAULT_BATCH) -> dict:
    """Run every cell of the grid that is not finished (all of them with `force`), then summarise.

    batch: at most this many cells of one shape, precision and retraction stepped together (batches.py;
    1: every cell alone); their files and numbers are those of cells run alone.

    Returns {"rows": summary rows, "cells": n, "computed": n, "wall_seconds": s, "cell_seconds": s,
    "errors": [...]}. A cell that breaks down is a result (its row says so); a cell that cannot run at
    all (a directory it must not touch, say) is an error, and the sweep raises after the others finish.
    """
    if executor not in EXECUTORS:
        raise PitcheckError(f"unknown executor {executor!r}; choose from {', '.join(EXECUTORS)}")
    if workers is not None:
        check_workers(workers)
    check_batch(batch)
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
    bar = Progress(len(all_cells), "compare", progress, done=len(all_cells) - len(todo), unit=" cells", eta=True,
                   pad=130, min_interval=0)
    bar.update(bar.done)
    results = []

    def on_result(task_results: list[dict]) -> None:
        for result in task_results:  # a batch's cells, or one cell
            results.append(result)
            bar.advance(result["name"].rsplit("-", 1)[0][:60])  # the cell's name without its hash

    t0 = time.perf_counter()
    try:
        map_tasks(run_task, batch_tasks(tasks, batch), on_result, executor, workers=workers, address=address,
                  needs_gpu=needs_gpu)
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
    write_atomic(out / "summary.csv", summary_csv(rows, sharded_columns(SUMMARY_COLUMNS, grid)))
    write_atomic(out / "cost.csv", summary_csv(rows, sharded_columns(COST_COLUMNS, grid)))
    used = min(check_workers(workers), max(1, len(todo))) if executor == "local" else (workers or "cluster's")
    timing = {"executor": executor, "workers": used, "batch": batch, "cells": len(all_cells), "computed": len(todo),
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

