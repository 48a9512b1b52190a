"""The SmolLM2 continued-pretraining study: tied, untied and PIT heads (one run directory each, on the
same batches), then one table and one figure of held-out loss and the interface metrics per step."""
from __future__ import annotations

import csv
import io
import time
from pathlib import Path

from ...infra.errors import PitcheckError
from ...infra.plotting import pyplot, save_png_and_svg
from ...infra.rundir import write_atomic
from .continued import COLUMNS, ContinuedConfig, continued, read_rows

STUDY_HEADS = (("tied", ""), ("untied", ""), ("pit", "qr"), ("pit", "cholqr2"))


def run_label(config: ContinuedConfig) -> str:
    return f"{config.label()}_{config.precision}"


def run_study(runs: Path | str, precisions=("fp32",), heads=STUDY_HEADS, progress=None, **options) -> dict:
    """Train each head in each precision under RUNS/<head>_<precision> (resuming what is there);
    returns {label: seconds taken by this call}."""
    from .body import load_smollm2

    seconds = {}
    for precision in precisions:
        for head, retraction in heads:
            config = ContinuedConfig(head=head, retraction=retraction or "qr", precision=precision, **options)
            start = time.monotonic()
            continued(Path(runs) / run_label(config), config, model=load_smollm2(), progress=progress)
            seconds[run_label(config)] = time.monotonic() - start
    return seconds


def collect(runs: Path | str) -> dict[str, list[dict]]:
    found = {p.name: read_rows(p / "metrics.csv") for p in sorted(Path(runs).iterdir()) if (p / "metrics.csv").is_file()}
    if not found:
        raise PitcheckError(f"{runs} holds no continued-pretraining runs")
    return found


def summary_csv(curves: dict[str, list[dict]]) -> bytes:
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(["run"] + COLUMNS)
    for label, rows in curves.items():
        for r in rows:
            w.writerow([label] + [r["step"]] + [repr(float(r[k])) for k in COLUMNS[1:]])
    return out.getvalue().encode()


def plot_study(out: Path, curves: dict[str, list[dict]]) -> list[str]:
    plt = pyplot()
    panels = (("heldout_loss", "held-out loss (nats/token)", False), ("pinv_drift", "||W E - I||_F", True),
              ("orthonormality", "||Z^T Z - I||_F (PIT)", True))
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.8))
    for ax, (key, title, log) in zip(axes, panels):
        for label, rows in curves.items():
            pts = [(r["step"], r[key]) for r in rows if r[key] == r[key]]
            if pts:
                ax.plot(*zip(*pts), marker="o", ms=3, label=label)
        ax.set_title(title)
        ax.set_xlabel("step")
        if log:
            ax.set_yscale("log")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    return save_png_and_svg(plt, fig, out, "smollm2")


def read_summary(path: Path | str) -> dict[str, list[dict]]:
    """The curves of a committed study's smollm2.csv (the inverse of summary_csv)."""
    curves: dict[str, list[dict]] = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            label = row.pop("run")
            curves.setdefault(label, []).append({k: (int(v) if k == "step" else float(v)) for k, v in row.items()})
    if not curves:
        raise PitcheckError(f"{path} holds no study rows")
    return curves


def write_study(out: Path | str, runs: Path | str, also: Path | str | None = None) -> list[str]:
    """OUT/smollm2.csv (every recorded row of every run) and OUT/smollm2.png/.svg; with `also` (another
    study's smollm2.csv, e.g. the same heads in another precision), the figure draws its curves too."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    curves = collect(runs)
    write_atomic(out / "smollm2.csv", summary_csv(curves))
    drawn = {**read_summary(also), **curves} if also else curves
    return [str(out / "smollm2.csv")] + plot_study(out, drawn)
