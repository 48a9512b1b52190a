"""Where a GPU stops paying for a cell: one process per device, then many processes on one GPU.

    python scripts/measurements/device_crossover.py [--shapes 128x8,512x16,2048x64,8192x128] [--steps 300] [--out FILE.json]

For each shape (torch fp32 qr, Gaussian gradients, SGD lr 0.01, seed 0):
  model_ms   the model's step alone (sweep.cells.time_steps: what compare's ms/step column reports), on the
             CPU with one thread (as compare's pool pins each worker) and on CUDA;
  run_ms     a whole `run` (shadow, gradient stream, records and commits on the default schedule) over
             --steps, per step, on each device.
Then contention: time_steps at the smallest shape in k processes at once on the GPU (k = 1, 4, 16), as
compare's local pool runs its cells (one process per core, each its own CUDA context).
"""
import argparse
import json
import multiprocessing as mp
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def config_of(shape: str, device: str, steps: int):
    from pitcheck.trajectory import RunConfig

    vocab, dim = (int(x) for x in shape.split("x"))
    return RunConfig(backend="torch", precision="fp32", retraction="qr", vocab=vocab, dim=dim, steps=steps,
                     device=device, seed=0)


def model_ms(shape: str, device: str) -> float:
    from pitcheck.verbs.compare.cells import time_steps
    from pitcheck.infra.threads import thread_policy

    with thread_policy(1):
        return time_steps(config_of(shape, device, 10))


def run_ms(shape: str, device: str, steps: int) -> float:
    from pitcheck.trajectory import run

    with tempfile.TemporaryDirectory() as scratch:
        t0 = time.perf_counter()
        run(config_of(shape, device, steps), Path(scratch) / "run", progress=False, threads=1)
        return 1e3 * (time.perf_counter() - t0) / steps


def _contended(args):
    shape, start = args
    while time.time() < start:  # every process starts its timed steps together
        time.sleep(0.001)
    return model_ms(shape, "cuda")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="128x8,512x16,2048x64,8192x128")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--processes", default="1,4,16")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    import torch

    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    out = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name() if len(devices) > 1 else None,
           "steps": args.steps, "shapes": {}, "contention": {}}
    for device in devices:  # warm-up: CUDA context, cuBLAS and cuSOLVER handles
        model_ms("128x8", device)
    for shape in args.shapes.split(","):
        row = {}
        for device in devices:
            row[f"model_ms_{device}"] = round(model_ms(shape, device), 4)
            row[f"run_ms_{device}"] = round(run_ms(shape, device, args.steps), 4)
        out["shapes"][shape] = row
        print(shape, json.dumps(row), flush=True)
    if "cuda" in devices:
        smallest = args.shapes.split(",")[0]
        ctx = mp.get_context("spawn")
        for k in (int(x) for x in args.processes.split(",")):
            with ctx.Pool(k) as pool:
                pool.starmap(model_ms, [("128x8", "cpu")] * k)  # imports done before the clock starts
                start = time.time() + 5
                times = pool.map(_contended, [(smallest, start)] * k)
            out["contention"][k] = {"median_ms": round(sorted(times)[len(times) // 2], 4),
                                    "max_ms": round(max(times), 4)}
            print(f"{k} processes on one GPU at {smallest}:", json.dumps(out["contention"][k]), flush=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
