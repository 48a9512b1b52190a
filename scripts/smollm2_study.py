"""Run (or resume) the committed SmolLM2 continued-pretraining study and write results/smollm2/.

    python scripts/smollm2_study.py --runs /tmp/smollm2-runs --out results/smollm2 --steps 100

Each head x precision is its own run directory under --runs (SIGKILL-resumable: rerun the same command);
the wall seconds each call took are appended to OUT/timings.json so the README can say how long it took.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from pitcheck.sources.pretrained.study import run_study, write_study
from pitcheck.infra.threads import apply_thread_policy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", required=True)
    parser.add_argument("--out", default="results/smollm2")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--precisions", default="fp32,bf16-mixed")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--heads", default="tied,untied,pit-qr,pit-cholqr2")
    parser.add_argument("--record-every", type=int, default=10)
    parser.add_argument("--also", default=None, help="another study's smollm2.csv whose curves the figure also draws")
    args = parser.parse_args()
    apply_thread_policy(args.threads)
    options = dict(steps=args.steps, sequences=2, seq_len=32, eval_sequences=4,
                   record_every=args.record_every, checkpoint_every=args.record_every)
    start = time.monotonic()
    heads = [tuple(h.split("-", 1)) if h.startswith("pit-") else (h, "") for h in args.heads.split(",")]
    seconds = run_study(args.runs, precisions=tuple(args.precisions.split(",")), heads=heads, progress=True,
                        **options)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    timings = out / "timings.json"
    log = json.loads(timings.read_text()) if timings.exists() else []
    log.append({"options": options, "precisions": args.precisions, "threads": args.threads,
                "seconds": {k: round(v, 1) for k, v in seconds.items()},
                "total_seconds": round(time.monotonic() - start, 1)})
    timings.write_text(json.dumps(log, indent=1) + "\n")
    for name in write_study(out, args.runs, also=args.also):
        print(name)


if __name__ == "__main__":
    main()
