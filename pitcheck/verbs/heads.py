"""The heads comparison (`pitcheck heads`): the lm source trained with PIT (each retraction), standard tying
and untied heads, in each precision, beside the same PIT cells driven by an adversary (the worst case), from
one call of heads().

It is a sweep (pitcheck.verbs.compare: one resumable run directory per cell, summary.csv, report.md and plots) of
the lm grid in OUT/lm and, unless there is no reference, of the adversarial grid in OUT/reference; then
heads.csv, heads.md and heads.{png,svg}: held-out loss and pinv_drift against step, per head and precision.
"""
from __future__ import annotations

import csv
import io
import math
from pathlib import Path

from . import compare as sweep
from ..infra.errors import PitcheckError
from ..model.heads import HEADS
from ..infra.plotting import pyplot, save_png_and_svg
from ..infra.rundir import check_out_file, check_out_path, read_events, read_manifest, read_metrics, write_atomic
from ..sources.lm import LMParams, uses_lm
from ..trajectory.plan import head_named

# the heads' names in the table's order (HEADS may be a tuple of names or a registry keyed by them)
HEAD_NAMES = tuple(HEADS)
# one row per cell: the lm cells (source "lm") first, then the reference cells (source: their adversary)
HEADS_COLUMNS = ["source", "precision", "head", "steps", "final_pinv_drift", "max_pinv_drift",
                 "final_orthonormality", "max_orthonormality", "final_cond_T", "max_cond_T", "first_heldout_loss",
                 "final_train_loss", "final_heldout_loss", "final_shadow_heldout_loss", "final_shadow_Z", "breakdown"]


def heads_grid(precisions, retractions, steps: int, vocab: int, dim: int, optimizer: str, lr: float, seed: int,
               lm: dict, adversary_params: dict, adversaries=("lm",), heads=HEAD_NAMES, records_per_decade: int = 10,
               teacher: str = ""):
    data = {"steps": steps, "records_per_decade": records_per_decade,
            "description": f"{', '.join(adversaries)} at V x D = {vocab} x {dim}, {optimizer} lr {lr:g}, {steps} steps",
            "axes": {"retraction": list(retractions), "precision": list(precisions), "adversary": list(adversaries),
                     "optimizer": [optimizer], "lr": [lr], "head": list(heads), "shape": [f"{vocab}x{dim}"],
                     "seed": [seed]},
            "fixed": {"adversary_params": dict(adversary_params)}}
    if "lm" in adversaries:
        data["fixed"]["lm"] = dict(lm)
    if teacher:
        data["fixed"]["teacher"] = teacher
    return sweep.grid_from_dict(data, f"pitcheck heads ({', '.join(adversaries)})")


def head_label(config) -> str:
    return f"pit-{config.retraction}" if head_named(config.head).has_retraction else config.head


def _cell_curves(out: Path, cell) -> dict:
    d = sweep.cell_dir(out, cell)
    rows = read_metrics(d / "metrics.csv")
    losses = read_manifest(d / "manifest.json").get("lm", {}).get("losses", [])
    by_step = {e["step"]: e for e in losses}
    for r in rows:
        r.update({k: v for k, v in by_step.get(r["step"], {}).items() if k != "step"})
    events = read_events(d / "events.jsonl")
    return {"rows": rows, "breakdown": any(e["event"] == "breakdown" for e in events)}


def _table(out: Path, grid) -> list[dict]:
    precisions, retractions = grid.axes["precision"], grid.axes["retraction"]
    adversaries = grid.axes["adversary"]

    def order(c):  # adversary, precision, then PIT by retraction, then tied, untied
        h = c.config
        return (adversaries.index(h.adversary.replace(",", "+")), precisions.index(h.precision), HEAD_NAMES.index(h.head),
                retractions.index(h.retraction) if head_named(h.head).has_retraction else 0)

    table = []
    for c in sorted(sweep.cells(grid), key=order):
        data = _cell_curves(out, c)
        rows, last = data["rows"], data["rows"][-1]
        nan = float("nan")
        table.append({
            "source": c.config.adversary.replace(",", "+"), "precision": c.config.precision,
            "head": head_label(c.config), "steps": last["step"],
            "final_pinv_drift": last["pinv_drift"], "max_pinv_drift": max(r["pinv_drift"] for r in rows),
            "final_orthonormality": last["orthonormality"],
            "max_orthonormality": max(r["orthonormality"] for r in rows),
            "final_cond_T": last["cond_T"], "max_cond_T": max(r["cond_T"] for r in rows),
            "first_heldout_loss": rows[0].get("heldout_loss", nan), "final_train_loss": last.get("train_loss", nan),
            "final_heldout_loss": last.get("heldout_loss", nan),
            "final_shadow_heldout_loss": last.get("shadow_heldout_loss", nan),
            "final_shadow_Z": last["shadow_Z"], "breakdown": data["breakdown"], "_rows": rows})
    return table


