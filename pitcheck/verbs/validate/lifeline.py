"""Keeping the target's processes from outliving the validation, even when the validator is SIGKILLed.

The worker starts through BOOTSTRAP (`python -c`), which
  - drops the '' that `-c` puts first on sys.path, so a random.py or json.py in the working directory
    cannot shadow the standard library or pitcheck (target.load_factory finds the target from there);
  - imports pitcheck from the directory the validator's own pitcheck came from;
  - asks Linux to SIGKILL the worker when the validator dies (PR_SET_PDEATHSIG), and checks the validator
    did not die before that took effect;
  - forks a guardian that blocks on a pipe whose only write end the validator holds. The pipe reads
    end-of-file when the validator ends, however it ends; the guardian then kills every process that
    carries this validation's tag in its environment (the target's children, grandchildren that called
    setsid(), daemons that double-forked) and finally the worker's process group, itself included.
The validator does the same kill when the worker ends (cleanup()). A process escapes only by replacing
its environment (exec with a fresh env) *and* leaving the worker's process group.
"""
from __future__ import annotations

import os
import signal
import sys

TAG_VAR = "PITCHECK_VALIDATION_TAG"
PR_SET_PDEATHSIG = 1

BOOTSTRAP = """\
import sys
if sys.path and sys.path[0] == "":
    del sys.path[0]
root, parent, fd, request = sys.argv[1:5]
import importlib.machinery, importlib.util
spec = importlib.machinery.PathFinder.find_spec("pitcheck", [root])
if spec is not None:
    module = importlib.util.module_from_spec(spec)
    sys.modules["pitcheck"] = module
    spec.loader.exec_module(module)
from pitcheck.verbs.validate import lifeline, worker
lifeline.guard(int(parent), int(fd))
sys.argv[:] = [worker.__file__, request]
worker.run_and_exit(request)
"""


def worker_command(request_path: str, read_fd: int) -> list[str]:
    """The worker's command line: BOOTSTRAP with pitcheck's root, this process's pid and the pipe's fd."""
    # the directory holding pitcheck/ (this file is pitcheck/verbs/validate/lifeline.py: four levels up)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    return [sys.executable, "-c", BOOTSTRAP, root, str(os.getpid()), str(read_fd), request_path]


def die_with_parent() -> None:
    """SIGKILL this process when the thread that started it ends (Linux; elsewhere the guardian does it)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def guard(parent_pid: int, read_fd: int) -> None:
    """In the worker, before the target's code: tie the worker to the validator and fork the guardian."""
    die_with_parent()
    if os.getppid() != parent_pid:  # the validator died before the line above took effect
        os._exit(1)
    try:
        guardian = os.fork()
    except OSError:  # no process to spare: the validator's own cleanup and the parent-death signal remain
        guardian = -1
    if guardian == 0:
        try:
            while os.read(read_fd, 4096):  # the validator never writes: this returns b'' when it ends
                pass
        except OSError:
            pass
        kill_tagged(os.environ.get(TAG_VAR, ""), spare={os.getpid()})
        try:
            os.killpg(os.getpgrp(), signal.SIGKILL)  # the worker's group, this guardian in it
        finally:
            os._exit(0)
    os.close(read_fd)


def kill_tagged(tag: str, spare=frozenset(), passes: int = 20) -> int:
    """SIGKILL every process whose initial environment holds TAG_VAR=tag (Linux /proc; elsewhere none).
    Repeats until a pass finds none, so a child forked during the killing goes too. Returns how many."""
    if not tag or not os.path.isdir("/proc"):
        return 0
    needle = f"{TAG_VAR}={tag}".encode()
    killed = 0
    for _ in range(passes):
        found = 0
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) in spare:
                continue
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    tagged = needle in f.read().split(b"\0")
                if tagged:
                    os.kill(int(entry), signal.SIGKILL)
                    found += 1
            except OSError:  # gone, a zombie, or another user's
                continue
        killed += found
        if not found:
            break
    return killed


def cleanup(pgid: int, tag: str) -> None:
    """From the validator: kill the worker's process group and every process carrying the tag."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    kill_tagged(tag, spare={os.getpid()})
