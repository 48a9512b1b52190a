"""Where a run step's time goes on a CUDA device: the shadow on the GPU, the shadow on the CPU, no shadow.

    python scripts/measurements/gpu_step_profile.py [--vocab 8192 --dim 128 --steps 100] [--out results/gpu/step_profile.json]

Three runs of one config (torch fp32 qr Adam, the model on cuda), timed whole in one process:
  gpu-shadow  the default placement: the float64 shadow in torch float64 on the model's GPU;
  cpu-shadow  the placement before it: the shadow in numpy float64 on the CPU (the placement monkeypatched);
  no-shadow   the model alone.
Each run's seconds a step are the run's wall time over its steps (a 10-step warm-up run first, not counted),
so metrics records and commits are amortised on the default schedule. The host-side gradient stream (numpy
float64, drawn on the CPU for model and shadow alike) is timed on its own at the same shape. Then cProfile of
the gpu-shadow run: the functions with the most cumulative time.
"""
import argparse
import cProfile
import io
import json
import pstats
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from pitcheck.model.gradients import AdversaryParams, gradient  # noqa: E402
from pitcheck.trajectory import RunConfig, run  # noqa: E402
from pitcheck.trajectory import step as step_module  # noqa: E402

DEFAULT_PLACEMENT = step_module.shadow_engine_placement


def timed_run(config, placement=None):
    step_module.shadow_engine_placement = placement or DEFAULT_PLACEMENT
    try:
        with tempfile.TemporaryDirectory() as scratch:
            if config.device.startswith("cuda"):
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            rows = run(config, Path(scratch) / "run", progress=False)
            seconds = time.perf_counter() - t0
            manifest = json.loads((Path(scratch) / "run" / "manifest.json").read_text())
    finally:
        step_module.shadow_engine_placement = DEFAULT_PLACEMENT
    return seconds, rows[-1], manifest


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    base = dict(backend="torch", precision="fp32", retraction="qr", vocab=args.vocab, dim=args.dim,
                device=args.device, optimizer="adam", lr=1e-2, seed=0)
    variants = {"gpu-shadow": (dict(), None),
                "cpu-shadow": (dict(), lambda config: ("numpy", "cpu")),
                "no-shadow": (dict(shadow=False), None)}
    out = {"torch": torch.__version__, "device": torch.cuda.get_device_name() if args.device.startswith("cuda")
           else "cpu", "config": base, "steps": args.steps, "runs": {}}
    timed_run(RunConfig(**base, steps=10))  # CUDA context, cuBLAS and cuSOLVER handles: not a step's cost
    for name, (extra, placement) in variants.items():
        seconds, last, manifest = timed_run(RunConfig(**base, **extra, steps=args.steps), placement)
        out["runs"][name] = {"seconds": round(seconds, 3), "ms_per_step": round(1e3 * seconds / args.steps, 2),
                             "shadow": manifest.get("shadow"), "device": manifest.get("device"),
                             "orthonormality": last.get("orthonormality"), "shadow_Z": last.get("shadow_Z")}
        print(name, json.dumps(out["runs"][name]), flush=True)
    rng = np.random.default_rng(0)
    Z = np.linalg.qr(rng.standard_normal((args.vocab, args.dim)))[0]
    L = np.eye(args.dim)
    t0 = time.perf_counter()
    for step in range(20):
        gradient("gaussian", Z, L, 0, step, AdversaryParams())
    out["gradient_stream_ms"] = round(1e3 * (time.perf_counter() - t0) / 20, 2)
    print("host gradient stream (numpy float64) ms a step:", out["gradient_stream_ms"], flush=True)
    profiler = cProfile.Profile()
    profiler.enable()
    timed_run(RunConfig(**base, steps=args.steps))
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(25)
    out["profile"] = text.getvalue()
    print(text.getvalue()[-6000:])
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
