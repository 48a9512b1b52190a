"""Per-step time of the float64 shadow on the numpy backend (what runs use) against the same shadow on torch
float64, beside the fp32 model and the gradient stream, interleaved rounds in one process (minimum taken);
and the distance the two shadows reach after the same steps. With numpy's gradient stream against torch's.
The measurement behind keeping the shadow on numpy (pitcheck/trajectory/step.py).
Usage: PYTHONPATH=. python scripts/measurements/shadow_backend.py   (on a quiet machine)."""
import time

import numpy as np
import torch

from pitcheck.model.gradients import parse_adversary
from pitcheck.numerics.policy import get_policy
from pitcheck.infra.threads import pin_threads
from pitcheck.trajectory import RunConfig
from pitcheck.trajectory.step import Lockstep, initial_state, make_engine

pin_threads(1)
for V, D in [(128, 8), (1024, 32), (2048, 64), (8192, 128), (65536, 32)]:
    cfg = RunConfig(backend="torch", precision="fp32", retraction="qr", vocab=V, dim=D, device="cpu", steps=10**6)
    pair = Lockstep(cfg)
    torch_shadow = make_engine(cfg.resolve(), "torch", get_policy("fp64"), "cpu")
    torch_shadow.initialise(*initial_state(cfg.resolve()))
    names = parse_adversary(cfg.adversary)
    n = max(3, min(300, int(3e7 / (V * D * D))))
    grads = [pair.gradients(names, s, None)[0] for s in range(n)]
    gen = torch.Generator().manual_seed(0)
    best = {}
    for _ in range(3):
        for name, eng in (("numpy shadow", pair.shadow), ("torch64 shadow", torch_shadow), ("fp32 model", pair.engine)):
            t0 = time.perf_counter()
            for s, g in enumerate(grads):
                eng.step(g, s)
            best[name] = min(best.get(name, 1e9), (time.perf_counter() - t0) / n)
        t0 = time.perf_counter()
        for s in range(n):
            pair.gradients(names, s, None)
        best["numpy gradients"] = min(best.get("numpy gradients", 1e9), (time.perf_counter() - t0) / n)
        t0 = time.perf_counter()
        for s in range(n):
            torch.randn(V, D, dtype=torch.float64, generator=gen), torch.randn(D, D, dtype=torch.float64, generator=gen)
        best["torch randn (same shapes)"] = min(best.get("torch randn (same shapes)", 1e9), (time.perf_counter() - t0) / n)
    Zn, Zt = pair.shadow.stored()[0], torch_shadow.stored()[0]
    print(f"{V} x {D}: " + ", ".join(f"{k} {v * 1e3:.3f} ms" for k, v in best.items())
          + f"; shadows apart by {np.linalg.norm(Zn - Zt) / np.linalg.norm(Zn):.1e} after {n * 3} steps", flush=True)
