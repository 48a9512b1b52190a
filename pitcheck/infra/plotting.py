"""Figures as files: matplotlib without a display, one style for every figure (sizes in points for a paper's
column), formats chosen by suffix, and no timestamps in the files (the same plot, the same bytes). Mechanisms
only: what to draw is the verbs' business."""
from __future__ import annotations

import io
import math
from pathlib import Path

import numpy as np

from .errors import PitcheckError
from .rundir import check_out_file, write_atomic

# A figure is drawn at the width it is printed at, so that its points are the reader's points: one column
# of a two-column paper (3.3 in) or the page's two (7 in). The sizes below are for those widths.
COLUMN_WIDTH = 3.3  # inches
PAGE_WIDTH = 7.0  # inches
TEXT_PT = 8  # axis labels, panel titles, notes
TITLE_PT = 9  # a figure's title
SMALL_PT = 7  # tick labels and legends; nothing in a figure is smaller
MIN_PT = SMALL_PT

STYLE = {
    "font.size": TEXT_PT,
    "axes.titlesize": TEXT_PT,
    "axes.labelsize": TEXT_PT,
    "figure.titlesize": TITLE_PT,
    "xtick.labelsize": SMALL_PT,
    "ytick.labelsize": SMALL_PT,
    "legend.fontsize": SMALL_PT,
    "legend.title_fontsize": SMALL_PT,
    "axes.linewidth": 0.6,
    "grid.linewidth": 0.4,
    "lines.linewidth": 1.0,
    "lines.markersize": 3.5,
    "xtick.major.width": 0.6,
    "ytick.major.width": 0.6,
    "xtick.minor.width": 0.4,
    "ytick.minor.width": 0.4,
    "legend.handlelength": 1.6,
    "figure.figsize": (COLUMN_WIDTH, 2.4),
    "svg.hashsalt": "pitcheck",  # the same plot, the same SVG bytes
}


def pyplot():
    """matplotlib.pyplot for files (no display), with STYLE set: every figure pitcheck draws starts here."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    plt.rcParams.update(STYLE)
    return plt


def readable(fig) -> None:
    """No text of `fig` under MIN_PT: a size a figure's code asked for below it is raised to it."""
    from matplotlib.text import Text

    for text in fig.findobj(Text):
        if text.get_fontsize() < MIN_PT:
            text.set_fontsize(MIN_PT)


def draw_metric(ax, rows: list[dict], metric: str, label: str, **style) -> None:
    """One metric against step on log-log axes; step 0 is drawn at 1, zeros at 1e-17; all-NaN skipped."""
    vals = np.array([r[metric] for r in rows])
    if np.isnan(vals).all():  # e.g. no shadow for the float64 reference itself
        return
    steps = np.array([max(r["step"], 1) for r in rows])
    ax.loglog(steps, np.maximum(vals, 1e-17), **{"marker": ".", **style}, label=label)


def plain_ticks_within_a_decade(ax) -> None:
    """A log axis with fewer than two powers of ten in its range gets a few plain numbers on its ticks (0.084,
    or 0.1 0.2 0.5; not 8.4 x 10^-2 on every minor tick): within one decade about four evenly spaced, else at
    1, 2 and 5 times a power of ten. An axis with two or more keeps its powers of ten."""
    from matplotlib.ticker import FormatStrFormatter, LogLocator, MaxNLocator, NullFormatter

    for axis, scale, (low, high) in ((ax.xaxis, ax.get_xscale(), ax.get_xlim()),
                                     (ax.yaxis, ax.get_yscale(), ax.get_ylim())):
        if scale != "log" or not 0 < low < high:
            continue
        powers = math.floor(math.log10(high)) - math.ceil(math.log10(low)) + 1
        if powers >= 2:
            continue
        axis.set_major_locator(MaxNLocator(4) if high < 10 * low else LogLocator(subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(FormatStrFormatter("%g"))
        axis.set_minor_formatter(NullFormatter())


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
    readable(fig)
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


def save_png_and_svg(plt, fig, out: Path, stem: str, dpi: int = DEFAULT_DPI) -> list[str]:
    """fig as out/stem.png (at `dpi`) and out/stem.svg, cropped to what is drawn (a legend outside the axes
    included); returns the two names."""
    readable(fig)
    names = []
    for ext in ("png", "svg"):
        buf = io.BytesIO()
        fig.savefig(buf, format=ext, dpi=dpi, metadata=FIGURE_METADATA[ext], bbox_inches="tight", pad_inches=0.03)
        write_atomic(out / f"{stem}.{ext}", buf.getvalue())
        names.append(f"{stem}.{ext}")
    plt.close(fig)
    return names
