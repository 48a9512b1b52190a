"""Starting a torch.distributed process group for sharded runs and tests, with a time limit on everything.

`ShardedPool(n)` spawns n ranks once (torch.multiprocessing, start method spawn), each of which joins a
process group (gloo for CPU tensors, NCCL for CUDA) through a file rendezvous, with a time limit on every
collective (half the task's `timeout` unless set); `pool.run(fn, *args)` then calls the module-level function fn on every rank and returns the
per-rank results. A rank that raises, dies or does not answer within the time limit ends the pool: every
rank is killed and `ShardedRunError` names the rank (one line). `launch(fn, n, ...)` is the one-shot form.

Under torchrun (or any caller that has already set up the default group) nothing is spawned:
`ensure_process_group()` joins or reuses the existing group, and the sharded functions take `group=`.
"""
from __future__ import annotations

import datetime
import os
import pickle
import re
import shutil
import sys
import tempfile
import time
import traceback
from multiprocessing.connection import wait as wait_for

from ...infra.errors import PitcheckError
from ...infra.threads import set_torch_threads

DEFAULT_TIMEOUT_S = 60.0

# Errors a healthy rank raises because a peer failed or stalled (the collective timed out, the peer's
# socket closed): the rank named in a verdict is the one whose failure was not of this kind.
_PEER_FAILURE = re.compile(r"timed out|timeout|connection closed|connection reset|broken pipe|peer|"
                           r"NCCL communicator was aborted", re.IGNORECASE)


_COLLECTIVE_ERRORS = ("RuntimeError", "DistError", "DistBackendError", "DistNetworkError", "DistStoreError")


class ShardedRunError(PitcheckError):
    """A rank raised, died or hung; `rank` is that rank (None when none could be singled out), `kind` one of
    'raised', 'died', 'hung'."""

    def __init__(self, message: str, rank: int | None, kind: str, details: str = ""):
        super().__init__(message)
        self.rank, self.kind, self.details = rank, kind, details


def default_backend(device) -> str:
    """NCCL for CUDA tensors, gloo otherwise."""
    return "nccl" if str(device).startswith("cuda") else "gloo"


