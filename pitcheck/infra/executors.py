"""Where tasks run: `map_tasks(fn, tasks, on_result)` calls a picklable top-level function on every task (a
plain dict) in a local process pool (the default) or on a Ray cluster, and hands each result to
`on_result` as it arrives. It knows nothing of what the tasks are (the sweep passes its `run_cell`).

Both executors pin the BLAS and torch thread pools of every worker (threads.worker_threads: one thread
unless --threads chose more), so that workers sharing a machine do not fight over its cores, and so that
every task computes with the same thread count whichever executor ran it: that, and each task's own
seeded inputs, is what makes the results bit-identical.

Nothing heavy is imported at the top: a spawned worker pins its threads before numpy or torch load.
"""
from __future__ import annotations

import os
from typing import Any, Callable

from .errors import PitcheckError
from .threads import (POLICY_VARIABLE, THREAD_VARIABLES, apply_thread_policy, available_cores, policy_threads,
                      thread_env, worker_threads)

EXECUTORS = ("local", "ray")


# the process that started this pool worker (None outside a local pool)
_POOL_PARENT: int | None = None


def _die_with_parent(parent: int) -> None:
    """Linux: SIGTERM this worker when its parent dies (killed, even by SIGKILL), so that no orphan keeps
    computing a task (a sweep's cell, holding its lock) after its parent is gone; a run takes SIGTERM by
    committing its step and stopping, so the next sweep resumes it. The signal is sent once: `_run_pinned`
    makes a worker whose run took it exit instead of waiting forever for work from a dead parent."""
    import signal

    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        return
    if os.getppid() != parent:  # the parent died before the line above
        os._exit(1)


def _init_local_worker(threads: int, parent: int | None = None) -> None:
    """A pool worker: pinned threads, and Ctrl-C left to the parent (which stops the pool) and to a run
    in progress (whose own handler commits its step and stops it), so an idle worker exits quietly."""
    import signal

    global _POOL_PARENT
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if parent is not None:
        _POOL_PARENT = parent
        _die_with_parent(parent)
    # the worker's own policy: a run inside it (whose verb applies thread_policy()) keeps this count
    apply_thread_policy(threads)


def _exit_if_orphaned() -> None:
    if _POOL_PARENT is not None and os.getppid() != _POOL_PARENT:
        os._exit(1)


def _run_pinned(fn: Callable[[dict], Any], task: dict, threads: int) -> Any:
    apply_thread_policy(threads)
    try:
        return fn(task)
    finally:
        # the parent's death signal was spent on the run (which committed and stopped): leave now
        _exit_if_orphaned()


def check_workers(workers: int | None) -> int:
    if workers is None:
        return available_cores()
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise PitcheckError(f"--workers must be a positive integer, got {workers!r}")
    return workers


def run_local(fn: Callable[[dict], Any], tasks: list[dict], on_result: Callable[[Any], None],
              workers: int | None = None) -> None:
    """Call fn on every task in a pool of worker processes (spawned: nothing of the parent's state is shared).

    Workers default to the cores this process may use; each computes with threads.worker_threads(workers)
    BLAS/torch threads (one, or the count --threads chose). Even one worker is a separate process, pinned the same way, so that `--workers 1`
    computes what a larger pool computes.
    """
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    workers = min(check_workers(workers), max(1, len(tasks)))
    if not tasks:
        return
    threads = worker_threads(workers)
    saved = {k: os.environ.get(k) for k in (*THREAD_VARIABLES, POLICY_VARIABLE)}
    # spawned children inherit the environment at start: their BLAS loads with the pinned count
    os.environ.update({**thread_env(threads), POLICY_VARIABLE: str(threads)})
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_init_local_worker, initargs=(threads, os.getpid()))
    pending: set = set()
    try:
        pending = {pool.submit(_run_pinned, fn, task, threads) for task in tasks}
        for k, v in saved.items():  # the workers have started: the parent's own settings come back
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                on_result(future.result())
    except BaseException:
        for future in pending:
            future.cancel()
        # a worker interrupted by the same Ctrl-C stops as its task lets it (a run commits its step)
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    pool.shutdown(wait=True)


