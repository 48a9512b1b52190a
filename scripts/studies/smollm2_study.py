"""Run (or resume) a SmolLM2 continued-pretraining study and write its table and figure
(pitcheck.verbs.convert.study.smollm2_study). From the repository root:

    .venv/bin/python scripts/studies/smollm2_study.py --runs runs/smollm2 --out results/smollm2 --steps 100
    .venv/bin/python scripts/studies/smollm2_study.py --runs runs/smollm2-modes --out results/smollm2/modes \
        --steps 100 --precisions fp32 --heads pit-qr --modes keep-head,balanced,keep-embedding-scaled,sqrt \
        --record-every 10 --also results/smollm2/steps300/smollm2.csv \
        --also-runs tied_fp32,untied_fp32,pit-qr_fp32=pit-qr-keep-embedding_fp32

Each head x mode x precision is its own run directory under --runs (SIGKILL-resumable: rerun the same
command); the wall seconds each call took are appended to OUT/timings.json.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout's pitcheck, run from anywhere

from pitcheck.verbs.convert.study import parse_heads, smollm2_study  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", required=True)
    parser.add_argument("--out", default="results/smollm2")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--precisions", default="fp32,bf16-mixed")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--heads", default="tied,untied,pit-qr,pit-cholqr2")
    parser.add_argument("--modes", default=None, help="PIT's conversion modes (comma-separated); runs are then "
                        "named with their mode and the figure gains a cond(T) panel")
    parser.add_argument("--record-every", type=int, default=10)
    parser.add_argument("--existing-only", action="store_true",
                        help="resume and collect only the runs that have a directory under --runs, starting none")
    parser.add_argument("--also", action="append", default=None,
                        help="another study's smollm2.csv whose curves the figure also draws (may be given again)")
    parser.add_argument("--also-runs", default=None, help="only these runs of --also (comma-separated; OLD=NEW "
                        "draws run OLD under the name NEW)")
    args = parser.parse_args()
    names = smollm2_study(args.runs, args.out, steps=args.steps, precisions=args.precisions.split(","),
                          heads=parse_heads(args.heads), modes=args.modes.split(",") if args.modes else None,
                          record_every=args.record_every, also=args.also,
                          also_labels=args.also_runs.split(",") if args.also_runs else None, threads=args.threads,
                          existing_only=args.existing_only)
    for name in names:
        print(name)


if __name__ == "__main__":
    main()
