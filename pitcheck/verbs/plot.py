"""`pitcheck plot`: any metrics of any run directories against step, one panel per metric."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..infra.errors import PitcheckError
from ..infra.plotting import DEFAULT_DPI, check_figure_path, draw_metric, pyplot, save_figure
from ..infra.rundir import METRIC_COLUMNS, check_out_file, read_metrics


def plot_runs(run_dirs: list[Path | str], out_png: Path | str, metrics: list[str], dpi: int = DEFAULT_DPI,
              fmt: str | None = None) -> Path:
    """Any metrics of any runs against step, one panel per metric, a line per run; a PNG, SVG or PDF file
    as `fmt` (default: out_png's suffix) says, at `dpi`. The legend sits below the panels, off the data."""
    out_png = check_out_file(out_png, "--out") if fmt else check_figure_path(out_png)
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
    # a metric a run does not record (a baseline head has no T, a numpy run no shadow) is all NaN there
    lacking = {m: [name for name, rows in runs if np.isnan([r[m] for r in rows]).all()] for m in metrics}
    empty = [m for m in metrics if len(lacking[m]) == len(runs)]
    if empty:
        raise PitcheckError(f"no run given records {', '.join(empty)} (all NaN: not applicable to these runs); "
                            "leave it out of --metrics")
    plt = pyplot()
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics), 3.6), squeeze=False)
    for name, rows in runs:
        for ax, metric in zip(axes[0], metrics):
            draw_metric(ax, rows, metric, name)
            ax.set_title(metric)
            ax.set_xlabel("step")
    for ax, metric in zip(axes[0], metrics):
        if lacking[metric]:  # said in the panel, not left for the reader to find missing
            ax.text(0.02, 0.02, "not recorded: " + ", ".join(lacking[metric]), transform=ax.transAxes, fontsize=6)
    # the legend where every run has a line: the first panel may lack a baseline's
    legend_ax = next((ax for ax, m in zip(axes[0], metrics) if not lacking[m]), axes[0][0])
    handles, labels = legend_ax.get_legend_handles_labels()
    fig.tight_layout()
    # below the panels, never over a curve
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=min(len(labels), 3), fontsize=8,
               frameon=False)
    return save_figure(plt, fig, Path(out_png), dpi=dpi, fmt=fmt)