LOCAL_OBJECT_STORE_BYTES = 100 * 2**20
# seconds to wait for a TCP connection to a Ray address: ray.init itself retries an address where nothing
# listens for minutes, silently
CONNECT_TIMEOUT = 5.0


def check_ray_address(address: str, timeout: float = CONNECT_TIMEOUT) -> None:
    """Refuse, in one line and within `timeout` seconds, a Ray address (HOST:PORT or ray://HOST:PORT) where
    nothing accepts a connection. 'auto' and 'local' name the local cluster's file and are left to Ray."""
    import socket

    if address in ("auto", "local"):
        return
    hostport = address.split("://", 1)[1] if "://" in address else address
    host, sep, port = hostport.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isascii() or not port.isdigit() or not 0 < int(port) < 65536:
        raise PitcheckError(f"--address {address!r} is not HOST:PORT (or ray://HOST:PORT)")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            pass
    except OSError as exc:
        why = "timed out" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc) or type(exc).__name__)
        raise PitcheckError(f"cannot reach Ray at {address}: {why} (is a Ray cluster running there?)") from None


def _import_ray():
    try:
        import ray
    except ImportError:
        raise PitcheckError("--executor ray needs Ray: pip install 'pitcheck[ray]' (or pip install ray)") from None
    return ray


def run_ray(fn: Callable[[dict], Any], tasks: list[dict], on_result: Callable[[Any], None],
            address: str | None = None, workers: int | None = None,
            needs_gpu: Callable[[dict, bool], bool] | None = None) -> None:
    """One Ray task per task, on the cluster at `address` or, without one, on a local runtime started here
    (with `workers` CPUs, default every core). A runtime already initialised by the caller is used as it is.
    A task for which needs_gpu(task, cluster_has_gpus) is true requests one GPU; every task runs with the
    thread policy's BLAS/torch threads (one unless --threads chose more) and asks Ray for as many CPUs.
    """
    ray = _import_ray()
    started = False
    if not ray.is_initialized():
        kwargs = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}
        if address:
            check_ray_address(address)
            kwargs["address"] = address
        else:
            # results are small dicts: a small object store (Ray's default takes 30% of the memory)
            kwargs.update(num_cpus=check_workers(workers), object_store_memory=LOCAL_OBJECT_STORE_BYTES)
        try:
            ray.init(**kwargs)
        except Exception as exc:  # ConnectionError, RuntimeError, ValueError from a bad address
            raise PitcheckError(f"cannot start or reach Ray{f' at {address}' if address else ''}: "
                                f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
        started = True
    pending: list = []
    try:
        remote = ray.remote(_run_pinned)
        threads = policy_threads()
        env = {"env_vars": {**thread_env(threads), POLICY_VARIABLE: str(threads)}}
        cluster_gpus = ray.cluster_resources().get("GPU", 0) > 0
        refs = [remote.options(num_cpus=threads, num_gpus=1 if needs_gpu and needs_gpu(task, cluster_gpus) else 0,
                               runtime_env=env, max_retries=0).remote(fn, task, threads) for task in tasks]
        pending = refs
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                on_result(ray.get(ref))
    except BaseException:
        for ref in pending:
            try:
                ray.cancel(ref)
            except Exception:  # pragma: no cover - best effort
                pass
        raise
    finally:
        if started:
            ray.shutdown()


def map_tasks(fn: Callable[[dict], Any], tasks: list[dict], on_result: Callable[[Any], None],
              executor: str = "local", workers: int | None = None, address: str | None = None,
              needs_gpu: Callable[[dict, bool], bool] | None = None) -> None:
    """Call fn (a top-level function, so that workers can import it) on every task on `executor`, passing
    each result to on_result in the order they finish. `needs_gpu(task, cluster_has_gpus)` says which
    tasks ask Ray for a GPU (none without it); the local pool leaves devices to the tasks."""
    if executor == "local":
        if address:
            raise PitcheckError("--address names a Ray cluster: use it with --executor ray")
        run_local(fn, tasks, on_result, workers)
    elif executor == "ray":
        run_ray(fn, tasks, on_result, address, workers, needs_gpu)
    else:
        raise PitcheckError(f"unknown executor {executor!r}; choose from {', '.join(EXECUTORS)}")
