"""Where a CUDA run step's time goes at a training shape: GPU kernel time, host time, kernel launches.

    python scripts/measurements/gpu_run_profile.py [--shape 32768x512] [--steps 20] [--out profile.json]

Profiles (torch.profiler, CPU and CUDA activity) three things built as bench builds them, on the counter
stream drawn on the device: the model's step alone (SGD, no shadow) for cholqr2 and qr; a whole run step
(model, float64 shadow, deferred checks) for cholqr2; and a record's metrics row and commit. For each: wall
ms a step (synchronised at the ends), the summed GPU kernel time a step, kernel launches a step, and the
ops with the most GPU and the most host time. A step whose wall is far above its kernel time is host- or
launch-bound; one near it is bound by its kernels.
"""
import argparse
import json
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from pitcheck.trajectory import RunConfig  # noqa: E402
from pitcheck.verbs.bench.benchmark import step_cases  # noqa: E402
from pitcheck.verbs.bench.runcost import AMORTISED_STEPS, RunTimer  # noqa: E402

LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx")


def device_us(evt) -> float:
    for name in ("self_device_time_total", "self_cuda_time_total"):
        if hasattr(evt, name):
            return float(getattr(evt, name))
    return 0.0


def profiled(fn, steps: int, device: str, rows: int) -> dict:
    for _ in range(3):  # warm: handles, workspaces, allocator
        fn()
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    sync()
    wall = (time.perf_counter() - t0) / steps
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    with profile(activities=acts) as prof:
        for _ in range(steps):
            fn()
        sync()
    avg = prof.key_averages()
    gpu = [e for e in avg if device_us(e) > 0 and e.key not in LAUNCHES]
    kernel_us = sum(device_us(e) for e in gpu)
    launches = sum(e.count for e in avg if e.key in LAUNCHES)
    top_gpu = sorted(gpu, key=device_us, reverse=True)[:rows]
    top_cpu = sorted(avg, key=lambda e: e.self_cpu_time_total, reverse=True)[:rows]
    return {"wall_ms": round(1e3 * wall, 3), "kernel_ms": round(kernel_us / 1e3 / steps, 3),
            "launches": round(launches / steps, 1),
            "top_gpu": [(e.key[:90], round(device_us(e) / 1e3 / steps, 4), round(e.count / steps, 2)) for e in top_gpu],
            "top_cpu": [(e.key[:90], round(e.self_cpu_time_total / 1e3 / steps, 4), round(e.count / steps, 2))
                        for e in top_cpu]}


def show(name: str, r: dict) -> None:
    print(f"\n## {name}: wall {r['wall_ms']} ms a step, kernels {r['kernel_ms']} ms, {r['launches']} launches",
          flush=True)
    print("  GPU (ms a step, calls a step):")
    for k, ms, n in r["top_gpu"]:
        print(f"    {ms:9.4f} {n:7.2f}  {k}")
    print("  host, self (ms a step, calls a step):")
    for k, ms, n in r["top_cpu"]:
        print(f"    {ms:9.4f} {n:7.2f}  {k}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="32768x512")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rows", type=int, default=14)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--stream", default="counter")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    V, D = (int(x) for x in args.shape.lower().split("x"))
    out = {"torch": torch.__version__, "shape": [V, D], "device": args.device, "stream": args.stream, "parts": {}}
    for case in step_cases(V, D, ["cholqr2", "qr"], device=args.device, gradient_stream=args.stream):
        if case.name.startswith("step:"):
            out["parts"][case.name] = profiled(case.fn, args.steps, args.device, args.rows)
            show(case.name, out["parts"][case.name])
    timer = RunTimer.build(RunConfig(backend="torch", precision="fp32", retraction="cholqr2", vocab=V, dim=D,
                                     device=args.device, steps=AMORTISED_STEPS, gradient_stream=args.stream))
    try:
        for name, fn, n in (("run step:cholqr2", timer.step, args.steps), ("metrics row", timer.measure, 3),
                            ("commit", timer.commit, 3)):
            out["parts"][name] = profiled(fn, n, args.device, args.rows)
            show(name, out["parts"][name])
    finally:
        timer.close()
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