def summarise_heads(out: Path, grid, reference_out: Path | None, reference_grid) -> list[dict]:
    """The lm cells' rows, then the reference cells' (each with its curves under '_rows')."""
    table = _table(out, grid)
    if reference_grid is not None:
        table += _table(reference_out, reference_grid)
    return table


def heads_csv(table: list[dict]) -> bytes:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=HEADS_COLUMNS, lineterminator="\n", extrasaction="ignore")
    w.writeheader()
    for r in table:
        w.writerow({k: (repr(float(r[k])) if isinstance(r[k], float) else r[k]) for k in HEADS_COLUMNS})
    return buf.getvalue().encode()


def _g(x) -> str:
    return "-" if x != x else f"{x:.3g}"


def _timing(what: str, info: dict | None) -> str:
    if not info:
        return ""
    runs = info.get("computations") or []
    wall = sum(c.get("wall_seconds", 0) for c in runs)
    return f"{what}: {info['cells']} cells, computed in {len(runs)} invocation(s), {wall:.0f} s wall in all. "


def heads_markdown(table: list[dict], grid, reference_grid, info: dict, ref_info: dict | None = None) -> str:
    lm_rows = [r for r in table if r["source"] == "lm"]
    ref_rows = [r for r in table if r["source"] != "lm"]
    lines = [f"# Heads comparison: {grid.description}", "",
             "Real training (the lm source: a causal LM on CPython's documentation text), then the same PIT cells "
             "driven by adversaries (`reference/`). Losses in nats per token; pinv_drift = ‖W E − I‖_F as the model "
             "computes it; float64 twin = the shadow, its own body trained on the same batches.", "",
             "| precision | head | pinv_drift final (max) | ‖ZᵀZ−I‖_F final | cond T final | held-out loss start → end "
             "| train loss end | float64 twin held-out | shadow Z |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in lm_rows:
        lines.append(f"| {r['precision']} | {r['head']}{' (broke down)' if r['breakdown'] else ''} | "
                     f"{_g(r['final_pinv_drift'])} ({_g(r['max_pinv_drift'])}) | {_g(r['final_orthonormality'])} | "
                     f"{_g(r['final_cond_T'])} | {r['first_heldout_loss']:.3f} → {r['final_heldout_loss']:.3f} | "
                     f"{r['final_train_loss']:.3f} | {r['final_shadow_heldout_loss']:.3f} | {_g(r['final_shadow_Z'])} |")
    if ref_rows:
        lines += ["", f"Reference: {reference_grid.description}", "",
                  "| adversary | precision | head | pinv_drift final (max) | ‖ZᵀZ−I‖_F final (max) | cond T final (max) |",
                  "|---|---|---|---|---|---|"]
        for r in ref_rows:
            lines.append(f"| {r['source']} | {r['precision']} | {r['head']}{' (broke down)' if r['breakdown'] else ''} | "
                         f"{_g(r['final_pinv_drift'])} ({_g(r['max_pinv_drift'])}) | {_g(r['final_orthonormality'])} "
                         f"({_g(r['max_orthonormality'])}) | {_g(r['final_cond_T'])} ({_g(r['max_cond_T'])}) |")
    lines += ["", (_timing("lm", info) + _timing("reference", ref_info)).strip(), "",
              "![heads](heads.png)", ""]
    return "\n".join(lines)


def plot_heads(out: Path, table: list[dict]) -> list[str]:
    """heads.{png,svg}, a column per precision: held-out loss (train dotted), pinv_drift and ‖ZᵀZ − I‖_F
    against step; the reference adversaries' PIT cells dashed. The drift axis stops 1e3 above the lm runs'
    largest value: an adversary that drives cond(T) to 1e34 would flatten every other curve."""
    plt = pyplot()
    precisions = list(dict.fromkeys(r["precision"] for r in table))
    fig, axes = plt.subplots(3, len(precisions), figsize=(4.8 * len(precisions) + 0.6, 10.0), squeeze=False,
                             sharex=True)
    labels = list(dict.fromkeys(r["head"] for r in table if r["source"] == "lm"))
    colours = {h: f"C{k}" for k, h in enumerate(labels)}
    metrics = (("pinv_drift", "pinv_drift ‖W E − I‖_F"), ("orthonormality", "‖ZᵀZ − I‖_F (tables: ‖EᵀE − I‖_F)"))
    for j, p in enumerate(precisions):
        loss_ax = axes[0][j]
        styles: dict = {}
        for r in (r for r in table if r["precision"] == p):
            steps = [max(x["step"], 1) for x in r["_rows"]]
            c = colours.get(r["head"], "k")
            if r["source"] == "lm":
                loss_ax.semilogx(steps, [x.get("heldout_loss", math.nan) for x in r["_rows"]], color=c,
                                 marker=".", label=r["head"])
                loss_ax.semilogx(steps, [x.get("train_loss", math.nan) for x in r["_rows"]], color=c, ls=":")
                style, label, extra = "-", r["head"], {"marker": "."}
            else:
                style = styles.setdefault(r["source"], ("--", "-.", ":")[len(styles) % 3])
                label, extra = f"{r['head']}, {r['source']}", {"alpha": 0.6}
            for k, (metric, _) in enumerate(metrics):
                axes[k + 1][j].loglog(steps, [max(x[metric], 1e-17) for x in r["_rows"]], color=c, ls=style,
                                      label=label, **extra)
        lm_peak = max((x["pinv_drift"] for r in table if r["precision"] == p and r["source"] == "lm"
                       for x in r["_rows"] if math.isfinite(x["pinv_drift"])), default=None)
        if lm_peak:
            axes[1][j].set_ylim(top=lm_peak * 1e3)
        loss_ax.set_title(p)
        axes[-1][j].set_xlabel("step (0 drawn at 1)")
        for row in axes:
            row[j].grid(True, alpha=0.3)
        if j == 0:
            loss_ax.set_ylabel("loss, nats/token (held-out solid, train dotted)")
            for k, (_, name) in enumerate(metrics):
                axes[k + 1][j].set_ylabel(f"{name}\n(adversaries dashed)")
        loss_ax.legend(fontsize=7)
        axes[2][j].legend(fontsize=6)
    fig.tight_layout()
    return save_png_and_svg(plt, fig, out, "heads")


HEADS_FILES = ("heads.csv", "heads.md", "heads.png", "heads.svg")


def refuse_lm_reference(adversaries) -> None:
    """The reference cells are driven by adversaries, beside the real training; the lm source is that
    training (the lm cells): a reference cell using it was labelled 'lm' and mixed into their table."""
    for adversary in adversaries:
        spec = sweep.adversary_spec(adversary)
        if uses_lm(spec):
            raise PitcheckError(f"--reference {sweep.adversary_label(spec)}: the reference cells are driven by "
                                "adversaries; the lm source is the real training the lm cells already run, not a reference")


def check_heads_outputs(out: Path | str) -> Path:
    """Before any cell runs: every output in out can be written."""
    out = check_out_path(out)
    if out.is_dir():
        for name in HEADS_FILES:
            check_out_file(out / name, f"--out's {name}")
    return out


def heads(out: Path | str, precisions=("fp32", "bf16-mixed"), retractions=("qr", "cayley"),
          reference=("adaptive", "dense_output+sparse_input"), steps: int = 600, vocab: int = 1024, dim: int = 32,
          optimizer: str = "adam", lr: float = 3e-3, seed: int = 0, teacher: str = "", lm: LMParams | None = None,
          input_scale: float | None = None, workers: int | None = None, force: bool = False,
          progress: bool | None = None) -> dict:
    """Train the lm source with PIT (one cell per retraction), standard tying and untied heads in each
    precision (a resumable sweep in out/lm), beside PIT cells driven by each reference adversary (out/reference;
    an empty reference runs none), then write heads.csv, heads.md and heads.{png,svg} into out.

    lm: the lm source's settings (None: LMParams()); input_scale: the input-side gradients' scale (None: the
    default); teacher: start the lm cells at this embedding's polar factor (the reference cells start at
    random: a pretrained model's table fits the lm vocabulary only). Bad input (a reference naming the lm
    source, a grid the sweep refuses, outputs that cannot be written) raises PitcheckError before any cell
    runs. Returns the table (one dict per cell, without curves), the plots written and the sweeps' timing.
    """
    adversary_params = {} if input_scale is None else {"input_scale": input_scale}
    common = dict(precisions=precisions, steps=steps, vocab=vocab, dim=dim, optimizer=optimizer, lr=lr, seed=seed,
                  lm=(lm or LMParams()).to_json(), adversary_params=adversary_params)
    grid = heads_grid(retractions=retractions, teacher=teacher, **common)
    reference_grid = None
    if reference:
        refuse_lm_reference(reference)
        reference_grid = heads_grid(retractions=retractions, heads=("pit",), adversaries=reference, **common)
    out = check_heads_outputs(out)
    info = sweep.compare(out / "lm", grid, workers=workers, force=force, progress=progress)
    ref_out, ref_info = None, None
    if reference_grid is not None:
        ref_out = out / "reference"
        ref_info = sweep.compare(ref_out, reference_grid, workers=workers, force=force, progress=progress)
    table = summarise_heads(out / "lm", grid, ref_out, reference_grid)
    write_atomic(out / "heads.csv", heads_csv(table))
    plots = plot_heads(out, table)
    write_atomic(out / "heads.md", heads_markdown(table, grid, reference_grid, info, ref_info).encode())
    timing = {"lm_wall_seconds": info["wall_seconds"], "lm_cells": info["cells"], "lm_computed": info["computed"]}
    if ref_info:
        timing.update(reference_wall_seconds=ref_info["wall_seconds"], reference_cells=ref_info["cells"])
    return {"table": [{k: v for k, v in r.items() if not k.startswith("_")} for r in table], "plots": plots,
            **timing}
