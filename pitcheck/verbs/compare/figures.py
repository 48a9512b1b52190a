"""A sweep's figures, drawn at a paper's page width in the style of pitcheck.infra.plotting: growth (per
retraction, ||Z^T Z - I||_F over steps above ||W E - I||_F over steps, a curve per precision), retractions
(the same per precision, a curve per retraction) and cost (ms per step against accuracy)."""
from __future__ import annotations

import itertools
import math
import re
from pathlib import Path

import numpy as np

from ...infra.plotting import (COLUMN_WIDTH, PAGE_WIDTH, SMALL_PT, TITLE_PT, plain_ticks_within_a_decade, pyplot,
                               save_png_and_svg)
from ...infra.rundir import read_metrics
from ...trajectory.plan import head_named
from ...model.retractions import RECORDS, PlotStyle
from ...numerics.policy import precision_style
from .cells import Cell, cell_dir, cells
from .grid import Grid, axis_values, parse_shape
from .verdict import judge

# the PNGs of a report are read on screens and printed: 7 in at 200 dpi is 1400 pixels across
REPORT_DPI = 200
PANEL_COLUMNS = 4
ORTHO = r"$\Vert Z^{\top}Z - I\Vert_F$"
DRIFT = r"$\Vert WE - I\Vert_F$"
CLIP_LOW, CLIP_HIGH = 1e-17, 1e2  # zeros drawn at 1e-17; a diverging cell clipped at 100, above any use
# the metrics.csv columns the growth figure draws: Z's orthonormality and the tie W E = I (pinv drift)
CURVE_METRICS = ("orthonormality", "pinv_drift")
FIGURES = ("growth", "retractions", "cost")  # SweepFigures' methods, each drawing the figure of that name


def retraction_style(name: str) -> PlotStyle:
    """The registry's style of a retraction; a baseline head's row ('-': no retraction) is drawn as 'none'."""
    return RECORDS["none" if name == "-" else name].style


def curves(out: Path, all_cells: list[Cell]) -> dict:
    """group -> {"steps": steps, metric: (median, min, max) over the seeds} for each of CURVE_METRICS, on the
    steps all seeds have."""
    by_group: dict[tuple, list] = {}
    for c in all_cells:
        by_group.setdefault(c.group, []).append(read_metrics(cell_dir(out, c) / "metrics.csv"))
    result = {}
    for group, runs in by_group.items():
        n = min(len(r) for r in runs)
        result[group] = {"steps": np.array([max(r["step"], 1) for r in runs[0][:n]])}
        for metric in CURVE_METRICS:
            vals = np.array([[x[metric] for x in r[:n]] for r in runs])
            result[group][metric] = (np.median(vals, 0), vals.min(0), vals.max(0))
    return result


def figure_width(panels: int) -> float:
    """A column's width for one panel, 5 in for two, the page's for three or more."""
    return COLUMN_WIDTH if panels == 1 else 5.0 if panels == 2 else PAGE_WIDTH


def legend_columns(names: list[str], width: float) -> int:
    """As many legend columns as fit `width` inches with the longest name."""
    longest = max((len(n) for n in names), default=1)
    return max(1, min(len(names), int(width * 72 / (0.55 * SMALL_PT * longest + 2.5 * SMALL_PT))))


def wrap(text: str, width: float, pt: float = TITLE_PT) -> str:
    """text in lines that fit `width` inches at `pt` points, broken between words, never inside a $...$
    formula (mathtext cannot span lines); '\n' in text kept."""
    chars = int(width * 72 / (0.55 * pt))
    lines = []
    for paragraph in text.split("\n"):
        words: list[str] = []
        for word in paragraph.split(" "):
            if words and words[-1].count("$") % 2:  # inside a formula: the word joins it
                words[-1] += " " + word
            else:
                words.append(word)
        line, shown = "", 0
        for word in words:
            if line and shown + 1 + shown_length(word) > chars:
                lines.append(line)
                line, shown = word, shown_length(word)
            else:
                line, shown = (f"{line} {word}", shown + 1 + shown_length(word)) if line else (word, shown_length(word))
        lines.append(line)
    return "\n".join(lines)


def shown_length(word: str) -> int:
    """About how many characters `word` shows: a mathtext command (\\Vert) one, braces, ^, _ and $ none."""
    return len(re.sub(r"\\[A-Za-z]+", "x", re.sub(r"[{}^_$]", "", word))) if "$" in word else len(word)


def clip_y(ax) -> None:
    low, high = ax.get_ylim()
    ax.set_ylim(max(low, CLIP_LOW), min(high, CLIP_HIGH))


