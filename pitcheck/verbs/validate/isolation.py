"""Running the target in a child process with a time limit.

A hang, os.abort(), a segfault, an exception at import or an early exit with status 0 (a worker that ends
without its "finished" phase) becomes a one-line reason naming the phase it happened in (a timeout also
the phases that took longest); the validator itself never hangs or crashes with the target. A worker
whose device context was lost (a CUDA error is sticky: device.py) is followed by a fresh one for what has
no result yet, within the same time limit. lifeline.py keeps the target's processes from outliving
the validation, and the worker's sys.path from starting with the working directory.
"""
from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from .device import LOST_STATUS
from .lifeline import BOOTSTRAP, TAG_VAR, cleanup, worker_command
from .probes import load_probe
from .worker import read_phases


@dataclass
class TargetRun:
    probes: dict = field(default_factory=dict)  # check name -> Probe, for the checks that finished
    fatal: str = ""  # why the target could not be imported, built or run to the end ('' if it could)
    failed_during: str = ""  # the check in progress when the target died, if it died in one
    seconds: float = 0.0
    skipped: dict = field(default_factory=dict)  # check name -> why it was not run (the target still ran)
    restarts: list = field(default_factory=list)  # why each fresh worker was started (a lost device context)


# callbacks told of the worker's phases as they happen (watch()); the library itself prints nothing
_WATCHERS: list = []
POLL_SECONDS = 0.2


@contextmanager
def watch(callback):
    """While inside, `callback(phase, seconds)` is called for each phase a worker enters ('build', 'check
    penrose', 'done penrose', 'finished'; `seconds` since the worker's previous phase), read off its
    phases.log as the worker writes it: how a CLI shows progress without the library printing."""
    _WATCHERS.append(callback)
    try:
        yield
    finally:
        _WATCHERS.remove(callback)


class _PhaseFollower:
    """Reads OUT/phases.log's new lines and tells the watchers of each."""

    def __init__(self, out: Path):
        self.path, self.last = out / "phases.log", None
        self.seen = len(read_phases(self.path))  # an earlier worker's phases on this OUT were told already

    def poll(self) -> None:
        phases = read_phases(self.path)
        for stamp, phase in phases[self.seen:]:
            took = stamp - self.last if self.last is not None else 0.0
            self.last = stamp
            for callback in list(_WATCHERS):
                callback(phase, took)
        self.seen = len(phases)


def _wait(proc, out: Path, timeout: float) -> int:
    """proc.wait(timeout), telling the watchers of each phase as it is logged."""
    if not _WATCHERS:
        return proc.wait(timeout=timeout)
    follower, deadline = _PhaseFollower(out), time.monotonic() + timeout
    while True:
        try:
            code = proc.wait(timeout=max(0.0, min(POLL_SECONDS, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            follower.poll()
            if time.monotonic() >= deadline:
                raise
            continue
        follower.poll()
        return code


def _death(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


def _stderr_tail(path: Path) -> str:
    lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()] if path.exists() else []
    return lines[-1].strip()[:200] if lines else ""


def _terminated(signum, frame):
    raise SystemExit(128 + signum)


def run_isolated(request: dict, timeout: float) -> TargetRun:
    """Run the worker on `request` (see worker.py) and gather what it produced within `timeout` s.
    SIGTERM (a cancelled CI job) unwinds like Ctrl-C, so the target's process group is killed."""
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminated) if in_main else None
    try:
        return _run_isolated(request, timeout)
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous)


def _run_isolated(request: dict, timeout: float) -> TargetRun:
    """One worker, and a fresh one on the same OUT each time a worker's device context was lost (it saved
    what it had: a result or a case at least each time); every worker counts against the one `timeout`."""
    start = time.monotonic()
    deadline = start + timeout
    with tempfile.TemporaryDirectory(prefix="pitcheck-validate-") as tmp:
        out = Path(tmp)
        (out / "request.json").write_text(json.dumps(request))
        # every process the target starts inherits this tag, so the cleanup finds it even after a setsid()
        tag = secrets.token_hex(8)
        run = TargetRun()
        lost_after_last = False
        spawned = []  # when each worker started: its start-up runs until its first phase
        while True:
            progress = _saved(out)
            spawned.append(time.monotonic())
            code, timed_out = _run_worker(out, tag, deadline - time.monotonic())
            if timed_out or code != LOST_STATUS or not (out / "lost.txt").exists():
                break  # a target's own exit with that status is an exit like any other
            lost = (out / "lost.txt").read_text().strip()
            (out / "lost.txt").unlink()
            run.restarts.append(lost)
            if not _remaining(out, request):
                lost_after_last = True  # lost after the last result: nothing is left to run
                break
            if _saved(out) == progress:  # a worker that saves nothing would be restarted for ever
                run.fatal = f"the target's worker lost its device context without a result ({lost})"
                break
        run.seconds = time.monotonic() - start
        for name in request["checks"]:
            path = out / f"{name}.npz"
            if path.exists():
                run.probes[name] = load_probe(path)
        phases = read_phases(out / "phases.log")
        phase = phases[-1][1] if phases else "start-up"
        if phase.startswith("check "):
            run.failed_during = phase[len("check "):]
        if run.fatal:
            pass
        elif timed_out:
            timeline = sorted(phases + [(t, "start-up") for t in spawned])
            run.fatal = f"target timed out after {timeout:g} s during {phase}{_slowest(timeline)}"
        elif (out / "fatal.txt").exists():
            run.fatal = (out / "fatal.txt").read_text().strip()
        elif not lost_after_last and (code != 0 or phase != "finished"):
            # status 0 without the worker's "finished": the target ended the process itself (os._exit(0))
            tail = _stderr_tail(out / "stderr.txt")
            run.fatal = f"target {_death(code)} during {phase}" + (f" ({tail})" if tail else "")
        else:
            missing = _remaining(out, request)
            if missing:
                run.fatal = f"the worker finished without a result for {', '.join(missing)}"
        return run


# the line of lifeline.BOOTSTRAP that names validate's worker; run_entry names another module there
_WORKER_IMPORT = "from pitcheck.verbs.validate import lifeline, worker\n"


def entry_command(entry: str, request_path: str, read_fd: int) -> list[str]:
    """lifeline's worker command with the module `entry` (its run_and_exit(REQUEST.json)) in place of
    validate's worker: the same sys.path, parent-death signal and guardian."""
    if entry == "pitcheck.verbs.validate.worker":
        return worker_command(request_path, read_fd)
    assert _WORKER_IMPORT in BOOTSTRAP, "lifeline.BOOTSTRAP no longer imports the worker by this line"
    bootstrap = BOOTSTRAP.replace(_WORKER_IMPORT, "from pitcheck.verbs.validate import lifeline\n"
                                  f"import importlib\nworker = importlib.import_module({entry!r})\n")
    command = worker_command(request_path, read_fd)
    return [command[0], "-c", bootstrap, *command[3:]]


def run_entry(entry: str, request: dict, timeout: float, gather):
    """Run `entry`.run_and_exit(OUT/request.json) in a child process as validate runs its worker (its own
    process group, tagged, killed with everything it started when it ends, times out or this process does)
    and return gather(OUT, exit status, timed out) while OUT still exists. SIGTERM unwinds like Ctrl-C."""
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminated) if in_main else None
    try:
        with tempfile.TemporaryDirectory(prefix="pitcheck-target-") as tmp:
            out = Path(tmp)
            (out / "request.json").write_text(json.dumps(request))
            code, timed_out = _run_worker(out, secrets.token_hex(8), timeout, entry)
            return gather(out, code, timed_out)
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous)


