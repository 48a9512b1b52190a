"""`pitcheck plot`: any metrics of any run directories against step, one panel per metric."""
from __future__ import annotations

from pathlib import Path

from .errors import PitcheckError
from .plotting import check_figure_path, draw_metric, pyplot, save_figure
from .rundir import METRIC_COLUMNS, read_metrics


def plot_runs(run_dirs: list[Path | str], out_png: Path | str, metrics: list[str]) -> Path:
    """Any metrics of any runs against step, one panel per metric, a line per run; a PNG, SVG or PDF file
    as out_png's suffix says."""
    out_png = check_figure_path(out_png)
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
    plt = pyplot()
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics), 3.6), squeeze=False)
    for name, rows in runs:
        for ax, metric in zip(axes[0], metrics):
            draw_metric(ax, rows, metric, name)
            ax.set_title(metric)
            ax.set_xlabel("step")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    return save_figure(plt, fig, Path(out_png))