def draw_band(ax, steps, band, colour, marker, label) -> object:
    med, lo, hi = (np.maximum(v, CLIP_LOW) for v in band)
    (line,) = ax.loglog(steps, med, color=colour, label=label, marker=marker,
                        markevery=max(1, len(steps) // 6), ms=3)
    ax.fill_between(steps, lo, hi, color=colour, alpha=0.2, lw=0)
    return line


def pair_axes(plt, n: int, width: float, shared: bool):
    """For each of n panels, a pair of log-log axes: ||Z^T Z - I||_F above ||W E - I||_F, sharing the step
    axis; PANEL_COLUMNS pairs to a row. shared: every upper axis shares one y axis and every lower one
    another (labelled in the first column only); else each has its own."""
    ncols = min(PANEL_COLUMNS, n)
    nrows = -(-n // ncols)
    fig, grid = plt.subplots(2 * nrows, ncols, figsize=(width, 2.5 * nrows + 1.2), sharex=True, squeeze=False,
                             layout="constrained", gridspec_kw={"height_ratios": [1.15, 1.0] * nrows})
    pairs = []
    for k in range(nrows * ncols):
        top, bottom = grid[2 * (k // ncols)][k % ncols], grid[2 * (k // ncols) + 1][k % ncols]
        if k >= n:
            top.set_visible(False)
            bottom.set_visible(False)
            continue
        if pairs and shared:
            top.sharey(pairs[0][0])
            bottom.sharey(pairs[0][1])
        for ax in (top, bottom):
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.grid(True, which="major", alpha=0.3)
        top.xaxis.set_tick_params(labelbottom=False)
        bottom.xaxis.set_tick_params(labelbottom=True)
        if k % ncols == 0:
            top.set_ylabel(ORTHO)
            bottom.set_ylabel(DRIFT)
        elif shared:
            top.yaxis.set_tick_params(labelleft=False)
            bottom.yaxis.set_tick_params(labelleft=False)
        if k + ncols >= n:
            bottom.set_xlabel("step (0 drawn at 1)")
        pairs.append((top, bottom))
    return fig, pairs



def draw_pair(top, bottom, curves: dict, style, label: str, handles: dict) -> None:
    """One curve's ||Z^T Z - I||_F band in the upper panel and its ||W E - I||_F band in the lower; the upper
    band's handle kept for the figure's one legend (the first of each label)."""
    handles.setdefault(label, draw_band(top, curves["steps"], curves["orthonormality"], style.colour, style.marker,
                                        label))
    draw_band(bottom, curves["steps"], curves["pinv_drift"], style.colour, style.marker, label)

class SweepFigures:
    """The three figures of one sweep's cells on disk, each showing the first value of every grid axis but
    retraction, precision and adversary."""

    def __init__(self, out: Path, grid: Grid, rows: list[dict]):
        self.out, self.grid, self.rows = out, grid, rows
        self.data = curves(out, cells(grid))
        self.by_key = {(r["retraction"], r["precision"], r["adversary"], r["optimizer"], r["lr"], r["head"],
                        r["vocab"], r["dim"], r["shards"]): r for r in rows}
        self.first = {k: axis_values(grid, k)[0] for k in ("optimizer", "lr", "head", "shards")}
        self.shape = parse_shape(grid.axes["shape"][0])
        self.retraction_axis = list(grid.axes["retraction"]) if head_named(self.first["head"]).has_retraction else ["-"]
        self.precisions, self.adversaries = grid.axes["precision"], grid.axes["adversary"]
        shards = f", {self.first['shards']} shards" if len(axis_values(grid, "shards")) > 1 else ""
        self.fixed_note = (f"{self.first['optimizer']} lr={self.first['lr']:g}, head {self.first['head']}, "
                           f"V x D = {self.shape[0]} x {self.shape[1]}{shards}, {grid.steps} steps; "
                           "median over seeds, band = min-max")

    def key(self, ret, prec, adv) -> tuple:
        f = self.first
        return (ret, prec, adv, f["optimizer"], f["lr"], f["head"], *self.shape, f["shards"])

    def title(self, name: str, adv: str) -> str:
        return name + (f"\n{adv}" if len(self.adversaries) > 1 else "")

    def growth(self, plt):
        """Per retraction (and adversary), ||Z^T Z - I||_F above ||W E - I||_F against step, a curve per
        precision: a precision whose Z is at its floor but whose tie has broken (an FP8 logits GEMM) shows it
        in the lower panel. One legend of the precisions, under the figure."""
        pairs = list(itertools.product(self.adversaries, self.retraction_axis))
        width = figure_width(len(pairs))
        fig, axes = pair_axes(plt, len(pairs), width, shared=True)
        handles = {}
        for (top, bottom), (adv, ret) in zip(axes, pairs):
            for prec in self.precisions:
                k = self.key(ret, prec, adv)
                if k not in self.data:
                    continue
                style = precision_style(prec)
                draw_pair(top, bottom, self.data[k], style, prec, handles)
                top.axhline(self.by_key[k]["floor"], color=style.colour, ls="--", lw=0.7)
            top.set_title(self.title(ret, adv))
        for top, bottom in axes[:1]:
            clip_y(top)
            clip_y(bottom)
        fig.suptitle(wrap(f"Per retraction: {ORTHO} (upper panel; dashed: each precision's storage floor) and "
                          f"{DRIFT}, the pinv drift (lower panel), against step; growth exponents in report.md's "
                          f"table.\n{self.fixed_note}", width))
        fig.legend(list(handles.values()), list(handles), loc="outside lower center",
                   ncol=legend_columns(list(handles), width), title="precision", frameon=False)
        return fig

    def retractions(self, plt):
        """Per precision (and adversary), ||Z^T Z - I||_F above ||W E - I||_F against step, a curve per
        retraction, each panel on its own scale; one legend of the retractions, under the figure."""
        pairs = list(itertools.product(self.adversaries, self.precisions))
        width = figure_width(len(pairs))
        fig, axes = pair_axes(plt, len(pairs), width, shared=False)
        handles = {}
        for (top, bottom), (adv, prec) in zip(axes, pairs):
            floor = None
            for ret in self.retraction_axis:
                k = self.key(ret, prec, adv)
                if k not in self.data:
                    continue
                draw_pair(top, bottom, self.data[k], retraction_style(ret), ret, handles)
                floor = self.by_key[k]["floor"]
            if floor is not None:
                top.axhline(floor, color="black", ls="--", lw=0.7)
            top.set_title(self.title(prec, adv))
            for ax in (top, bottom):
                clip_y(ax)
                plain_ticks_within_a_decade(ax)
        fig.suptitle(wrap(f"Retractions per precision: {ORTHO} (upper panel; dashed: the precision's storage "
                          f"floor) and {DRIFT}, the pinv drift (lower panel), against step.\n{self.fixed_note}",
                          width))
        fig.legend(list(handles.values()), list(handles), loc="outside lower center",
                   ncol=legend_columns(list(handles), width), title="retraction", frameon=False)
        return fig

    def cost(self, plt):
        """Every row: ms per step against final ||Z^T Z - I||_F / floor; colour = precision, marker =
        retraction, hollow = unsafe. The legend beside the axes, or under them when it is long."""
        from matplotlib.lines import Line2D  # matplotlib loads only to draw

        clip = 1e6  # a diverged cell is drawn at the top edge
        fig, ax = plt.subplots(figsize=(PAGE_WIDTH, 3.6 if len(self.precisions) + len(self.retraction_axis) < 16
                                        else 5.2), layout="constrained")
        for r in self.rows:
            if not (math.isfinite(r["ms_per_step"]) and math.isfinite(r["error_over_floor"])):
                continue
            colour = precision_style(r["precision"]).colour
            ax.scatter(r["ms_per_step"], min(r["error_over_floor"], clip), color=colour, s=22, linewidths=0.9,
                       marker=retraction_style(r["retraction"]).marker,
                       facecolors="none" if judge(r)[0] else colour)
        handles = [Line2D([], [], color=precision_style(p).colour, marker="o", ls="", label=p)
                   for p in self.precisions]
        handles += [Line2D([], [], color="black", marker=retraction_style(r).marker, ls="", label=r)
                    for r in self.retraction_axis]
        handles.append(Line2D([], [], color="black", marker="o", ls="", markerfacecolor="none",
                              label="hollow: unsafe (grows, fails\nor Z broke down by itself)"))
        if len(handles) <= 16:  # one column beside the axes
            fig.legend(handles=handles, loc="outside right upper", frameon=False)
        else:  # more would squeeze the axes: under them, as many columns as fit
            fig.legend(handles=handles, loc="outside lower center", frameon=False,
                       ncol=legend_columns([h.get_label() for h in handles[:-1]], PAGE_WIDTH))
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.axhline(1, color="grey", ls="--", lw=0.7)
        ax.set_xlabel("ms per optimizer step (retraction included)")
        ax.set_ylabel(f"final {ORTHO} / storage floor\n(clipped at {clip:.0e})")
        ax.set_title(f"Cost against accuracy (every row; {self.grid.steps} steps)")
        ax.grid(True, which="major", alpha=0.3)
        plain_ticks_within_a_decade(ax)
        return fig


def plot_sweep(out: Path, grid: Grid, rows: list[dict]) -> list[str]:
    """growth.{png,svg}, retractions.{png,svg}, cost.{png,svg} in out; returns the PNG names."""
    plt = pyplot()  # matplotlib loads only to draw: the workers that run cells never need it
    figures = SweepFigures(out, grid, rows)
    names = []
    for stem in FIGURES:
        names += save_png_and_svg(plt, getattr(figures, stem)(plt), out, stem, dpi=REPORT_DPI)
    return [n for n in names if n.endswith(".png")]
