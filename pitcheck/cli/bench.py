"""`pitcheck bench`: the options, the report on stdout, one line per shape on stderr.

Bad input ends in `pitcheck bench: error: ...` and exit status 2 (this verb's own prefix, as before the
CLI was a package); the timing itself is pitcheck.verbs.bench.benchmark.bench.
"""
from __future__ import annotations

import argparse
import sys

from ..verbs.bench.benchmark import QUICK_SHAPES, bench, report
from ..infra.errors import PitcheckError
from .common import check_writable

NEEDS_TORCH = True


def _shape(text: str) -> tuple[int, int]:
    try:
        v, d = text.lower().split("x")
        V, D = int(v), int(d)
    except ValueError:
        raise argparse.ArgumentTypeError(f"shape {text!r}: write VxD, e.g. 8192x128") from None
    if not (V >= 2 and 1 <= D <= V):
        raise argparse.ArgumentTypeError(f"shape {text!r}: need 1 <= D <= V")
    return V, D


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("bench", help="cost of each retraction, peer, full step and metrics record, as "
                                     "ratios to the GEMM floor measured in the same run")
    p.add_argument("--quick", action="store_true", help=f"shapes {', '.join(f'{v}x{d}' for v, d in QUICK_SHAPES)}, "
                                                        "5 rounds, V x V peers only up to V = 2048")
    p.add_argument("--json", metavar="FILE", help="write {machine, results: [{retraction, precision, vocab, dim, ms, "
                                                  "gemm_ms, ratio, peer}], ...}")
    p.add_argument("--out", metavar="DIR", help="write report.md, bench.json and bench.png here")
    p.add_argument("--shape", type=_shape, action="append", metavar="VxD",
                   help="a shape to time (repeatable; a shape given twice is refused)")
    p.add_argument("--rounds", type=int, help="interleaved rounds (minimum taken); default 5 quick, 9 full")
    p.add_argument("--retractions", help="comma-separated subset, each named once (default: all but none)")
    p.add_argument("--no-peers", action="store_true", help="skip torch/geoopt/geotorch peers")
    p.add_argument("--no-steps", action="store_true", help="skip full steps, metrics records and whole run steps")
    p.add_argument("--device", default="cpu", metavar="DEVICE",
                   help="cpu (default), cuda, cuda:N or auto: where every case runs; on CUDA each is timed as wall time "
                        "between synchronisations, and the peers and numpy's GEMM (CPU comparisons) are not run")
    p.add_argument("--gradient-stream", default="numpy", choices=["numpy", "counter"],
                   help="the stream the steps and the whole run step draw from (pitcheck run --gradient-stream)")
    p.add_argument("--grid", action="store_true", help="also cost the default compare grid: its cells per second "
                                                       "(each cost class built and timed as a run, and each of compare's batches as one stack; "
                                                       "about two minutes); with --device cuda also its torch cells on the GPU, "
                                                       "one after another, against the CPU pool")
    return p


def main(args) -> int:
    names = None
    if args.retractions is not None:  # '' is an empty list, refused, not the default
        names = [n.strip() for n in args.retractions.split(",") if n.strip()]
    try:
        check_writable(files=[("--json", args.json)], dirs=[("--out", args.out)])
        doc = bench(args.shape, quick=args.quick, rounds=args.rounds, retractions=names, peers=not args.no_peers,
                    steps=not args.no_steps, json_path=args.json, out=args.out, progress=True, grid=args.grid,
                    device=args.device, gradient_stream=args.gradient_stream)
    except PitcheckError as exc:
        print(f"pitcheck bench: error: {exc}", file=sys.stderr)
        return 2
    print(report(doc))
    return 0
