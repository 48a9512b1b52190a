"""`pitcheck plot`: metrics of run directories against step, in one figure sized for a paper's column (one
panel) or page (two or more)."""
from __future__ import annotations

import argparse
import sys

NEEDS_TORCH = False


def add_parser(sub) -> argparse.ArgumentParser:
    g = sub.add_parser("plot", help="plot metrics of run directories against step")
    g.add_argument("runs", nargs="+", help="run directories; each line is labelled by what sets its manifest's "
                   "config apart from the others' (the shared settings go in the title)")
    g.add_argument("--metrics", default=None, help="comma-separated metrics.csv columns (default: orthonormality, "
                   "pinv_drift and trisolve_forward, those of them the runs record)")
    g.add_argument("--out", required=True, help="figure file: .png, .svg or .pdf (no suffix: PNG)")
    g.add_argument("--dpi", type=int, default=110, help="resolution of a PNG (default 110; 300 for print)")
    g.add_argument("--format", choices=("png", "svg", "pdf"), default=None,
                   help="the file's format (default: as --out's suffix says)")
    return g


def main(args) -> int:
    from ..infra.rundir import writes_to_stdout
    from ..verbs.plot import plot_runs

    metrics = None if args.metrics is None else args.metrics.split(",")
    saved = plot_runs(args.runs, args.out, metrics, dpi=args.dpi, fmt=args.format)
    # the path is said where it cannot end up inside an image written to stdout
    print(saved, file=sys.stderr if writes_to_stdout(args.out) else sys.stdout)
    return 0
