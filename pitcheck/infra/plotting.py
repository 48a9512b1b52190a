"""Figures as files: matplotlib without a display, formats chosen by suffix, and no timestamps in the
files (the same plot, the same bytes). Mechanisms only: what to draw is the verbs' business."""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from .errors import PitcheckError
from .rundir import check_out_file, write_atomic


def pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def draw_metric(ax, rows: list[dict], metric: str, label: str) -> None:
    """One metric against step on log-log axes; step 0 is drawn at 1, zeros at 1e-17; all-NaN skipped."""
    vals = np.array([r[metric] for r in rows])
    if np.isnan(vals).all():  # e.g. no shadow for the float64 reference itself
        return
    steps = np.array([max(r["step"], 1) for r in rows])
    ax.loglog(steps, np.maximum(vals, 1e-17), marker=".", label=label)


# plot --out's format follows its suffix; a path without one (/dev/null, /dev/stdout) gets a PNG
FIGURE_FORMATS = {".png": "png", ".svg": "svg", ".pdf": "pdf", "": "png"}
# no timestamps in the files: the same plot, the same bytes
FIGURE_METADATA = {"png": {"Software": None}, "svg": {"Date": None}, "pdf": {"CreationDate": None}}


def figure_format(path: Path | str, option: str = "--out") -> str:
    """The format a figure's file name asks for (png, svg or pdf, from its suffix); any other is refused."""
    suffix = Path(path).suffix.lower()
    if suffix not in FIGURE_FORMATS:
        raise PitcheckError(f"{option} {path}: cannot draw a {suffix} file; name a .png, .svg or .pdf file")
    return FIGURE_FORMATS[suffix]


DEFAULT_DPI = 110


def save_figure(plt, fig, path: Path, dpi: int = DEFAULT_DPI, fmt: str | None = None) -> Path:
    """fig to `path`, in `fmt` (png, svg or pdf; by default as its suffix says) at `dpi`."""
    fmt = fmt or figure_format(path)
    if fmt not in FIGURE_METADATA:
        raise PitcheckError(f"--format {fmt}: choose png, svg or pdf")
    if isinstance(dpi, bool) or not isinstance(dpi, int) or not 10 <= dpi <= 2400:
        raise PitcheckError(f"--dpi must be an integer from 10 to 2400, got {dpi!r}")
    buf = io.BytesIO()
    fig.savefig(buf, dpi=dpi, format=fmt, metadata=FIGURE_METADATA[fmt], bbox_inches="tight")
    plt.close(fig)
    write_atomic(path, buf.getvalue())
    return path


def check_figure_path(path: Path | str) -> Path:
    """A figure file we can write (rundir.check_out_file), of a format we draw (figure_format)."""
    path = check_out_file(path, "--out")
    figure_format(path)
    return path


def save_png_and_svg(plt, fig, out: Path, stem: str) -> list[str]:
    names = []
    for ext in ("png", "svg"):
        buf = io.BytesIO()
        meta = {"Date": None} if ext == "svg" else {"Software": None}
        fig.savefig(buf, format=ext, dpi=110, metadata=meta)
        write_atomic(out / f"{stem}.{ext}", buf.getvalue())
        names.append(f"{stem}.{ext}")
    plt.close(fig)
    return names
