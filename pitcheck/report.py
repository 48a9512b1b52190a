"""Comparisons across retractions and precisions: a grid of runs, a summary table and plots."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np

from .errors import PitcheckError
from .policy import get_policy
from .retractions import get_retraction
from .trajectory import RunConfig, _write_atomic, read_events, read_metrics, run

SUMMARY_COLUMNS = ["precision", "retraction", "orthonormality", "pinv_drift", "penrose", "trisolve_backward_ratio",
                   "shadow_Z", "cond_T", "events"]


def run_dir_name(precision: str, retraction: str) -> str:
    return f"{precision}-{retraction}"


def compare(out: Path | str, base: RunConfig, precisions: list[str], retractions: list[str],
            progress: bool | None = None) -> list[dict]:
    """Run every precision x retraction (resuming finished or interrupted runs) and summarise them."""
    out = Path(out)
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
            rows = run(cfg, rdir, resume=True, progress=progress)
            last = rows[-1]
            n_events = len([e for e in read_events(rdir / "events.jsonl") if e["event"] != "threshold_crossed"])
            values = {k: (last[k] if np.isfinite(last[k]) else None) for k in SUMMARY_COLUMNS[2:-1]}
            summary.append({"precision": precision, "retraction": retraction, **values, "events": n_events})
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
    _write_atomic(out / "report.md", ("\n".join(lines) + "\n").encode())
    _write_atomic(out / "summary.json", (json.dumps(summary, indent=2) + "\n").encode())


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
    tmp = path.with_name(path.name + ".tmp")
    fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    tmp.replace(path)
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
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics), 3.6), squeeze=False)
    for d in run_dirs:
        path = Path(d) / "metrics.csv"
        if not path.exists():
            raise PitcheckError(f"{d} is not a run directory (no metrics.csv)")
        rows = read_metrics(path)
        for ax, metric in zip(axes[0], metrics):
            if metric not in rows[0]:
                raise PitcheckError(f"unknown metric {metric!r}; columns are {', '.join(rows[0])}")
            _draw(ax, rows, metric, Path(d).name)
            ax.set_title(metric)
            ax.set_xlabel("step")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    return _save_figure(plt, fig, Path(out_png))
