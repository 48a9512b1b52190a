"""The stacked gradient stream (pitcheck.model.stacked_gradients) against the per-cell loop it replaces, in one
process, one thread, old and new interleaved (ratios hold under load; absolute times do not):

1. K = 8 cells at 128 x 8, each adversary of the default grid: us per cell-step, median over rounds;
2. run_batch of 8 fp32 qr cells (4 seeds x both adversaries) of STEPS steps: process CPU time with
   StackedRuns.gradients patched back to the per-cell loop, and as it is; median over rounds.

    PYTHONPATH=. python scripts/measurements/stacked_gradient_timing.py [ROUNDS] [STEPS]
"""
import sys
import tempfile
import time

import numpy as np

from pitcheck.model.gradients import AdversaryParams, gradient
from pitcheck.model.stacked_gradients import stacked_gradients
from pitcheck.infra.threads import thread_policy
from pitcheck.trajectory import RunConfig, Trajectory
from pitcheck.trajectory import batched
from tests.model.test_gradient_stream_exact import model_pair


def per_cell_gradients(self, step):
    """StackedRuns.gradients before the stack: gradient() run by run, then stacked."""
    Z, L = self.model.stored()
    grads = [gradient(names, Z[k], L[k], t.config.seed, step, t.config.adversary_params)
             for k, (t, names) in enumerate(zip(self.runs, self.names))]
    return np.stack([g for g, _ in grads]), np.stack([np.tril(g) for _, g in grads])


def stream_timing(rounds: int, K: int = 8, V: int = 128, D: int = 8, calls: int = 300) -> None:
    pairs = [model_pair(V, D, k) for k in range(K)]
    Z, L = np.stack([z for z, _ in pairs]), np.stack([l for _, l in pairs])
    params = AdversaryParams()
    for names in (["gaussian"], ["dense_output", "sparse_input"]):
        cells = [(names, seed, params) for seed in range(K)]
        ways = {"old": lambda step: [gradient(names, Z[k], L[k], k, step, params) for k in range(K)],
                "new": lambda step: stacked_gradients(cells, Z, L, step)}
        times = {"old": [], "new": []}
        for r in range(rounds):
            for which in ("old", "new") if r % 2 == 0 else ("new", "old"):
                t0 = time.process_time()
                for step in range(calls):
                    ways[which](step)
                times[which].append((time.process_time() - t0) / calls / K * 1e6)
        old, new = np.median(times["old"]), np.median(times["new"])
        print(f"K={K} {V}x{D} {','.join(names):>26}: per-cell {old:6.1f} us, stacked {new:6.1f} us per cell-step, "
              f"{old / new:.2f}x", flush=True)


def batch_timing(rounds: int, steps: int) -> None:
    configs = [RunConfig(precision="fp32", retraction="qr", vocab=128, dim=8, steps=steps, seed=seed,
                         adversary=adversary, device="cpu")
               for adversary in ("gaussian", "dense_output,sparse_input") for seed in range(4)]
    new_gradients = batched.StackedRuns.gradients
    times = {"old": [], "new": []}
    taken = set()  # the stack steps each cell took: the same both ways (the same gradients)
    for r in range(rounds):
        for which in ("old", "new") if r % 2 == 0 else ("new", "old"):
            batched.StackedRuns.gradients = per_cell_gradients if which == "old" else new_gradients
            scratch = tempfile.mkdtemp(prefix="pitcheck-stacked-gradients-")
            t0 = time.process_time()
            outcomes = batched.run_batch([Trajectory(c, f"{scratch}/{k}", progress=False)
                                          for k, c in enumerate(configs)])
            times[which].append(time.process_time() - t0)
            taken.add(tuple(o.batched_steps for o in outcomes))
    batched.StackedRuns.gradients = new_gradients
    old, new = np.median(times["old"]), np.median(times["new"])
    print(f"run_batch 8 fp32 qr cells x {steps} steps: per-cell gradients {old:.2f} s, stacked {new:.2f} s "
          f"(CPU), {old / new:.2f}x; stack steps per cell {sorted(taken)}", flush=True)
    assert len(taken) == 1


if __name__ == "__main__":
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    with thread_policy(1):
        stream_timing(rounds)
        batch_timing(max(3, rounds // 2), steps)
