"""`pitcheck heads`: PIT against standard tying and untied tables on real text (pitcheck.verbs.heads)."""
from __future__ import annotations

import argparse
import inspect
from pathlib import Path

from ..model.engine import OPTIMIZERS
from ..infra.errors import PitcheckError
from ..verbs.heads import heads
from .common import add_lm_options, lm_overrides

NEEDS_TORCH = True
# the study's defaults, written once: in heads()'s signature
DEFAULTS = {name: p.default for name, p in inspect.signature(heads).parameters.items()}


def add_parser(sub) -> argparse.ArgumentParser:
    h = sub.add_parser("heads", help="train the lm source with PIT (each retraction), tied and untied heads in "
                       "each precision, beside an adversary's PIT cells: heads.md, heads.csv, heads.png")
    h.add_argument("--precisions", default=",".join(DEFAULTS["precisions"]))
    h.add_argument("--retractions", default=",".join(DEFAULTS["retractions"]), help="PIT's retractions (comma-separated)")
    h.add_argument("--reference", default=",".join(DEFAULTS["reference"]),
                   help="adversaries of the PIT reference cells (comma-separated; '+' sums models; not lm, which "
                   "the lm cells run), or none")
    h.add_argument("--steps", type=int, default=DEFAULTS["steps"])
    h.add_argument("--vocab", type=int, default=DEFAULTS["vocab"])
    h.add_argument("--dim", type=int, default=DEFAULTS["dim"])
    h.add_argument("--optimizer", default=DEFAULTS["optimizer"], choices=OPTIMIZERS)
    h.add_argument("--lr", type=float, default=DEFAULTS["lr"])
    h.add_argument("--seed", type=int, default=DEFAULTS["seed"])
    h.add_argument("--teacher", default=DEFAULTS["teacher"], metavar="FILE.npy|FILE.safetensors:TENSOR",
                   help="start the lm cells' Z (and the baselines' tables) at this embedding's polar factor")
    h.add_argument("--workers", type=int, default=None, help="processes (default: every core)")
    h.add_argument("--out", default="pitcheck-out/heads", help="default: pitcheck-out/heads in the current directory")
    h.add_argument("--force", action="store_true", help="recompute every cell instead of resuming")
    h.add_argument("--no-progress", action="store_true")
    add_lm_options(h)
    return h


def _items(value: str, option: str) -> list[str]:
    parts = [v.strip() for v in value.split(",")]
    if not all(parts):
        raise PitcheckError(f"{option} must be a comma-separated list, got {value!r}")
    return parts


def main(args) -> int:
    """The study from the options, the table on stdout."""
    precisions, retractions = _items(args.precisions, "--precisions"), _items(args.retractions, "--retractions")
    reference = () if args.reference == "none" else _items(args.reference, "--reference")
    # the lm cells' source is lm, so the lm options always apply (lm_overrides refuses them for other sources)
    lm = lm_overrides(argparse.Namespace(**{**vars(args), "adversary": "lm"})).get("lm")
    result = heads(args.out, precisions=precisions, retractions=retractions, reference=reference, steps=args.steps,
                   vocab=args.vocab, dim=args.dim, optimizer=args.optimizer, lr=args.lr, seed=args.seed,
                   teacher=args.teacher, lm=lm, input_scale=args.input_scale, workers=args.workers, force=args.force,
                   progress=False if args.no_progress else None)
    print(f"{'source':<26} {'precision':<11} {'head':<11} {'pinv_drift':>10} {'orthonorm.':>10} {'cond_T':>9} "
          f"{'held-out loss':>16}")
    for r in result["table"]:
        loss = f"{r['first_heldout_loss']:.3f} -> {r['final_heldout_loss']:.3f}" if r["source"] == "lm" else "-"
        print(f"{r['source']:<26} {r['precision']:<11} {r['head']:<11} {r['final_pinv_drift']:>10.3g} "
              f"{r['final_orthonormality']:>10.3g} {r['final_cond_T']:>9.3g} {loss:>16}")
    print(f"-> {Path(args.out) / 'heads.md'}")
    return 0
