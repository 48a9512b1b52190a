"""Wall time of a whole run step (model + float64 shadow + gradients, fp32 qr, torch CPU) with 1 vs 2 threads,
in interleaved rounds of one process, minimum taken: the measurement behind pitcheck.infra.threads.DEFAULT_THREADS.
Usage: PYTHONPATH=. python scripts/measurements/thread_ratio.py [ROUNDS]  (on a quiet machine)."""
import sys, time
import numpy as np
from pitcheck.infra.threads import limited_threads
from pitcheck.model.gradients import parse_adversary
from pitcheck.trajectory import RunConfig
from pitcheck.trajectory.step import Lockstep
shapes = [(128, 8), (2048, 64), (2048, 32), (8192, 128), (65536, 32)]
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
for V, D in shapes:
    cfg = RunConfig(backend="torch", precision="fp32", retraction="qr", vocab=V, dim=D, device="cpu", steps=10**6)
    pair = Lockstep(cfg)
    names = parse_adversary(cfg.adversary)
    state = [0]
    n = max(3, min(200, int(2e7 / (V * D * D))))
    def steps():
        for _ in range(n):
            g, sg = pair.gradients(names, state[0], None)
            pair.step(g, sg, state[0]); state[0] += 1
    best = {1: 1e9, 2: 1e9}
    for r in range(rounds):
        for t in (1, 2) if r % 2 == 0 else (2, 1):
            with limited_threads(t):
                steps()  # warm
                t0 = time.perf_counter(); steps(); best[t] = min(best[t], (time.perf_counter() - t0) / n)
    print(f"{V}x{D}: 1 thread {best[1]*1e3:.2f} ms/step, 2 threads {best[2]*1e3:.2f} ms/step, ratio 2t/1t {best[2]/best[1]:.2f}", flush=True)
