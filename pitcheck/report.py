"""The figures of a sweep's report (`pitcheck compare`): growth, retractions and cost."""
from __future__ import annotations

import itertools
import math
from pathlib import Path

from .plotting import pyplot, save_png_and_svg
from .sweep import Grid, Cell, cell_dir, cells, judge, parse_shape  # noqa: E402  (a cycle issue 15 removes)

PRECISION_COLOURS = {"fp64": "#1f77b4", "fp32": "#2ca02c", "tf32": "#17becf", "bf16": "#d62728",
                     "bf16-mixed": "#ff7f0e", "fp16": "#9467bd", "fp16-mixed": "#8c564b"}
RETRACTION_STYLES = {"qr": ("#1f77b4", "o"), "polar": ("#2ca02c", "s"), "polar-gram": ("#17becf", "D"),
                     "polar-ns": ("#bcbd22", "v"), "cholqr": ("#9467bd", "^"), "cayley": ("#d62728", "P"),
                     "cayley-iter": ("#ff7f0e", "X"), "none": ("#7f7f7f", "x"), "-": ("#7f7f7f", "x")}


def curves(out: Path, all_cells: list[Cell]) -> dict:
    """group -> (steps, median, min, max) of ||Z^T Z - I||_F over the seeds, on the steps all seeds have."""
    import numpy as np

    from .rundir import read_metrics

    by_group: dict[tuple, list] = {}
    for c in all_cells:
        by_group.setdefault(c.group, []).append(read_metrics(cell_dir(out, c) / "metrics.csv"))
    result = {}
    for group, runs in by_group.items():
        n = min(len(r) for r in runs)
        steps = np.array([max(r["step"], 1) for r in runs[0][:n]])
        vals = np.array([[x["orthonormality"] for x in r[:n]] for r in runs])
        result[group] = (steps, np.median(vals, 0), vals.min(0), vals.max(0))
    return result


def _panels(plt, n: int, width: float, height: float, sharey: bool):
    """n log-log panels, at most 4 to a row; labels on the outer ones; spare axes hidden."""
    ncols = min(4, n)
    nrows = -(-n // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols + 0.6, height * nrows + 1.0), sharex=True,
                             sharey=sharey, squeeze=False)
    flat = [ax for row in axes for ax in row]
    for k, ax in enumerate(flat):
        if k >= n:
            ax.set_visible(False)
            continue
        ax.grid(True, which="major", alpha=0.3)
        if k % ncols == 0:
            ax.set_ylabel("||Z^T Z - I||_F")
        if k + ncols >= n:
            ax.set_xlabel("step (0 drawn at 1)")
            ax.xaxis.set_tick_params(labelbottom=True)
    return fig, flat[:n]


