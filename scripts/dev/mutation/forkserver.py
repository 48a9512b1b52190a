"""A fork server for mutation runs: imports the heavy libraries once, then forks one child per mutant.

cosmic-ray runs its test command once per mutant; a fresh `python -m pytest` spends about a second
importing numpy, scipy, torch and pytest before any test runs. This server imports them once (never
pitcheck itself), and for each request from client.py forks a child that chdirs into the copy, puts it
first on sys.path and runs pytest.main on the request's arguments. The mutated module is read from disk
by the child, after cosmic-ray has written it; bytecode is never written, so a mutant that keeps a
file's size and modification second cannot be served from a stale .pyc.

Usage: python forkserver.py ROOT SOCKET [--timeout SECONDS]
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time


def _die_with_parent() -> None:
    """Linux: end with the mutation driver, even when it is killed, instead of serving nobody forever."""
    parent = os.getppid()
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        return
    if os.getppid() != parent:
        sys.exit(0)


def serve(root: str, path: str, timeout: float) -> None:
    _die_with_parent()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")
    sys.dont_write_bytecode = True
    # warm imports: everything the tests need except pitcheck (which must come from the mutated copy)
    import numpy  # noqa: F401
    import scipy.linalg  # noqa: F401
    import mpmath  # noqa: F401
    import pytest  # noqa: F401
    try:
        import hypothesis  # noqa: F401
        import torch  # noqa: F401
    except ImportError:
        pass
    assert "pitcheck" not in sys.modules, "the fork server must not import pitcheck"
    if os.path.exists(path):
        os.unlink(path)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(4)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    log = os.path.join(root, ".mutation-last.log")
    while True:
        conn, _ = srv.accept()
        with conn:
            data = b""
            while not data.endswith(b"\n"):
                chunk = conn.recv(65536)
                if not chunk:
                    break
                data += chunk
            args = json.loads(data.decode() or "[]")
            pid = os.fork()
            if pid == 0:  # child
                srv.close()
                conn.close()
                code = 3
                try:
                    os.chdir(root)
                    sys.path.insert(0, root)
                    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                    os.dup2(fd, 1)
                    os.dup2(fd, 2)
                    import pytest

                    code = int(pytest.main(args))
                    import pitcheck

                    if not os.path.realpath(pitcheck.__file__).startswith(os.path.realpath(root)):
                        print(f"pitcheck imported from {pitcheck.__file__}, not from {root}")
                        code = 4
                finally:
                    sys.stdout.flush()
                    sys.stderr.flush()
                    os._exit(code)
            deadline = time.monotonic() + timeout
            status = None
            while time.monotonic() < deadline:
                done, st = os.waitpid(pid, os.WNOHANG)
                if done:
                    status = st
                    break
                time.sleep(0.005)
            if status is None:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                rc = 124
            else:
                rc = os.waitstatus_to_exitcode(status)
                rc = rc if rc >= 0 else 128 - rc
            conn.sendall(f"{rc}\n".encode())


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("socket")
    ap.add_argument("--timeout", type=float, default=30.0)
    a = ap.parse_args()
    serve(os.path.abspath(a.root), a.socket, a.timeout)
