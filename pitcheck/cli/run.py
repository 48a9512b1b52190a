"""`pitcheck run`: one trajectory into a run directory."""
from __future__ import annotations

import argparse
import sys

from .common import add_lm_options, add_run_options, lm_overrides, run_config

NEEDS_TORCH = True


def add_parser(sub) -> argparse.ArgumentParser:
    from ..model.heads import HEADS
    from ..numerics.policy import POLICIES
    from ..model.retractions import RETRACTIONS
    from ..trajectory import RunConfig as DEFAULTS

    p = sub.add_parser("run", help="simulate one trajectory and write a run directory")
    # None: inferred from the precision as compare does (fp64: the numpy reference; anything else: torch)
    p.add_argument("--backend", default=None, choices=["numpy", "torch"],
                   help="numpy (the float64 reference) or torch (default: numpy for fp64, else torch)")
    p.add_argument("--precision", default="fp64", choices=list(POLICIES))
    # None: not given (the default, qr, for --head pit; the baselines refuse an explicit one)
    p.add_argument("--retraction", default=None, help=", ".join(RETRACTIONS) + " (default qr)")
    add_run_options(p, DEFAULTS.steps, DEFAULTS.vocab, DEFAULTS.dim)
    p.add_argument("--head", default="pit", choices=HEADS,
                   help="PIT, or the baselines: standard tying (W = E^T) or two untied tables")
    p.add_argument("--no-shadow", action="store_true", help="torch backend: skip the float64 shadow")
    g = p.add_argument_group("sharded runs (torch backend: Z row-sharded over gloo ranks, T replicated)")
    g.add_argument("--shards", type=int, default=None, metavar="N",
                   help="ranks Z's rows are sharded over (default 1: one process)")
    g.add_argument("--pad-multiple", type=int, default=None, metavar="M",
                   help="pad the vocabulary with zero rows to a multiple of M x N (Megatron's layout)")
    g.add_argument("--allreduce-dtype", default=None, metavar="fp64|fp32|bf16",
                   help="the dtype sums cross the ranks in (default: the tensors' own)")
    p.add_argument("--out", required=True, help="run directory")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
    add_lm_options(p)
    return p


def main(args) -> int:
    from ..trajectory import run, skipped_steps
    from ..trajectory.loop import mostly_skipped

    progress = False if args.no_progress else None  # None: a bar only on a terminal
    cfg = run_config(args, shadow=not args.no_shadow,
                     **lm_overrides(args))
    rows = run(cfg, args.out, resume=args.resume, progress=progress, force=args.force)
    last = rows[-1]
    losses = "".join(f"{k} {last[k]:.4f}  " for k in ("train_loss", "heldout_loss") if k in last)
    skipped = skipped_steps(args.out)
    why = mostly_skipped(skipped, last["step"])
    most = ", most of the run" if why else ""
    skips = f"{sum(skipped.values())} of {last['step']} steps skipped{most} (events.jsonl)  " if skipped else ""
    print(f"step {last['step']}: orthonormality {last['orthonormality']:.3e}  "
          f"pinv_drift {last['pinv_drift']:.3e}  cond_T {last['cond_T']:.3e}  "
          f"trisolve_backward_ratio {last['trisolve_backward_ratio']:.2f}  {losses}{skips}-> {args.out}")
    if why:  # the exit status of a breakdown: the numbers above are not a run's result
        print(f"pitcheck: breakdown: {args.out}: {why}", file=sys.stderr)
        return 1
    return 0
