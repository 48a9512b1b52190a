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
