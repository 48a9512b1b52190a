"""A whole run step (fp32 qr, torch CPU, with its float64 shadow) under the old threading of `pitcheck run`
(torch at 1 thread, numpy's OpenBLAS left at its default of every core) against the thread policy (all at 1),
interleaved rounds in one process, wall time. Usage: PYTHONPATH=. python scripts/measurements/thread_oversubscription.py 2048x64 6
(run it quiet, then beside two busy processes, e.g. two `python -c "while 1: pass"`)."""
import sys, time
from threadpoolctl import threadpool_limits
import torch
from pitcheck.verbs.bench.runcost import RunTimer
from pitcheck.trajectory import RunConfig
V, D = map(int, sys.argv[1].split("x"))
t = RunTimer.build(RunConfig(backend="torch", precision="fp32", retraction="qr", vocab=V, dim=D, device="cpu", steps=10**5))
torch.set_num_threads(1)
n, best = 10, {}
for r in range(int(sys.argv[2])):
    for name in (("old", "policy") if r % 2 == 0 else ("policy", "old")):
        with threadpool_limits(limits=1 if name == "policy" else None):
            t.step()
            t0 = time.perf_counter()
            for _ in range(n): t.step()
            best.setdefault(name, []).append((time.perf_counter() - t0) / n * 1e3)
t.close()
print(V, D, {k: f"min {min(v):.2f} ms, median {sorted(v)[len(v)//2]:.2f} ms" for k, v in best.items()}, "old/policy (median):",
      round(sorted(best["old"])[len(best["old"])//2] / sorted(best["policy"])[len(best["policy"])//2], 2))