def child_death(code: int | None) -> str:
    """'killed by SIGSEGV', 'exited with status 3': how a child process ended."""
    return "timed out" if code is None else _death(code)


def stderr_tail(out: Path) -> str:
    """The last non-blank line the child wrote to its stderr (up to 200 characters), '' if none."""
    return _stderr_tail(out / "stderr.txt")


def _remaining(out: Path, request: dict) -> list[str]:
    return [name for name in request["checks"] if not (out / f"{name}.npz").exists()]


def _saved(out: Path) -> tuple:
    """What the workers have saved so far: the results, and the cases of each partial result."""
    return tuple(sorted((p.name, len(load_probe(p).facts.get("cases", {})) if p.name.endswith(".partial.npz") else 0)
                        for p in out.glob("*.npz")))


def _slowest(phases: list[tuple[float, str]], count: int = 3) -> str:
    """' (slowest phases: build 41.2 s, import 3.0 s)': the phases that took the longest, by name over
    every worker, the last one up to now."""
    if not phases:
        return ""
    took: dict[str, float] = {}
    ends = [t for t, _ in phases[1:]] + [time.monotonic()]
    for (begin, name), end in zip(phases, ends):
        took[name] = took.get(name, 0.0) + max(0.0, end - begin)
    top = sorted(took.items(), key=lambda item: -item[1])[:count]
    return " (slowest phases: " + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in top) + ")"


def _run_worker(out: Path, tag: str, timeout: float,
                entry: str = "pitcheck.verbs.validate.worker") -> tuple[int | None, bool]:
    """Start a worker (the module `entry`) on OUT/request.json and wait up to `timeout` s: (its exit status,
    whether it timed out)."""
    if timeout <= 0:
        return None, True
    env = dict(os.environ)
    env[TAG_VAR] = tag
    # the guardian's pipe: its write end lives only here, so it reads end-of-file when this process ends
    read_fd, write_fd = os.pipe()
    try:
        with open(out / "stderr.txt", "ab") as err:
            # not PYTHONPATH or `-m` with the working directory first: a random.py there would shadow the
            # standard library; target.load_factory finds the target from the working directory
            proc = subprocess.Popen(entry_command(entry, str(out / "request.json"), read_fd),
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, env=env,
                                    start_new_session=True, pass_fds=(read_fd,))
            os.close(read_fd)
            read_fd = -1
            try:
                return _wait(proc, out, timeout), False
            except subprocess.TimeoutExpired:
                return None, True
            finally:
                # always, the target's processes go: on a timeout, on Ctrl-C or SIGTERM, and after a clean
                # exit too (children it forked, setsid() or not, must not outlive the validation)
                cleanup(proc.pid, tag)
                proc.wait()
    finally:
        for fd in (read_fd, write_fd):
            if fd >= 0:
                os.close(fd)