def plot_sweep(out: Path, grid: Grid, rows: list[dict]) -> list[str]:
    """growth.{png,svg}, retractions.{png,svg}, cost.{png,svg} in out; returns the PNG names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    plt.rcParams["svg.hashsalt"] = "pitcheck"  # the same plot, the same SVG bytes
    all_cells = cells(grid)
    data = curves(out, all_cells)
    by_key = {(r["retraction"], r["precision"], r["adversary"], r["optimizer"], r["lr"], r["head"], r["vocab"],
               r["dim"]): r for r in rows}
    # the plots show the first value of every axis but retraction, precision and adversary
    first = {k: grid.axes[k][0] for k in ("optimizer", "lr", "head")}
    shape = parse_shape(grid.axes["shape"][0])
    retractions = [r for r in grid.axes["retraction"]] if first["head"] == "pit" else ["-"]
    precisions, adversaries = grid.axes["precision"], grid.axes["adversary"]

    def key(ret, prec, adv):
        return (ret, prec, adv, first["optimizer"], first["lr"], first["head"], *shape)

    names = []
    fixed_note = (f"{first['optimizer']} lr={first['lr']:g}, head {first['head']}, V x D = {shape[0]} x {shape[1]}, "
                  f"{grid.steps} steps; median over seeds, band = min-max")
    # 1. error growth across precisions: one panel per retraction (rows: adversaries)
    pairs = list(itertools.product(adversaries, retractions))
    fig, axs = _panels(plt, len(pairs), 3.6, 3.0, sharey=True)
    for ax, (adv, ret) in zip(axs, pairs):
        for prec in precisions:
            k = key(ret, prec, adv)
            if k not in data:
                continue
            steps, med, lo, hi = data[k]
            row = by_key[k]
            colour = PRECISION_COLOURS.get(prec)
            slope = row["growth_exponent"]
            label = (f"{prec}: k^{slope:.2f}±{row['growth_exponent_err']:.2f}" if math.isfinite(slope) else prec)
            ax.loglog(steps, np.maximum(med, 1e-17), color=colour, lw=1.3, label=label)
            ax.fill_between(steps, np.maximum(lo, 1e-17), np.maximum(hi, 1e-17), color=colour, alpha=0.2, lw=0)
            ax.axhline(row["floor"], color=colour, ls="--", lw=0.8)
        ax.set_title(f"{ret}" + (f" | {adv}" if len(adversaries) > 1 else ""), fontsize=9)
        # errors above 10 mean Z is no longer near the manifold: clipped, so that a diverging cell does not
        # squash every other curve; the room below the float64 floor holds the legend
        ax.set_ylim(1e-21, 1e2)
        ax.legend(fontsize=5.5, loc="lower right", ncol=2, handlelength=1.2, columnspacing=0.8, framealpha=0.8)
    fig.suptitle("Orthonormality error across precisions; dashed: each precision's storage floor; legend: the "
                 "fitted growth k^slope ± its standard error (steps sqrt(N)..N)\n" + fixed_note,
                 fontsize=9)
    fig.tight_layout()
    names += save_png_and_svg(plt, fig, out, "growth")

    # 2. retractions per precision: one panel per precision (rows: adversaries)
    pairs = list(itertools.product(adversaries, precisions))
    fig, axs = _panels(plt, len(pairs), 3.4, 3.0, sharey=False)
    for ax, (adv, prec) in zip(axs, pairs):
        floor = None
        for ret in retractions:
            k = key(ret, prec, adv)
            if k not in data:
                continue
            steps, med, lo, hi = data[k]
            colour, marker = RETRACTION_STYLES.get(ret, (None, "."))
            ax.loglog(steps, np.maximum(med, 1e-17), color=colour, lw=1.2, label=ret)
            ax.fill_between(steps, np.maximum(lo, 1e-17), np.maximum(hi, 1e-17), color=colour, alpha=0.2, lw=0)
            floor = by_key[k]["floor"]
        ax.set_ylim(top=min(ax.get_ylim()[1], 1e2))  # a diverging cell is clipped at 100, above any use
        if floor is not None:
            ax.axhline(floor, color="black", ls="--", lw=0.8)
            ax.text(1, floor, " floor", va="bottom", fontsize=7)
        ax.set_title(prec + (f" | {adv}" if len(adversaries) > 1 else ""), fontsize=9)
    axs[0].legend(fontsize=7)
    fig.suptitle("Retractions per precision\n" + fixed_note, fontsize=9)
    fig.tight_layout()
    names += save_png_and_svg(plt, fig, out, "retractions")

    # 3. cost against accuracy: every pit row, colour = precision, marker = retraction
    CLIP = 1e6  # a diverged cell is drawn at the top edge
    fig, ax = plt.subplots(figsize=(7.5, 5))
    for r in rows:
        if not (math.isfinite(r["ms_per_step"]) and math.isfinite(r["error_over_floor"])):
            continue
        colour = PRECISION_COLOURS.get(r["precision"])
        marker = RETRACTION_STYLES.get(r["retraction"], (None, "."))[1]
        unsafe = judge(r)[0]
        ax.scatter(r["ms_per_step"], min(r["error_over_floor"], CLIP), color=colour, marker=marker, s=45,
                   facecolors="none" if unsafe else colour, linewidths=1.2)
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=PRECISION_COLOURS.get(p), marker="o", ls="", label=p) for p in precisions]
    handles += [Line2D([], [], color="black", marker=RETRACTION_STYLES.get(r, (None, "."))[1], ls="", label=r)
                for r in retractions]
    handles.append(Line2D([], [], color="black", marker="o", ls="", markerfacecolor="none",
                          label="hollow: unsafe (grows,\nfails or Z broke down)"))
    ax.legend(handles=handles, fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.axhline(1, color="grey", ls="--", lw=0.8)
    ax.set_xlabel("ms per optimizer step (retraction included)")
    ax.set_ylabel(f"final ||Z^T Z - I||_F / storage floor (clipped at {CLIP:.0e})")
    ax.set_title(f"Cost against accuracy (every row; {grid.steps} steps)", fontsize=9)
    ax.grid(True, which="major", alpha=0.3)
    fig.tight_layout()
    names += save_png_and_svg(plt, fig, out, "cost")
    return [n for n in names if n.endswith(".png")]
