"""A sweep's report: report.md (the verdict first, then the table, the floors and bounds, how it ran, the
plots) and its figures: growth, retractions and cost."""
from __future__ import annotations

import itertools
import math
import platform
from pathlib import Path

import numpy as np

from ...numerics.placement import z_format
from ...infra.plotting import pyplot, save_png_and_svg
from ...numerics.policy import get_policy
from ...model.retractions import RECORDS, PlotStyle
from ...infra.rundir import read_metrics, write_atomic
from ...infra.threads import available_cores
from ...trajectory import versions
from .cells import COST_STEPS, Cell, cell_dir, cells
from .grid import Grid, axis_values, parse_shape
from .summary import RESOLVABLE_COND_U
from .verdict import ACCURACY_TIE, BOUNDED_GROWTH, judge, not_judged, own_breakdowns, t_instability_lines, verdict_lines
from ...model.heads import get_head
from ...numerics.policy import precision_style



def retraction_style(name: str) -> PlotStyle:
    """The registry's style of a retraction; a baseline head's row ('-': no retraction) is drawn as 'none'."""
    return RECORDS["none" if name == "-" else name].style


def _fmt(x, spec=".2e") -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


def table_lines(rows: list[dict]) -> list[str]:
    varying = ("adversary", "optimizer", "lr", "head", "vocab", "dim", "shards")
    multi = {k for k in varying if len({r[k] for r in rows}) > 1}
    keys = ["precision", "retraction"] + [k for k in varying if k in multi]
    head = keys + ["final ‖ZᵀZ-I‖ (min-max)", "floor", "x floor", "growth exp.", "pinv drift",
                   "drift bound", "max cond T", "shadow Z", "ms/step", "events", "failed retr.", "breakdowns (T/L; own)", "not judged"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [str(r[k]) if not isinstance(r[k], float) else f"{r[k]:g}" for k in keys]
        cells += [f"{_fmt(r['final_orthonormality'])} ({_fmt(r['final_orthonormality_min'], '.1e')}-"
                  f"{_fmt(r['final_orthonormality_max'], '.1e')})",
                  _fmt(r["floor"], ".1e"), _fmt(r["error_over_floor"], ".3g"),
                  f"{_fmt(r['growth_exponent'], '+.2f')} ± {_fmt(r['growth_exponent_err'], '.2f')}",
                  _fmt(r["final_pinv_drift"]), _fmt(r["drift_bound"]), _fmt(r["max_cond_T"], ".3g"),
                  _fmt(r["shadow_Z"]), _fmt(r["ms_per_step"], ".3g"), str(r["events"]), str(r["failed_retractions"]),
                  f"{r['breakdowns']} ({r.get('breakdowns_T', 0)}; {own_breakdowns(r)})", str(not_judged(r))]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def machine_lines() -> list[str]:
    v = versions()
    return [f"- machine: {platform.platform()}, {platform.processor() or platform.machine()}, "
            f"{available_cores()} cores",
            "- versions: " + ", ".join(f"{k} {val}" for k, val in v.items() if val is not None)]


def timing_lines(info: dict) -> list[str]:
    history = info.get("computations") or []
    if not history:
        return ["- the cells were computed by an earlier pitcheck (no timing.json)"]
    lines = []
    for c in history:
        workers = f"{c['workers']} workers" if c.get("workers") else "one worker per core"
        busy = c["cell_seconds"] / c["wall_seconds"] if c["wall_seconds"] > 0 else float("nan")
        lines.append(f"- computed {c['computed']} cells on the {c['executor']} executor ({workers}): wall "
                     f"{c['wall_seconds']:.1f} s against {c['cell_seconds']:.1f} s of cell time, the serial sum "
                     f"({busy:.2f} cells running at once on average)")
    return lines


def placement_lines(rows: list[dict]) -> list[str]:
    """For a grid with placements (pitcheck.numerics.placement): the precisions ranked by what the tie keeps, each at
    its best retraction: ||W E - I||_F against the drift bound (the tie holds when within it), then
    ||Z^T Z - I||_F against its floor. [] when no row has a placement."""
    if not any(get_policy(r["precision"]).placement for r in rows):
        return []
    best = {}
    for r in rows:
        current = best.setdefault(r["precision"], {"drift": math.inf, "bound": math.nan, "ortho": math.inf,
                                                   "floor": r["floor"]})
        if r["final_pinv_drift"] < current["drift"]:
            current.update(drift=r["final_pinv_drift"], bound=r["drift_bound"])
        current["ortho"] = min(current["ortho"], r["final_orthonormality"])
    lines = ["## Placements ranked", "",
             "Each precision at its best retraction, ranked by ||W E - I||_F: the tie holds where it is within the "
             "drift bound cond(T) (||Z^T Z - I||_F + u_factor); where a format's floor exceeds 0.1 it cannot "
             "resolve the question.", "",
             "| rank | precision | placement | ‖WE-I‖_F | / drift bound | ‖ZᵀZ-I‖_F | x floor | the tie |",
             "|---|---|---|---|---|---|---|---|"]
    ranked = sorted(best.items(), key=lambda item: (item[1]["drift"], item[1]["ortho"]))
    for rank, (precision, b) in enumerate(ranked, 1):
        placed = get_policy(precision).placement
        over = b["drift"] / b["bound"] if b["bound"] > 0 else math.nan
        if b["floor"] > 0.1:
            tie = "inconclusive (floor > 0.1)"
        else:
            tie = "holds" if over <= 1 else f"broken ({over:.2g}x its bound)"
        lines.append(f"| {rank} | {precision} | {placed.name if placed else '-'} | {b['drift']:.2e} | {_fmt(over, '.3g')} "
                     f"| {b['ortho']:.2e} | {_fmt(b['ortho'] / b['floor'] if b['floor'] > 0 else math.nan, '.3g')} | {tie} |")
    return lines + [""]


def report_markdown(out: Path, grid: Grid, info: dict, plots: list[str]) -> str:
    """report.md: the verdict first, then the table, the floors and bounds, the machine, the plots."""
    rows = info["rows"]
    g = grid
    axes = ", ".join(f"{k} {'/'.join(str(v) for v in vals)}" for k, vals in g.axes.items()
                     if k != "shards" or len(vals) > 1)
    lines = [
        f"# pitcheck compare: which retraction, in which precision, at what cost",
        "",
        f"Grid {g.source}: {g.description or ''}" if g.description else f"Grid {g.source}.",
        "",
        f"As run: {g.steps} steps per cell, {len(cells(g))} cells ({axes}).",
        "",
        "## Verdict",
        "",
        f"Per precision, among the retractions that neither failed by themselves nor let the error grow (growth "
        f"exponent below {BOUNDED_GROWTH}, measured: a retraction whose growth could not be measured is "
        f"inconclusive, never safe), the most accurate (final ||Z^T Z - I||_F against the storage floor, worst "
        f"judged row), or the cheapest of those within {ACCURACY_TIE:g}x of it. A breakdown counts against a "
        f"retraction only when it is its own: Z broke down (not T or its factor L) while cond(T) u was still "
        f"below {RESOLVABLE_COND_U:g}, and not in a precision, gradient model and seed where every retraction "
        "broke down. A row where a run ended in any other breakdown is not judged, neither for the retraction "
        "nor against it, and neither is a row where T blew up (T or L broke down, or cond(T) u passed "
        f"{RESOLVABLE_COND_U:g}) under every retraction of the same precision, gradient model and seed, even "
        "where the run did not end: these are listed under \"not judged\" (T blew up whichever the retraction). "
        "A retraction's own failures (its Z breakdowns, and the steps it failed in the runs that judge it) count "
        "in every row.",
        "",
        *verdict_lines(rows),
        "",
        *(t_instability_lines(rows) + [""] if t_instability_lines(rows) else []),
        *placement_lines(rows),
        "## Table",
        "",
        "One row per cell group, aggregated over seeds: final ||Z^T Z - I||_F (median, min-max over seeds); "
        "floor = that of an exactly orthonormal Q rounded to the storage format, and through the placement's "
        "recipe where Z's copy has one (measured, same shape); "
        "growth exponent = slope of log error against log step over steps sqrt(N)..N (0 bounded, 0.5 random "
        "walk, 1 linear) ± its standard error; pinv drift = ||W E - I||_F at the end (median); drift bound = "
        "cond(T) (||Z^T Z - I||_F + u_factor), the first-order bound W E - I = T (Z^T Z - I) T^{-1} plus the "
        "solves' cond(T) u; shadow Z = relative distance from the float64 run on the same gradients; ms/step "
        "= the model's optimizer step alone (retraction included, no shadow or metrics), median of "
        f"{COST_STEPS} steps, measured in the worker while the others ran; events = skipped steps, overflows, "
        "failed retractions (threshold crossings not counted); failed retr. = steps the retraction could not "
        "take (skipped), which makes it unsafe unless its run judges nothing of it (not judged); breakdowns = runs that ended early (T/L: T or its factor L broke; "
        "own: Z broke while T was resolvable and not under every retraction, the only ones counted against the "
        "retraction); not judged = seeds whose run judges nothing of its retraction (it ended in a breakdown not "
        "its own, or T blew up under every retraction of its precision, gradient model and seed).",
        *(["", "shards = the gloo ranks Z is row-sharded over (`pitcheck run --shards`; 1: one process); a sharded "
            "cell's ms/step is not measured (-): its ranks share this machine's cores. Each sharded cell's "
            "metrics.csv holds shard_distance_Z/T, its distance from the single-process run (u)."]
          if len(axis_values(g, "shards")) > 1 else []),
        "",
        *table_lines(rows),
        "",
        "## Floors and bounds",
        "",
        "The floor is measured; beside it, the first-order estimate for a Gaussian-like Q whose entries are "
        "rounded with relative errors uniform in ±u: ‖QᵀQ - I‖_F ≈ u sqrt((2D(D-1)/3 + 4D)/V). A final error "
        "near 1x the floor is as good as the format allows. In fp64 no exactly orthonormal Q can be stored to "
        "measure from: the measured value is Householder QR's own orthogonality error and the float64 Gram "
        "product's, the resolution of the runs' own metric.",
        "",
        "| storage format | u | measured floor ‖QᵀQ - I‖_F (V x D) | first-order estimate |",
        "|---|---|---|---|",
    ]
    seen = set()
    for r in rows:
        policy = get_policy(r["precision"])
        fmt, u = z_format(policy.storage, policy.placement)
        key = (fmt, r["vocab"], r["dim"])
        if key in seen:
            continue
        seen.add(key)
        D, V = r["dim"], r["vocab"]
        est = u * math.sqrt((2 * D * (D - 1) / 3 + 4 * D) / V)
        lines.append(f"| {fmt} | {u:.3g} | {r['floor']:.2e} ({r['vocab']} x {r['dim']}) | {est:.1e} |")
    lines += [
        "",
        "## How it ran",
        "",
        f"- grid: {g.source}; cells: {info['cells']}, computed in this invocation: {info['computed']}",
        *timing_lines(info),
        *machine_lines(),
        "",
        "## Plots",
        "",
    ]
    for p in plots:
        lines += [f"![{p}]({p})", ""]
    return "\n".join(lines) + "\n"


# curves a growth panel labels in its own legend; more share one legend under the figure
MAX_PANEL_LEGEND = 8


def curves(out: Path, all_cells: list[Cell]) -> dict:
    """group -> (steps, median, min, max) of ||Z^T Z - I||_F over the seeds, on the steps all seeds have."""
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
    # matplotlib loads only to draw: the workers that import this package to run cells never need it
    from matplotlib.lines import Line2D

    plt = pyplot()
    plt.rcParams["svg.hashsalt"] = "pitcheck"  # the same plot, the same SVG bytes
    all_cells = cells(grid)
    data = curves(out, all_cells)
    by_key = {(r["retraction"], r["precision"], r["adversary"], r["optimizer"], r["lr"], r["head"], r["vocab"],
               r["dim"], r["shards"]): r for r in rows}
    # the plots show the first value of every axis but retraction, precision and adversary
    first = {k: axis_values(grid, k)[0] for k in ("optimizer", "lr", "head", "shards")}
    shape = parse_shape(grid.axes["shape"][0])
    retractions = [r for r in grid.axes["retraction"]] if get_head(first["head"]).has_retraction else ["-"]
    precisions, adversaries = grid.axes["precision"], grid.axes["adversary"]

    def key(ret, prec, adv):
        return (ret, prec, adv, first["optimizer"], first["lr"], first["head"], *shape, first["shards"])

    names = []
    shards = f", {first['shards']} shards" if len(axis_values(grid, "shards")) > 1 else ""
    fixed_note = (f"{first['optimizer']} lr={first['lr']:g}, head {first['head']}, V x D = {shape[0]} x {shape[1]}"
                  f"{shards}, {grid.steps} steps; median over seeds, band = min-max")
    # 1. error growth across precisions: one panel per retraction (rows: adversaries)
    pairs = list(itertools.product(adversaries, retractions))
    fig, axs = _panels(plt, len(pairs), 3.6, 3.0, sharey=True)
    # past a panel's room for a legend (the fp8 grid's 14 precisions), one legend of the precisions goes
    # under the figure and each curve's growth exponent stays in summary.csv and the report
    shared = len(precisions) > MAX_PANEL_LEGEND
    handles = {}
    for ax, (adv, ret) in zip(axs, pairs):
        for prec in precisions:
            k = key(ret, prec, adv)
            if k not in data:
                continue
            steps, med, lo, hi = data[k]
            row = by_key[k]
            colour = precision_style(prec).colour
            slope = row["growth_exponent"]
            label = (f"{prec}: k^{slope:.2f}±{row['growth_exponent_err']:.2f}" if math.isfinite(slope) and not shared
                     else prec)
            (line,) = ax.loglog(steps, np.maximum(med, 1e-17), color=colour, lw=1.3, label=label,
                                marker=precision_style(prec).marker, markevery=max(1, len(steps) // 6), ms=4)
            handles.setdefault(prec, line)
            ax.fill_between(steps, np.maximum(lo, 1e-17), np.maximum(hi, 1e-17), color=colour, alpha=0.2, lw=0)
            ax.axhline(row["floor"], color=colour, ls="--", lw=0.8)
        ax.set_title(f"{ret}" + (f" | {adv}" if len(adversaries) > 1 else ""), fontsize=9)
        # errors above 10 mean Z is no longer near the manifold: clipped, so that a diverging cell does not
        # squash every other curve; the room below the float64 floor holds the legend
        ax.set_ylim(1e-21, 1e2)
        if not shared:
            ax.legend(fontsize=7, loc="lower right", ncol=2, handlelength=1.2, columnspacing=0.8, framealpha=0.8)
    legend_note = ("precisions below; growth exponents in summary.csv" if shared else
                   "legend: the fitted growth k^slope ± its standard error (steps sqrt(N)..N)")
    fig.suptitle("Orthonormality error across precisions; dashed: each precision's storage floor; " + legend_note
                 + "\n" + fixed_note, fontsize=9)
    if shared:
        ncol = min(len(handles), 5)
        rows_of_legend = -(-len(handles) // ncol)
        fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=ncol, fontsize=8,
                   handlelength=1.5, frameon=False)
        fig.tight_layout(rect=(0, 0.045 * rows_of_legend / max(1, len(axs) // 4 + 1), 1, 1))
    else:
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
            colour = retraction_style(ret).colour
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
        colour = precision_style(r["precision"]).colour
        marker = retraction_style(r["retraction"]).marker
        unsafe = judge(r)[0]
        ax.scatter(r["ms_per_step"], min(r["error_over_floor"], CLIP), color=colour, marker=marker, s=45,
                   facecolors="none" if unsafe else colour, linewidths=1.2)
    handles = [Line2D([], [], color=precision_style(p).colour, marker="o", ls="", label=p) for p in precisions]
    handles += [Line2D([], [], color="black", marker=retraction_style(r).marker, ls="", label=r)
                for r in retractions]
    handles.append(Line2D([], [], color="black", marker="o", ls="", markerfacecolor="none",
                          label="hollow: unsafe (grows, fails\nor Z broke down by itself)"))
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


def render(out: Path | str, grid: Grid, info: dict) -> None:
    """summary.csv is written by the sweep; this writes report.md and the plots from the cells on disk."""
    out = Path(out)
    plots = plot_sweep(out, grid, info["rows"])
    write_atomic(out / "report.md", report_markdown(out, grid, info, plots).encode())
