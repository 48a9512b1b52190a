"""A sweep's report: report.md (the verdict first, then the table, the floors and bounds, how it ran, the
plots); its figures (growth, retractions and cost) are figures.py's."""
from __future__ import annotations

import math
import platform
from pathlib import Path

from ...numerics.placement import z_format
from ...trajectory.plan import policy_named
from ...infra.rundir import write_atomic
from ...infra.threads import available_cores
from ...trajectory import versions
from .cells import COST_STEPS, cells
from .figures import plot_sweep
from .grid import Grid, axis_values
from .summary import RESOLVABLE_COND_U
from .verdict import (ACCURACY_TIE, BOUNDED, BOUNDED_GROWTH, GROWTH_SIGMAS, RANDOM_WALK, not_judged, own_breakdowns,
                      t_instability_lines, verdict_lines)



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
    if not any(policy_named(r["precision"]).placement for r in rows):
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
        placed = policy_named(precision).placement
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
        f"exponent below {BOUNDED_GROWTH}, measured: a retraction whose growth could not be measured, or whose "
        f"exponent's {GROWTH_SIGMAS:g}-standard-error interval reaches both bounded error ({BOUNDED:g}) and a random "
        f"walk ({RANDOM_WALK:g}), is inconclusive, never safe nor unsafe for its growth), the most accurate (final ||Z^T Z - I||_F against the storage floor, worst "
        f"judged row), or the cheapest of those within {ACCURACY_TIE:g}x of it. A breakdown counts against a "
        f"retraction only when it is its own: Z broke down (not T or its factor L) while cond(T) u (u of T's "
        f"solves) was still "
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
        policy = policy_named(r["precision"])
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


def render(out: Path | str, grid: Grid, info: dict) -> None:
    """summary.csv is written by the sweep; this writes report.md and the plots from the cells on disk."""
    out = Path(out)
    plots = plot_sweep(out, grid, info["rows"])
    write_atomic(out / "report.md", report_markdown(out, grid, info, plots).encode())
