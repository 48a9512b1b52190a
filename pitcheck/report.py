"""Comparisons across retractions and precisions: a grid of runs, a summary table and plots."""
from __future__ import annotations

import io
import json
import os
from dataclasses import replace
from pathlib import Path

import numpy as np

from .errors import PitcheckError
from .policy import get_policy
from .retractions import get_retraction
from .rundir import check_out_path, write_atomic
from .trajectory import METRIC_COLUMNS, RunBreakdown, RunConfig, read_events, read_metrics, run

SUMMARY_COLUMNS = ["precision", "retraction", "orthonormality", "pinv_drift", "penrose", "trisolve_backward_ratio",
                   "shadow_Z", "cond_T", "events"]


def run_dir_name(precision: str, retraction: str) -> str:
    return f"{precision}-{retraction}"


def compare(out: Path | str, base: RunConfig, precisions: list[str], retractions: list[str],
            progress: bool | None = None, force: bool = False) -> list[dict]:
    """Run every precision x retraction (resuming finished or interrupted runs) and summarise them.

    Each cell is a run directory with the guarantees of `run`: a cell holding a different or longer run
    is refused (unless `force`, which starts every cell over). A cell whose state breaks down keeps its
    last good values and a 'breakdown_step'; the grid goes on.
    """
    out = check_out_path(out)
    for name, values in (("--precisions", precisions), ("--retractions", retractions)):
        if not values or any(not v for v in values) or len(set(values)) != len(values):
            raise PitcheckError(f"{name} must be a comma-separated list of distinct names, got {','.join(values)!r}")
    for p in precisions:
        get_policy(p)
    for r in retractions:
        get_retraction(r)
    summary = []
    for precision in precisions:
        for retraction in retractions:
            backend = "numpy" if precision == "fp64" else "torch"
            cfg = replace(base, backend=backend, precision=precision, retraction=retraction)
            rdir = out / "runs" / run_dir_name(precision, retraction)
            broke = None
            try:
                rows = run(cfg, rdir, resume=not force, progress=progress, force=force)
            except RunBreakdown:
                rows = read_metrics(rdir / "metrics.csv")
                broke = read_events(rdir / "events.jsonl")[-1]["step"]
            last = rows[-1]
            n_events = len([e for e in read_events(rdir / "events.jsonl") if e["event"] != "threshold_crossed"])
            values = {k: (last[k] if np.isfinite(last[k]) else None) for k in SUMMARY_COLUMNS[2:-1]}
            summary.append({"precision": precision, "retraction": retraction, **values, "events": n_events})
            if broke is not None:
                summary[-1]["breakdown_step"] = broke
    write_summary(out, base, summary)
    plot_grid(out, precisions, retractions)
    return summary


def write_summary(out: Path, base: RunConfig, summary: list[dict]) -> None:
    lines = [
        f"# pitcheck compare: V={base.vocab}, D={base.dim}, {base.steps} steps, adversary {base.adversary}, "
        f"{base.optimizer} lr={base.lr:g}, seed {base.seed}",
        "",
        "Values at the last step. orthonormality = ||Z^T Z - I||_F and pinv_drift = ||W E - I||_F on the",
        "values the model stores; trisolve_backward_ratio in units of the precision's u (about 1 is",
        "backward stable; LAPACK passes below 30); shadow_Z = relative distance of Z from the float64",
        "trajectory driven by the same gradients (- for the float64 reference itself); events = skipped",
        "steps, overflows, re-projections, failed retractions.",
        "",
        "| " + " | ".join(SUMMARY_COLUMNS) + " |",
        "|" + "---|" * len(SUMMARY_COLUMNS),
    ]
    for row in summary:
        cells = [row["precision"], row["retraction"]]
        cells += [f"{row[k]:.2e}" if row[k] is not None else "-" for k in SUMMARY_COLUMNS[2:-1]]
        cells.append(str(row["events"]))
        lines.append("| " + " | ".join(cells) + " |")
    broken = [r for r in summary if "breakdown_step" in r]
    if broken:
        lines += ["", "Broke down (values at the last good step; see the run's events.jsonl): " + ", ".join(
            f"{r['precision']} {r['retraction']} at step {r['breakdown_step']}" for r in broken) + "."]
    write_atomic(out / "report.md", ("\n".join(lines) + "\n").encode())
    write_atomic(out / "summary.json", (json.dumps(summary, indent=2) + "\n").encode())


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def _draw(ax, rows: list[dict], metric: str, label: str) -> None:
    """One metric against step on log-log axes; step 0 is drawn at 1, zeros at 1e-17; all-NaN skipped."""
    vals = np.array([r[metric] for r in rows])
    if np.isnan(vals).all():  # e.g. no shadow for the float64 reference itself
        return
    steps = np.array([max(r["step"], 1) for r in rows])
    ax.loglog(steps, np.maximum(vals, 1e-17), marker=".", label=label)