def _check_one_gpu_per_rank(world_size: int) -> None:
    """NCCL refuses two ranks on one GPU ("Duplicate GPU detected", at the first collective, after every
    rank has started): say so before spawning anything."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if world_size > count:
        raise PitcheckError(f"NCCL needs one GPU per rank: {world_size} ranks asked for, torch sees {count} CUDA "
                            f"device(s); use at most {count} shards, or --device cpu (gloo)" if count else
                            f"NCCL needs one GPU per rank, and torch sees no CUDA device; use --device cpu (gloo)")


def _as_timedelta(timeout_s: float) -> datetime.timedelta:
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
        raise PitcheckError(f"timeout must be a positive number of seconds, got {timeout_s!r}")
    return datetime.timedelta(seconds=float(timeout_s))


def ensure_process_group(timeout_s: float = DEFAULT_TIMEOUT_S, backend: str | None = None, device="cpu"):
    """The default process group: the caller's if one exists, else one joined from torchrun's environment
    (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) with `timeout_s` on every collective."""
    import torch.distributed as dist

    if dist.is_initialized():
        return dist.group.WORLD
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise PitcheckError(f"no process group: start under torchrun or use pitcheck.model.sharded.launch "
                            f"(missing {', '.join(missing)})")
    dist.init_process_group(backend or default_backend(device), init_method="env://", timeout=_as_timedelta(timeout_s))
    return dist.group.WORLD


def _worker(rank: int, world_size: int, init_file: str, backend: str, timeout_s: float, conn, threads: int | None):
    """One rank: join the group, then run the tasks that arrive on conn until told to stop."""
    import torch
    import torch.distributed as dist

    if threads:
        set_torch_threads(threads)  # n ranks on a few cores: one thread each, no oversubscription
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        dist.init_process_group(backend, init_method="file://" + init_file, rank=rank, world_size=world_size,
                                timeout=_as_timedelta(timeout_s))
    except BaseException as exc:  # noqa: BLE001 (reported to the parent, which ends the pool)
        _send_quietly(conn, pickle.dumps(("error", _describe(exc))))
        return
    if not _send_quietly(conn, pickle.dumps(("ready", None))):
        os._exit(0)
    while True:
        try:
            message = conn.recv_bytes()
        except (EOFError, OSError):  # the parent is gone (a killed parent resets the pipe)
            break
        task = pickle.loads(message)
        if task is None:
            break
        fn, args, kwargs = task
        try:
            reply = ("ok", fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001
            reply = ("error", _describe(exc))
        try:
            payload = pickle.dumps(reply)
        except Exception as exc:  # noqa: BLE001 (an unpicklable result is the task's error)
            payload = pickle.dumps(("error", _describe(exc)))
        if not _send_quietly(conn, payload):  # the parent is gone
            break
    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        pass
    # the interpreter's own shutdown then takes seconds (torch's thread pools); nothing is left to run
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _send_quietly(conn, payload: bytes) -> bool:
    """Send to the parent; False when it is gone (killed: its end of the pipe is closed or reset)."""
    try:
        conn.send_bytes(payload)
        return True
    except OSError:
        return False


def _describe(exc: BaseException) -> dict:
    text = str(exc).strip().splitlines()
    return {"type": type(exc).__name__, "message": text[0][:300] if text else "",
            "peer": type(exc).__name__ in _COLLECTIVE_ERRORS and bool(_PEER_FAILURE.search(str(exc))),
            "traceback": traceback.format_exc()}


class ShardedPool:
    """n ranks spawned once, each in the process group; `run(fn, *args, **kwargs)` calls fn on every rank.

    fn must be importable by name (a module-level function); it finds its rank with
    torch.distributed.get_rank(). Results and arguments travel pickled, so keep them small. Use as a
    context manager (or call close()): every rank is stopped, and killed if it does not stop.
    """

    def __init__(self, world_size: int, *, timeout: float = DEFAULT_TIMEOUT_S, backend: str = "gloo",
                 threads: int | None = 1, start_timeout: float | None = None,
                 collective_timeout: float | None = None):
        import torch.multiprocessing as mp

        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise PitcheckError(f"world size must be a positive integer, got {world_size!r}")
        if backend not in ("gloo", "nccl"):
            raise PitcheckError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
        _as_timedelta(timeout)
        if backend == "nccl":
            _check_one_gpu_per_rank(world_size)
        # a collective times out well inside the task's limit, so that the ranks left waiting on a hung
        # peer report it before the launcher gives up, and the one that said nothing is named
        self.collective_timeout = float(collective_timeout) if collective_timeout is not None else timeout / 2
        _as_timedelta(self.collective_timeout)
        self.world_size, self.timeout, self.backend = world_size, float(timeout), backend
        self._dir = tempfile.mkdtemp(prefix="pitcheck-shards-")
        ctx = mp.get_context("spawn")
        self._conns, self._procs = [], []
        try:
            for rank in range(world_size):
                parent, child = ctx.Pipe()
                proc = ctx.Process(target=_worker, name=f"pitcheck-rank-{rank}", daemon=True,
                                   args=(rank, world_size, os.path.join(self._dir, "rendezvous"), backend,
                                         self.collective_timeout, child, threads))
                proc.start()
                child.close()
                self._conns.append(parent)
                self._procs.append(proc)
            # importing torch in every rank takes seconds on a busy machine: start-up has its own allowance
            self._gather("start-up", start_timeout if start_timeout is not None else max(self.timeout, 120.0))
        except BaseException:
            self.close()
            raise

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def alive(self) -> bool:
        return bool(self._procs)

    def run(self, fn, *args, timeout: float | None = None, label: str | None = None, **kwargs) -> list:
        """fn(*args, **kwargs) on every rank; the list of results by rank. Any failure ends the pool, whose
        one-line error says it happened during `label` (fn's name by default)."""
        if not self._procs:
            raise PitcheckError("the sharded pool is closed (a rank failed earlier, or close() was called)")
        payload = pickle.dumps((fn, args, kwargs))
        for conn in self._conns:
            conn.send_bytes(payload)
        return self._gather(label or getattr(fn, "__name__", "task"), timeout if timeout is not None else self.timeout)

    def _gather(self, what: str, timeout: float) -> list:
        deadline = time.monotonic() + timeout
        results: dict[int, object] = {}
        errors: dict[int, dict] = {}
        pending = set(range(self.world_size))
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            by_conn = {self._conns[r]: r for r in pending}
            by_sentinel = {self._procs[r].sentinel: r for r in pending}
            for ready in wait_for(list(by_conn) + list(by_sentinel), timeout=min(left, 1.0)):
                rank = by_conn.get(ready, by_sentinel.get(ready))
                if rank not in pending:
                    continue
                try:
                    status, value = pickle.loads(self._conns[rank].recv_bytes()) if ready in by_conn else (None, None)
                except (EOFError, OSError):
                    status, value = None, None
                if status is None:  # the process ended without a word
                    self._procs[rank].join(1.0)
                    code = self._procs[rank].exitcode
                    self._fail(f"rank {rank} died during {what} ({_death(code)})", rank, "died")
                pending.discard(rank)
                if status == "error":
                    errors[rank] = value
                    if not value["peer"]:  # this rank's own failure: the others are stuck in a collective
                        self._fail(f"rank {rank} raised {value['type']} during {what}: {value['message']}",
                                   rank, "raised", value["traceback"])
                else:
                    results[rank] = value
            if pending and errors and not results and len(errors) + len(pending) == self.world_size:
                # every rank that answered timed out waiting for the silent ones: those are stuck, no need to
                # wait out the task's limit
                hung = sorted(pending)
                self._fail(f"rank{'s' if len(hung) > 1 else ''} {', '.join(map(str, hung))} hung during {what}: "
                           f"the other ranks timed out after {self.collective_timeout:g} s waiting for "
                           f"{'them' if len(hung) > 1 else 'it'} in a collective (all {self.world_size} ranks "
                           "killed)", hung[0], "hung")
        if pending:
            hung = sorted(pending)
            self._fail(f"rank{'s' if len(hung) > 1 else ''} {', '.join(map(str, hung))} hung during {what}: "
                       f"no answer within {timeout:g} s (all {self.world_size} ranks killed)", hung[0], "hung")
        if errors:  # only peer failures (e.g. every rank timed out in one collective): name the first
            rank = min(errors)
            self._fail(f"rank {rank} raised {errors[rank]['type']} during {what}: {errors[rank]['message']}",
                       rank, "raised", errors[rank]["traceback"])
        return [results[r] for r in range(self.world_size)]

    def _fail(self, message: str, rank, kind: str, details: str = ""):
        self.close(graceful=False)
        raise ShardedRunError(message, rank, kind, details)

    def close(self, graceful: bool = True) -> None:
        """Stop every rank: ask politely when graceful, then terminate and kill what is left."""
        procs, conns = self._procs, self._conns
        self._procs, self._conns = [], []
        if graceful:
            for conn in conns:
                try:
                    conn.send_bytes(pickle.dumps(None))
                except (OSError, ValueError):
                    pass
            end = time.monotonic() + 5.0
            for proc in procs:
                proc.join(max(0.0, end - time.monotonic()))
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
        for proc in procs:
            proc.join(2.0)
            if proc.is_alive():
                proc.kill()
                proc.join(2.0)
        for conn in conns:
            conn.close()
        shutil.rmtree(self._dir, ignore_errors=True)


def _death(code) -> str:
    import signal

    if code is None:
        return "no exit status"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def launch(fn, world_size: int, *args, timeout: float = DEFAULT_TIMEOUT_S, backend: str = "gloo",
           threads: int | None = 1, **kwargs) -> list:
    """Spawn world_size ranks, run fn(*args, **kwargs) on each once, stop them; the results by rank."""
    with ShardedPool(world_size, timeout=timeout, backend=backend, threads=threads) as pool:
        return pool.run(fn, *args, **kwargs)
