"""The heads comparison: the lm source trained with PIT (each retraction), standard tying and untied heads,
in each precision, beside the same PIT cells driven by an adversary (the worst case), from one command.

It is a sweep (pitcheck.sweep: one resumable run directory per cell, summary.csv, report.md and plots) of
the lm grid in OUT and, unless the reference is "none", of the adversarial grid in OUT/reference; then
heads.csv, heads.md and heads.{png,svg}: held-out loss and pinv_drift against step, per head and precision.
"""
from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from ..errors import PitcheckError

HEADS = ("pit", "tied", "untied")
HEADS_COLUMNS = ["precision", "head", "steps", "final_pinv_drift", "max_pinv_drift", "final_orthonormality",
                 "final_cond_T", "first_heldout_loss", "final_train_loss", "final_heldout_loss",
                 "final_shadow_heldout_loss", "final_shadow_Z", "breakdown", "reference_adversary",
                 "reference_final_pinv_drift", "reference_max_pinv_drift"]


def heads_grid(precisions, retractions, steps: int, vocab: int, dim: int, optimizer: str, lr: float, seed: int,
               lm: dict, adversary_params: dict, adversary: str = "lm", heads=HEADS, records_per_decade: int = 10):
    from ..sweep import grid_from_dict

    data = {"steps": steps, "records_per_decade": records_per_decade,
            "description": f"heads comparison: {adversary} at V x D = {vocab} x {dim}, {optimizer} lr {lr:g}",
            "axes": {"retraction": list(retractions), "precision": list(precisions), "adversary": [adversary],
                     "optimizer": [optimizer], "lr": [lr], "head": list(heads), "shape": [f"{vocab}x{dim}"],
                     "seed": [seed]},
            "fixed": {"adversary_params": dict(adversary_params)}}
    if adversary == "lm":
        data["fixed"]["lm"] = dict(lm)
    return grid_from_dict(data, f"pitcheck heads ({adversary})")


def head_label(config) -> str:
    return f"pit-{config.retraction}" if config.head == "pit" else config.head


def _cell_curves(out: Path, cell) -> dict:
    from ..rundir import read_events, read_manifest, read_metrics
    from ..sweep import cell_dir

    d = cell_dir(out, cell)
    rows = read_metrics(d / "metrics.csv")
    losses = read_manifest(d / "manifest.json").get("lm", {}).get("losses", [])
    by_step = {e["step"]: e for e in losses}
    for r in rows:
        r.update({k: v for k, v in by_step.get(r["step"], {}).items() if k != "step"})
    events = read_events(d / "events.jsonl")
    return {"rows": rows, "breakdown": any(e["event"] == "breakdown" for e in events)}


def summarise_heads(out: Path, grid, reference_out: Path | None, reference_grid) -> list[dict]:
    from ..sweep import cells

    ref = {}
    if reference_grid is not None:
        for c in cells(reference_grid):
            rows = _cell_curves(reference_out, c)["rows"]
            ref[(c.config.precision, c.config.retraction)] = (c.config.adversary, rows)
    table = []
    precisions, retractions = grid.axes["precision"], grid.axes["retraction"]

    def order(c):  # precision, then PIT by retraction, then tied, untied
        h = c.config
        return (precisions.index(h.precision), HEADS.index(h.head),
                retractions.index(h.retraction) if h.head == "pit" else 0)

    for c in sorted(cells(grid), key=order):
        data = _cell_curves(out, c)
        rows, last = data["rows"], data["rows"][-1]
        adv, ref_rows = ref.get((c.config.precision, c.config.retraction), ("", None)) \
            if c.config.head == "pit" else ("", None)
        table.append({
            "precision": c.config.precision, "head": head_label(c.config), "steps": last["step"],
            "final_pinv_drift": last["pinv_drift"], "max_pinv_drift": max(r["pinv_drift"] for r in rows),
            "final_orthonormality": last["orthonormality"], "final_cond_T": last["cond_T"],
            "first_heldout_loss": rows[0].get("heldout_loss", float("nan")),
            "final_train_loss": last.get("train_loss", float("nan")),
            "final_heldout_loss": last.get("heldout_loss", float("nan")),
            "final_shadow_heldout_loss": last.get("shadow_heldout_loss", float("nan")),
            "final_shadow_Z": last["shadow_Z"], "breakdown": data["breakdown"], "reference_adversary": adv,
            "reference_final_pinv_drift": ref_rows[-1]["pinv_drift"] if ref_rows else float("nan"),
            "reference_max_pinv_drift": max(r["pinv_drift"] for r in ref_rows) if ref_rows else float("nan"),
            "_rows": rows, "_reference_rows": ref_rows})
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


