"""Six cells of one precision and retraction at 128 x 8 (3 seeds x {gaussian, dense_output+sparse_input}, the
default grid's cells of one class), run alone one after another and then as one batch, in one process, one
thread: process CPU time of each, twice, and the steps the stack took of each cell (results/bench/BATCHED.md).

    .venv/bin/python scripts/measurements/batched_pair.py fp16 qr 2000
"""
import sys
import tempfile
import time

from pitcheck.infra.threads import thread_policy
from pitcheck.trajectory import RunConfig, Trajectory, run
from pitcheck.trajectory.batched import run_batch


def main(precision: str, retraction: str, steps: int, repeats: int = 2) -> None:
    configs = [RunConfig(precision=precision, retraction=retraction, vocab=128, dim=8, steps=steps, seed=seed,
                         adversary=adversary)
               for adversary in ("gaussian", "dense_output,sparse_input") for seed in range(3)]
    with thread_policy(1):
        for _ in range(repeats):
            scratch = tempfile.mkdtemp(prefix="pitcheck-batched-pair-")
            t0 = time.process_time()
            for k, config in enumerate(configs):
                run(config, f"{scratch}/alone{k}", progress=False)
            alone = time.process_time() - t0
            t0 = time.process_time()
            outcomes = run_batch([Trajectory(c, f"{scratch}/batch{k}", progress=False) for k, c in enumerate(configs)])
            batched = time.process_time() - t0
            print(f"{precision} {retraction} {steps} steps x {len(configs)} cells: alone {alone:.2f} s, batched "
                  f"{batched:.2f} s (CPU), speed-up {alone / batched:.2f}x, stack steps "
                  f"{[o.batched_steps for o in outcomes]}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
