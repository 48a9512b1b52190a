"""How many threads pitcheck's libraries compute with: the one place that sets it.

torch's pools are set through torch; every BLAS and OpenMP runtime already loaded (numpy's and scipy's
OpenBLAS, torch's libgomp) through threadpoolctl; libraries not yet loaded, and child processes, through
the environment variables they read when they start. Why pin at all: workers sharing a machine fight over
its cores (measured here, 2 cores: a 1024 x 32 numpy QR right after a torch matmul takes ~70 ms with
OpenBLAS's default two threads and ~1.5 ms with one), and every cell must compute with the same thread
count whichever executor ran it, so that results are bit-identical.
"""
from __future__ import annotations

import contextlib
import os

from .errors import PitcheckError

# the variables BLAS libraries and OpenMP read when they load
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
                    "NUMEXPR_NUM_THREADS")


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def thread_env(threads: int) -> dict[str, str]:
    """Environment for a process not yet started (or libraries not yet loaded) to use `threads` threads."""
    return {name: str(threads) for name in THREAD_VARIABLES}


def _loaded_pools() -> list[str]:
    from threadpoolctl import threadpool_info

    return sorted({os.path.basename(info["filepath"]) for info in threadpool_info()})


def pin_threads(threads: int = 1) -> list[str]:
    """Pin this whole process to `threads` threads, for good: torch, every loaded BLAS/OpenMP and any
    loaded later. Returns what was pinned (torch and the libraries' file names), for reports."""
    os.environ.update(thread_env(threads))
    import numpy  # noqa: F401  (load the BLAS libraries, so that they are pinned now, not at first use)
    import scipy.linalg  # noqa: F401
    import torch
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set, or parallel work has started: harmless
        pass
    threadpool_limits(limits=threads)
    return ["torch", *_loaded_pools()]


# The thread policy of every verb (`--threads N` overrides it). One thread per process by default: measured
# on 2 cores (scripts/measurements/thread_ratio.py: a whole run step, model + float64 shadow + gradients, 1 vs 2 threads
# interleaved in one run) two threads took 1.2x (128 x 8) to 1.8x (2048 x 64) the time of one, where a step
# is a chain of small dependent BLAS/LAPACK calls that a second thread only synchronises, and gained
# nothing at 65536 x 32 and 8% at 8192 x 128; one thread also cannot oversubscribe a busy machine. A
# pool's workers take the same default (worker_threads).
DEFAULT_THREADS = 1

# what --threads (or a pool, for its worker) chose for this process; None: not chosen here
_chosen: int | None = None
# how a chosen count reaches the processes this one starts (a validation's target, a pool's workers)
POLICY_VARIABLE = "PITCHECK_THREADS"


def check_threads(threads) -> int:
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise PitcheckError(f"--threads must be a positive integer, got {threads!r}")
    return threads


def policy_threads(threads: int | None = None) -> int:
    """The threads one process computes with: `threads` if given, else what apply_thread_policy chose for
    this process, else what its parent's policy chose ($PITCHECK_THREADS), else DEFAULT_THREADS."""
    if threads is not None:
        return check_threads(threads)
    if _chosen is not None:
        return _chosen
    inherited = os.environ.get(POLICY_VARIABLE, "")
    return int(inherited) if inherited.isdigit() and int(inherited) > 0 else DEFAULT_THREADS


def worker_threads(workers: int) -> int:
    """The threads each worker of a pool of `workers` processes computes with: the count chosen for this
    process (--threads) if one was, else the default, capped by the worker's share of the cores (at
    least one) so that the pool never oversubscribes them. With the default of one, every cell computes
    with one thread on any machine and executor, as a single `pitcheck run` of it does: bit-identical."""
    if _chosen is not None:
        return _chosen
    return max(1, min(DEFAULT_THREADS, available_cores() // workers))


def apply_thread_policy(threads: int | None = None, torch: bool = True) -> list[str]:
    """The policy for this whole process, for good (the CLI calls it once for every verb): pin torch and
    every BLAS/OpenMP to policy_threads(threads), and remember an explicit count, so that pools started
    later give each worker that count and the verbs' own thread_policy() blocks keep it. torch=False (a
    verb that never computes with torch): numpy's BLAS and the environment only, torch is not loaded.
    Returns what was pinned."""
    global _chosen
    if threads is not None:
        _chosen = check_threads(threads)
        os.environ[POLICY_VARIABLE] = str(_chosen)
    count = policy_threads()
    if torch:
        return pin_threads(count)
    os.environ.update(thread_env(count))
    import numpy  # noqa: F401
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=count)
    return _loaded_pools()


def thread_policy(threads: int | None = None):
    """The policy for one block of a Python API call (run, stress, validate, ...): torch and every loaded
    BLAS use policy_threads(threads) inside it; the caller's counts come back after it."""
    count = policy_threads(threads)
    import numpy  # noqa: F401  (loaded before the block, so that threadpoolctl limits their BLAS too)
    import scipy.linalg  # noqa: F401

    return limited_threads(count)


def set_torch_threads(threads: int) -> None:
    """torch's intra-op pool only, for good (a process whose numpy work is not in question)."""
    import torch

    torch.set_num_threads(threads)


@contextlib.contextmanager
def limited_threads(threads: int = 1, blas: bool = True):
    """Within the block, torch (and, with blas, every loaded BLAS/OpenMP) uses at most `threads` threads;
    the previous counts are put back after it."""
    import torch
    from threadpoolctl import threadpool_limits

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with threadpool_limits(limits=threads) if blas else contextlib.nullcontext():
            yield
    finally:
        torch.set_num_threads(previous)
