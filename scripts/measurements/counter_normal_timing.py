"""One draw of standard normals from pitcheck.numerics.counter_normal (Philox4x32-10 in torch int64) against
numpy's default_rng([seed, step, index]).standard_normal of the same shape (the host stream a step draws
today), at 32768 x 512 and 2048 x 64: on the CPU with one thread and with all of torch's threads, and on
CUDA where there is one, unfused and as one Triton kernel (torch.cuda.synchronize around each draw). Median
over REPEATS draws (after one warm-up) of wall time, and of the process's CPU time on the CPU (on a shared
machine wall times swing with the load; CPU time at one thread much less).

    PYTHONPATH=. python scripts/measurements/counter_normal_timing.py [REPEATS]
"""
import statistics
import sys
import time

import numpy as np
import torch

from pitcheck.infra.threads import available_cores, limited_threads
from pitcheck.numerics.counter_normal_fused import normals

SHAPES = [(32768, 512), (2048, 64)]
SEED, STEP, INDEX = 1, 2, 3


def timed(draw, repeats: int, sync=lambda: None) -> tuple[float, float]:
    """Median wall and process CPU seconds of draw() over `repeats` calls, after one warm-up call."""
    draw()
    sync()
    walls, cpus = [], []
    for _ in range(repeats):
        w, c = time.perf_counter(), time.process_time()
        draw()
        sync()
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    return statistics.median(walls), statistics.median(cpus)


def numpy_draw(shape):
    return lambda: np.random.default_rng([SEED, STEP, INDEX]).standard_normal(shape)


def torch_draw(shape, device="cpu", fused=None):
    return lambda: normals(shape, SEED, STEP, INDEX, device=device, fused=fused)


def main():
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    cores = available_cores()
    print(f"torch {torch.__version__}, numpy {np.__version__}, {cores} cores, median of {repeats}")
    print(f"{'shape':>12} {'draw':>30} {'threads':>7} {'wall ms':>9} {'cpu ms':>9} {'np/this':>8}")
    for shape in SHAPES:
        label = f"{shape[0]} x {shape[1]}"
        with limited_threads(1):
            base, base_cpu = timed(numpy_draw(shape), repeats)
        rows = [("numpy default_rng", 1, base, base_cpu)]
        for threads in sorted({1, cores}):
            with limited_threads(threads):
                rows.append(("counter_normal cpu", threads, *timed(torch_draw(shape), repeats)))
        if torch.cuda.is_available():  # a torch kernel an operation, then the one-kernel form (where Triton is)
            for fused, label_ in ((False, "unfused"), (True, "fused")):
                try:
                    wall, _ = timed(torch_draw(shape, "cuda", fused), repeats, torch.cuda.synchronize)
                except Exception as exc:  # no Triton there: say so in the table
                    print(f"{label:>12} counter_normal cuda {label_}: {type(exc).__name__}: {exc}"[:200])
                    continue
                rows.append((f"cuda {label_} {torch.cuda.get_device_name()}"[:30], "-", wall, float("nan")))
        for name, threads, wall, cpu in rows:
            print(f"{label:>12} {name:>30} {threads:>7} {wall * 1e3:9.1f} {cpu * 1e3:9.1f} {base / wall:8.2f}",
                  flush=True)


if __name__ == "__main__":
    main()