def heads_markdown(table: list[dict], grid, info: dict) -> str:
    lines = [f"# Heads comparison: {grid.description}", "",
             "Real training (the lm source: a causal LM on CPython's documentation text) against the same PIT "
             "cells driven by the adversary in `reference/`. Losses in nats per token; pinv_drift = "
             "‖W E − I‖_F as the model computes it; shadow = the float64 twin trained on the same batches.", "",
             "| precision | head | pinv_drift final | pinv_drift max | adversarial max | ‖ZᵀZ−I‖ final | cond T "
             "| held-out loss start → end | train loss end | float64 twin held-out | shadow Z |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in table:
        lines.append(f"| {r['precision']} | {r['head']}{' (broke down)' if r['breakdown'] else ''} | "
                     f"{_g(r['final_pinv_drift'])} | {_g(r['max_pinv_drift'])} | {_g(r['reference_max_pinv_drift'])} | "
                     f"{_g(r['final_orthonormality'])} | {_g(r['final_cond_T'])} | "
                     f"{r['first_heldout_loss']:.3f} → {r['final_heldout_loss']:.3f} | {r['final_train_loss']:.3f} | "
                     f"{_g(r['final_shadow_heldout_loss'])} | {_g(r['final_shadow_Z'])} |")
    lines += ["", f"Cells: {info['cells']}, computed now: {info['computed']}, wall {info['wall_seconds']:.0f} s.", "",
              "![heads](heads.png)", ""]
    return "\n".join(lines)


def plot_heads(out: Path, table: list[dict]) -> list[str]:
    """heads.{png,svg}: held-out loss (train dotted) and pinv_drift against step, a column per precision."""
    from ..report import _pyplot, _save

    plt = _pyplot()
    precisions = list(dict.fromkeys(r["precision"] for r in table))
    fig, axes = plt.subplots(2, len(precisions), figsize=(4.6 * len(precisions) + 0.6, 7.0), squeeze=False,
                             sharex=True)
    labels = list(dict.fromkeys(r["head"] for r in table))
    colours = {h: f"C{k}" for k, h in enumerate(labels)}
    for j, p in enumerate(precisions):
        loss_ax, drift_ax = axes[0][j], axes[1][j]
        for r in (r for r in table if r["precision"] == p):
            steps = [max(x["step"], 1) for x in r["_rows"]]
            c = colours[r["head"]]
            loss_ax.semilogx(steps, [x.get("heldout_loss", float("nan")) for x in r["_rows"]], color=c,
                             marker=".", label=r["head"])
            loss_ax.semilogx(steps, [x.get("train_loss", float("nan")) for x in r["_rows"]], color=c, ls=":")
            drift_ax.loglog(steps, [max(x["pinv_drift"], 1e-17) for x in r["_rows"]], color=c, marker=".",
                            label=r["head"])
            if r["_reference_rows"]:
                ref = r["_reference_rows"]
                drift_ax.loglog([max(x["step"], 1) for x in ref], [max(x["pinv_drift"], 1e-17) for x in ref],
                                color=c, ls="--", alpha=0.6, label=f"{r['head']}, {r['reference_adversary']}")
        loss_ax.set_title(p)
        drift_ax.set_xlabel("step (0 drawn at 1)")
        for ax in (loss_ax, drift_ax):
            ax.grid(True, alpha=0.3)
        if j == 0:
            loss_ax.set_ylabel("loss, nats/token (held-out solid, train dotted)")
            drift_ax.set_ylabel("pinv_drift ‖W E − I‖_F (adversary dashed)")
        loss_ax.legend(fontsize=7)
        drift_ax.legend(fontsize=6)
    fig.tight_layout()
    return _save(plt, fig, out, "heads")


def heads(out: Path | str, grid, reference_grid=None, workers: int | None = None, force: bool = False,
          progress: bool | None = None) -> dict:
    """Sweep the lm heads grid into out (and the reference grid into out/reference), then write heads.csv,
    heads.md and heads.{png,svg}. Returns the table (without curves) and the sweeps' timing."""
    from ..rundir import check_out_path, write_atomic
    from ..sweep import compare

    out = check_out_path(out)
    info = compare(out / "lm", grid, workers=workers, force=force, progress=progress)
    ref_out, ref_info = None, None
    if reference_grid is not None:
        ref_out = out / "reference"
        ref_info = compare(ref_out, reference_grid, workers=workers, force=force, progress=progress)
    table = summarise_heads(out / "lm", grid, ref_out, reference_grid)
    write_atomic(out / "heads.csv", heads_csv(table))
    plots = plot_heads(out, table)
    write_atomic(out / "heads.md", heads_markdown(table, grid, info).encode())
    timing = {"lm_wall_seconds": info["wall_seconds"], "lm_cells": info["cells"], "lm_computed": info["computed"]}
    if ref_info:
        timing.update(reference_wall_seconds=ref_info["wall_seconds"], reference_cells=ref_info["cells"])
    return {"table": [{k: v for k, v in r.items() if not k.startswith("_")} for r in table], "plots": plots,
            **timing}


def main_heads(args) -> int:
    """`pitcheck heads`: the grid from the options, the sweeps, the table on stdout."""
    from dataclasses import replace

    from . import LMParams

    def items(value, what):
        parts = [v.strip() for v in value.split(",")]
        if not all(parts):
            raise PitcheckError(f"{what} must be a comma-separated list, got {value!r}")
        return parts

    lm = replace(LMParams(), **{f: getattr(args, o) for o, f in (
        ("lm_seq_len", "seq_len"), ("lm_sequences", "sequences"), ("lm_layers", "layers"), ("lm_lr", "body_lr"),
        ("lm_eval_sequences", "eval_sequences")) if getattr(args, o) is not None})
    params = {} if args.input_scale is None else {"input_scale": args.input_scale}
    common = dict(precisions=items(args.precisions, "--precisions"), steps=args.steps, vocab=args.vocab,
                  dim=args.dim, optimizer=args.optimizer, lr=args.lr, seed=args.seed, lm=lm.to_json(),
                  adversary_params=params)
    grid = heads_grid(retractions=items(args.retractions, "--retractions"), **common)
    reference = None
    if args.reference != "none":
        reference = heads_grid(retractions=items(args.retractions, "--retractions"), adversary=args.reference,
                               heads=("pit",), **common)
    progress = False if args.no_progress else None
    result = heads(args.out, grid, reference, workers=args.workers, force=args.force, progress=progress)
    print(f"{'precision':<11} {'head':<11} {'pinv_drift':>10} {'adv. max':>10} {'held-out loss':>18}")
    for r in result["table"]:
        print(f"{r['precision']:<11} {r['head']:<11} {r['final_pinv_drift']:>10.3g} "
              f"{r['reference_max_pinv_drift']:>10.3g} {r['first_heldout_loss']:>8.3f} -> {r['final_heldout_loss']:.3f}")
    print(f"-> {Path(args.out) / 'heads.md'}")
    return 0


def add_heads_parser(sub) -> None:
    from ..engine import OPTIMIZERS

    h = sub.add_parser("heads", help="train the lm source with PIT (each retraction), tied and untied heads in "
                       "each precision, beside an adversary's PIT cells: heads.md, heads.csv, heads.png")
    h.add_argument("--precisions", default="fp32,bf16-mixed")
    h.add_argument("--retractions", default="qr,cayley", help="PIT's retractions (comma-separated)")
    h.add_argument("--reference", default="adaptive",
                   help="adversary of the PIT reference cells ('+' sums models), or none")
    h.add_argument("--steps", type=int, default=600)
    h.add_argument("--vocab", type=int, default=1024)
    h.add_argument("--dim", type=int, default=32)
    h.add_argument("--optimizer", default="adam", choices=OPTIMIZERS)
    h.add_argument("--lr", type=float, default=3e-3)
    h.add_argument("--seed", type=int, default=0)
    h.add_argument("--workers", type=int, default=None, help="processes (default: every core)")
    h.add_argument("--out", default="results/lm")
    h.add_argument("--force", action="store_true", help="recompute every cell instead of resuming")
    h.add_argument("--no-progress", action="store_true")
    h.set_defaults(func=main_heads)
