"""Running the target in a child process with a time limit.

A hang, os.abort(), a segfault, an exception at import or an early exit with status 0 (a worker that ends
without its "finished" phase) becomes a one-line reason naming the phase it happened in; the validator
itself never hangs or crashes with the target. lifeline.py keeps the target's processes from outliving
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
from dataclasses import dataclass, field
from pathlib import Path

from .lifeline import TAG_VAR, cleanup, worker_command
from .probes import load_probe


@dataclass
class TargetRun:
    probes: dict = field(default_factory=dict)  # check name -> Probe, for the checks that finished
    fatal: str = ""  # why the target could not be imported, built or run to the end ('' if it could)
    failed_during: str = ""  # the check in progress when the target died, if it died in one
    seconds: float = 0.0
    skipped: dict = field(default_factory=dict)  # check name -> why it was not run (the target still ran)


def _phases(out: Path) -> list[str]:
    path = out / "phases.log"
    return path.read_text().split("\n")[:-1] if path.exists() else []


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
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="pitcheck-validate-") as tmp:
        out = Path(tmp)
        (out / "request.json").write_text(json.dumps(request))
        stderr_path = out / "stderr.txt"
        env = dict(os.environ)
        # every process the target starts inherits this tag, so the cleanup finds it even after a setsid()
        tag = secrets.token_hex(8)
        env[TAG_VAR] = tag
        # the guardian's pipe: its write end lives only here, so it reads end-of-file when this process ends
        read_fd, write_fd = os.pipe()
        try:
            with open(stderr_path, "wb") as err:
                # not PYTHONPATH or `-m` with the working directory first: a random.py there would shadow the
                # standard library; target.load_factory finds the target from the working directory
                proc = subprocess.Popen(worker_command(str(out / "request.json"), read_fd),
                                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, env=env,
                                        start_new_session=True, pass_fds=(read_fd,))
                os.close(read_fd)
                read_fd = -1
                code, timed_out = None, True
                try:
                    code = proc.wait(timeout=timeout)
                    timed_out = False
                except subprocess.TimeoutExpired:
                    pass
                finally:
                    # always, the target's processes go: on a timeout, on Ctrl-C or SIGTERM, and after a clean
                    # exit too (children it forked, setsid() or not, must not outlive the validation)
                    cleanup(proc.pid, tag)
                    proc.wait()
        finally:
            for fd in (read_fd, write_fd):
                if fd >= 0:
                    os.close(fd)
        run = TargetRun(seconds=time.monotonic() - start)
        for name in request["checks"]:
            path = out / f"{name}.npz"
            if path.exists():
                run.probes[name] = load_probe(path)
        phases = _phases(out)
        phase = phases[-1] if phases else "start-up"
        if phase.startswith("check "):
            run.failed_during = phase[len("check "):]
        if timed_out:
            run.fatal = f"target timed out after {timeout:g} s during {phase}"
        elif (out / "fatal.txt").exists():
            run.fatal = (out / "fatal.txt").read_text().strip()
        elif code != 0 or phase != "finished":
            # status 0 without the worker's "finished": the target ended the process itself (os._exit(0))
            tail = _stderr_tail(stderr_path)
            run.fatal = f"target {_death(code)} during {phase}" + (f" ({tail})" if tail else "")
        else:
            missing = [name for name in request["checks"] if name not in run.probes]
            if missing:
                run.fatal = f"the worker finished without a result for {', '.join(missing)}"
        return run
