"""Retractions, engine steps and whole run steps on a CUDA device, in GEMM units measured in the same run.

    python scripts/studies/gpu_bench.py [--shapes 8192x128,65536x32,49152x576] [--out results/gpu/bench.json]

`pitcheck bench` times with CPU time, which says nothing about asynchronous device work; this script times
with CUDA events (median of repeats after a warm-up) and divides by the GEMM floor of the same shape and
dtype (Z^T Z, V x D x D), so a ratio carries over between cards. For each retraction it also states where
the result lands: ||Z'^T Z' - I||_F in units of u of the storage dtype (computed in float64), so a fast map
that leaves the manifold is seen beside its speed. On a machine without CUDA it runs on the CPU with
wall-clock timers (a smoke test of the script; `pitcheck bench` is the CPU benchmark).
"""
import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from pitcheck.numerics.arrays import TorchOps  # noqa: E402
from pitcheck.model.retractions import APPROXIMATE, RETRACTIONS  # noqa: E402
from pitcheck.verbs.bench.runcost import RunTimer, amortised_ms  # noqa: E402
from pitcheck.trajectory import RunConfig  # noqa: E402

U = {"fp32": 2.0**-24, "tf32": 2.0**-24}  # u of the storage dtype (tf32 stores fp32)


def timed_ms(fn, device, repeats: int) -> float:
    """Median milliseconds of fn() over `repeats` calls after two warm-ups."""
    fn()
    fn()
    samples = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def tall_point(V: int, D: int, device, dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    Z, _ = torch.linalg.qr(torch.randn(V, D, generator=g, dtype=torch.float64))
    G = torch.randn(V, D, generator=g, dtype=torch.float64)
    xi = G - Z @ ((Z.T @ G + G.T @ Z) / 2)
    xi *= 1e-2 * math.sqrt(D) / torch.linalg.norm(xi)
    return Z.to(device=device, dtype=dtype).contiguous(), xi.to(device=device, dtype=dtype).contiguous()


def set_tf32(on: bool) -> None:
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on


def retraction_rows(V, D, device, precision, repeats):
    """The maps on float32 storage (tf32: its matmuls on tensor cores). Narrower policies do not call a map
    on their storage dtype (torch has no bf16 QR or Cholesky): their cost is in the engine's step."""
    set_tf32(precision == "tf32")
    Z, xi = tall_point(V, D, device, torch.float32)
    gemm = timed_ms(lambda: Z.T @ Z, device, repeats)
    ops = TorchOps()
    rows = []
    for name, fn in RETRACTIONS.items():
        if name == "none":
            continue
        try:
            ms = timed_ms(lambda fn=fn: fn(Z, xi, ops), device, repeats)
            out = fn(Z, xi, ops).double()
            ortho = float(torch.linalg.norm(out.T @ out - torch.eye(D, dtype=torch.float64, device=device)))
            rows.append({"retraction": name, "precision": precision, "vocab": V, "dim": D, "ms": ms,
                         "gemm_ms": gemm, "ratio": ms / gemm, "ortho_over_u": ortho / U[precision],
                         "approximate": name in APPROXIMATE})
        except Exception as exc:  # noqa: BLE001 (a map that fails on this device is a finding, reported)
            rows.append({"retraction": name, "precision": precision, "vocab": V, "dim": D,
                         "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"})
    set_tf32(False)
    return rows


def engine_step_rows(V, D, device, precisions, retractions, repeats):
    """One engine step (the engine's gradient stream, optimizer, retraction) of each policy, no shadow."""
    from pitcheck.model.gradients import AdversaryParams, parse_adversary
    from pitcheck.numerics.policy import get_policy
    from pitcheck.trajectory.step import initial_state, make_engine

    rows = []
    for precision in precisions:
        for retraction in retractions:
            config = RunConfig(backend="torch", precision=precision, retraction=retraction, vocab=V, dim=D,
                               device=device.type, shadow=False)
            plan = config.resolve()
            engine = make_engine(plan, "torch", get_policy(precision), device.type)
            engine.initialise(*initial_state(plan))
            names, params, counter = parse_adversary(config.adversary), AdversaryParams(), [0]

            def one_step():
                grads = engine.gradients(names, config.seed, counter[0], params, None)
                engine.step(grads, counter[0])
                counter[0] += 1

            ms = timed_ms(one_step, device, repeats)
            set_tf32(False)
            Z = torch.randn(V, D, device=device)
            gemm = timed_ms(lambda: Z.T @ Z, device, repeats)
            rows.append({"what": f"step:{retraction}", "precision": precision, "vocab": V, "dim": D, "ms": ms,
                         "gemm_ms": gemm, "ratio": ms / gemm, "emulated": list(engine.emulated)})
    return rows


def run_step_rows(V, D, device, precisions, repeats):
    """A whole run step (gradients, model, float64 shadow) and a record, as `pitcheck run` builds them."""
    rows = []
    for precision in precisions:
        config = RunConfig(backend="torch", precision=precision, retraction="qr", vocab=V, dim=D,
                           device=device.type, steps=10_000)
        timer = RunTimer.build(config)
        try:
            step = timed_ms(timer.step, device, repeats)
            record = timed_ms(timer.record, device, max(3, repeats // 5))
        finally:
            timer.close()
        set_tf32(False)
        Z = torch.randn(V, D, device=device)
        gemm = timed_ms(lambda: Z.T @ Z, device, repeats)
        whole = amortised_ms(step, record)
        rows.append({"what": "run step:qr", "precision": precision, "vocab": V, "dim": D, "step_ms": step,
                     "record_ms": record, "amortised_ms": whole, "gemm_ms": gemm, "ratio": whole / gemm})
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--shapes", default="8192x128,65536x32,49152x576")
    ap.add_argument("--precisions", default="fp32,tf32", help="storage of the timed retractions")
    ap.add_argument("--step-precisions", default="fp32,tf32,bf16,bf16-mixed,fp16-mixed")
    ap.add_argument("--step-retractions", default="qr,cholqr2,polar-gram")
    ap.add_argument("--run-shapes", default="2048x64,65536x32", help="shapes of the whole run step")
    ap.add_argument("--run-precisions", default="fp32,bf16-mixed")
    ap.add_argument("--repeats", type=int, default=21)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    device = torch.device(args.device)
    shapes = [tuple(int(s) for s in shape.split("x")) for shape in args.shapes.split(",") if shape]
    report = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "timer": "CUDA events" if device.type == "cuda" else "wall clock",
              "repeats": args.repeats, "retractions": [], "steps": [], "run_steps": []}
    for V, D in shapes:
        for precision in args.precisions.split(","):
            rows = retraction_rows(V, D, device, precision, args.repeats)
            report["retractions"] += rows
            for r in rows:
                text = (f"{r['ratio']:7.2f} GEMMs {r['ms']:8.3f} ms  ortho {r['ortho_over_u']:9.3g} u"
                        if "ratio" in r else r["error"])
                print(f"{V}x{D} {precision:5s} {r['retraction']:16s} {text}", flush=True)
        rows = engine_step_rows(V, D, device, args.step_precisions.split(","), args.step_retractions.split(","),
                                args.repeats)
        report["steps"] += rows
        for r in rows:
            print(f"{V}x{D} {r['precision']:10s} {r['what']:16s} {r['ratio']:7.2f} GEMMs {r['ms']:8.3f} ms"
                  f"{'  emulated: ' + ', '.join(r['emulated']) if r['emulated'] else ''}", flush=True)
        save(report, args.out)
    for shape in args.run_shapes.split(","):
        if not shape:
            continue
        V, D = (int(s) for s in shape.split("x"))
        rows = run_step_rows(V, D, device, args.run_precisions.split(","), max(5, args.repeats // 2))
        report["run_steps"] += rows
        for r in rows:
            print(f"{V}x{D} {r['precision']:10s} run step:qr {r['ratio']:8.1f} GEMMs (step {r['step_ms']:.3f} ms,"
                  f" record {r['record_ms']:.2f} ms, GEMM {r['gemm_ms']:.4f} ms)", flush=True)
        save(report, args.out)


def save(report, out):
    """After every shape: a time limit that stops the script keeps what was measured."""
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