def _save_figure(plt, fig, path: Path) -> Path:
    buf = io.BytesIO()
    fig.savefig(buf, dpi=110, format="png")
    plt.close(fig)
    write_atomic(path, buf.getvalue())
    return path


def check_png_path(path: Path | str) -> Path:
    """A file we can write: not '', not a directory, in a directory that exists and is writable."""
    if str(path).strip() == "":
        raise PitcheckError("--out is empty: name a PNG file")
    path = Path(path)
    if path.is_dir():
        raise PitcheckError(f"--out {path} is a directory; name a PNG file in it")
    parent = path.parent
    if not parent.is_dir():
        raise PitcheckError(f"--out {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise PitcheckError(f"--out {path}: directory {parent} is not writable")
    return path


def plot_grid(out: Path, precisions: list[str], retractions: list[str]) -> Path:
    """Orthonormality loss, pinv drift and distance from the float64 shadow against step: one panel per
    precision, a line per retraction."""
    plt = _pyplot()
    metrics = [("orthonormality", "||Z^T Z - I||_F"), ("pinv_drift", "||W E - I||_F")]
    if any(p != "fp64" for p in precisions):
        metrics.append(("shadow_Z", "distance from fp64 run"))
    fig, axes = plt.subplots(len(metrics), len(precisions), figsize=(3.2 * len(precisions), 2.7 * len(metrics)),
                             sharex=True, sharey="row", squeeze=False)
    for j, precision in enumerate(precisions):
        u = get_policy(precision).u
        for i, (metric, label) in enumerate(metrics):
            ax = axes[i][j]
            if metric == "shadow_Z" and precision == "fp64":
                ax.text(0.5, 0.5, "float64 reference:\nno shadow", transform=ax.transAxes, ha="center")
            for retraction in retractions:
                rows = read_metrics(out / "runs" / run_dir_name(precision, retraction) / "metrics.csv")
                _draw(ax, rows, metric, retraction)
            ax.axhline(u, color="grey", lw=0.8, ls="--")
            ax.text(1, u, " u", va="bottom", fontsize=7, color="grey")
            if i == 0:
                ax.set_title(precision)
            if j == 0:
                ax.set_ylabel(label)
            if i == len(metrics) - 1:
                ax.set_xlabel("step (0 drawn at 1)")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    return _save_figure(plt, fig, out / "compare.png")


def plot_runs(run_dirs: list[Path | str], out_png: Path | str, metrics: list[str]) -> Path:
    """Any metrics of any runs against step, one panel per metric, a line per run."""
    out_png = check_png_path(out_png)
    unknown = [m for m in metrics if m not in METRIC_COLUMNS[1:]]
    if not metrics or unknown:
        raise PitcheckError(f"unknown metric {', '.join(unknown) or '(none given)'}; "
                            f"choose from {', '.join(METRIC_COLUMNS[1:])}")
    runs = []
    for d in run_dirs:
        path = Path(d) / "metrics.csv"
        if not path.is_file():
            raise PitcheckError(f"{d} is not a run directory (no metrics.csv)")
        rows = read_metrics(path)
        missing = [m for m in metrics if m not in (rows[0] if rows else {})]
        if not rows or missing:
            raise PitcheckError(f"{path} has {'no rows' if not rows else 'no column ' + ', '.join(missing)}")
        runs.append((Path(d).name, rows))
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics), 3.6), squeeze=False)
    for name, rows in runs:
        for ax, metric in zip(axes[0], metrics):
            _draw(ax, rows, metric, name)
            ax.set_title(metric)
            ax.set_xlabel("step")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    return _save_figure(plt, fig, Path(out_png))
