"""Fault injection: `pitcheck run` and `compare` killed at random instants, then resumed.

Every kill, wherever it lands (start-up, a step, the middle of a commit), must leave a directory that
resumes to files byte-identical to an uninterrupted run's. The manifest differs only in resumed_from.
A handful of kills run by default; the 200-kill versions are marked slow (pytest --runslow).
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

CLI = "import sys; from pitcheck.cli import main; sys.exit(main(sys.argv[1:]))"
RUN_FILES = ("metrics.csv", "events.jsonl", "checkpoint.npz")
# a store's directory after a finished run: the run files, the commit record and the lock, nothing stray
CLEAN = {"manifest.json", "metrics.csv", "events.jsonl", "checkpoint.npz", "commit.json", ".lock"}

NUMPY_RUN = ["run", "--vocab", "256", "--dim", "8", "--steps", "400", "--optimizer", "momentum",
             "--retraction", "cayley", "--adversary", "gaussian,spike", "--no-progress"]
TORCH_RUN = ["run", "--backend", "torch", "--precision", "fp16", "--device", "cpu", "--vocab", "256", "--dim", "8",
             "--steps", "300", "--optimizer", "adam", "--retraction", "qr", "--adversary", "gaussian,spike",
             "--no-progress"]
# two gloo ranks hold Z's rows; the parent holds the single-process reference and the shadow
SHARDED_RUN = ["run", "--precision", "fp32", "--device", "cpu", "--shards", "2", "--pad-multiple", "4", "--vocab", "61",
               "--dim", "4", "--steps", "120", "--optimizer", "adam", "--retraction", "cholqr2", "--adversary",
               "gaussian,spike", "--no-progress"]
COMPARE = ["compare", "--precisions", "fp64,fp16", "--retractions", "qr,cayley", "--vocab", "128", "--dim", "8",
           "--adversary", "gaussian", "--seed", "0", "--steps", "150", "--no-progress"]


def _start(argv, out):
    """Launch in a session of its own, so that every process it starts can be found after a kill; stderr
    goes to a file (a pipe would be held open by any orphan, and reading it would never end)."""
    err = open(out.with_name(f"{out.name}.stderr"), "w+")
    proc = subprocess.Popen([sys.executable, "-c", CLI, *argv, "--out", str(out)], stdout=subprocess.DEVNULL,
                            stderr=err, text=True, cwd=Path(__file__).resolve().parents[2], start_new_session=True)
    proc.err_file = err
    return proc


def _stderr(proc) -> str:
    proc.err_file.seek(0)
    text = proc.err_file.read()
    proc.err_file.close()
    return text


def _session_members(session: int) -> list[int]:
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[3]) == session and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members


def _assert_no_orphans(proc, limit: float = 30.0) -> None:
    """Every process the killed one started (a sweep's pool workers) must leave with it, not wait forever
    for work from a dead parent while holding its cell's lock."""
    deadline = time.monotonic() + limit
    while (left := _session_members(proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    if left:
        os.killpg(proc.pid, signal.SIGKILL)
    assert not left, f"processes outlived their killed parent: {left}"


def _reference(argv, out, first_file):
    """An uninterrupted run, and when (seconds after launch) its first commit appeared and it ended."""
    t0 = time.monotonic()
    proc = _start(argv, out)
    first = None
    while proc.poll() is None:
        if first is None and any(out.glob(first_file)):
            first = time.monotonic() - t0
        time.sleep(0.005)
    err = _stderr(proc)
    assert proc.returncode == 0, err
    end = time.monotonic() - t0
    return (first or end), end


def _mid_commit(out: Path) -> bool:
    """A kill that left a commit half done: staged files, or a commit record not yet renamed."""
    return any(p.name.endswith((".staged", ".tmp")) for p in out.rglob("*"))


def _wait_for_commit(proc, out: Path, limit: float) -> None:
    """Return as soon as a commit is under way in out (a staged file exists), or the process ends."""
    deadline = time.monotonic() + limit
    while proc.poll() is None and time.monotonic() < deadline:
        if _mid_commit(out):
            return
        time.sleep(0.0005)


def kill_and_resume(argv, out, kills, sig, seed, resume_flag, check, first_file="commit.json"):
    """Kill argv `kills` times at random instants; after each kill relaunch it (with resume_flag).

    A chain of launches ends when one runs to completion; its files are then checked against an
    uninterrupted run's with check(reference, out), and the next chain starts afresh. Kill instants are
    uniform over [0.8 t_first, t_end] of the uninterrupted run (t_first: its first commit), so that most
    land in the steps rather than in the imports; every other kill then waits for the next commit to
    start, so that it lands inside one. Returns the counts.
    """
    ref = out.with_name(out.name + "-reference")
    t_first, t_end = _reference(argv, ref, first_file)
    rng = np.random.default_rng(seed)
    counts = {"kills": 0, "mid_commit": 0, "graceful": 0, "chains_checked": 0}
    launches = 0
    while True:
        # a kill before the run made its directory leaves nothing to resume: start it afresh
        proc = _start(argv + (resume_flag if launches and (out.exists() or not resume_flag) else []), out)
        launches += 1
        if counts["kills"] < kills:
            try:
                proc.wait(timeout=rng.uniform(0.8 * t_first, t_end))
            except subprocess.TimeoutExpired:
                if counts["kills"] % 2:
                    _wait_for_commit(proc, out, t_end)
                proc.send_signal(sig)
                proc.wait(timeout=120)
                _assert_no_orphans(proc)
                counts["kills"] += 1
                counts["mid_commit"] += _mid_commit(out)
                err = _stderr(proc)
                assert "Traceback" not in err, err
                if proc.returncode == 2:  # SIGTERM inside the loop: the step finished and was committed
                    assert "checkpoint saved" in err, err
                    counts["graceful"] += 1
                else:
                    assert proc.returncode in (-sig, 0), (proc.returncode, err)
                continue
        else:
            proc.wait(timeout=600)
        err = _stderr(proc)
        assert proc.returncode == 0, err
        check(ref, out)
        counts["chains_checked"] += 1
        if counts["kills"] >= kills:
            return counts
        _remove(out)
        launches = 0


def _remove(path: Path) -> None:
    import shutil

    shutil.rmtree(path)


def assert_same_run(a: Path, b: Path) -> None:
    for name in RUN_FILES:
        assert (a / name).read_bytes() == (b / name).read_bytes(), f"{b / name} differs"
    ma, mb = (json.loads((d / "manifest.json").read_text()) for d in (a, b))
    ma.pop("resumed_from"), mb.pop("resumed_from")
    assert ma == mb
    assert {p.name for p in b.iterdir()} == CLEAN, sorted(p.name for p in b.iterdir())


def _kill_run(tmp_path, argv, kills, sig, seed):
    counts = kill_and_resume(argv, tmp_path / "cut", kills, sig, seed, ["--resume"], assert_same_run)
    print(f"\n{argv[0]} {'torch' if 'torch' in argv else 'numpy'} {signal.Signals(sig).name}: {counts}")
    return counts




def assert_same_compare(ref: Path, out: Path) -> None:
    cells = sorted((ref / "cells").iterdir())
    assert cells
    for cell in cells:
        assert_same_run(cell, out / "cells" / cell.name)
    assert (ref / "summary.csv").read_bytes() == (out / "summary.csv").read_bytes()
    assert not _mid_commit(out)


def _kill_compare(tmp_path, kills, sig, seed):
    counts = kill_and_resume(COMPARE, tmp_path / "cut", kills, sig, seed, [], assert_same_compare,
                             first_file="cells/fp64-qr-*/commit.json")
    print(f"\ncompare {signal.Signals(sig).name}: {counts}")
    return counts


# ---- the bounded subset that runs by default -------------------------------------------------------
def test_sigkill_numpy_run_resumes_byte_identical(tmp_path):
    _kill_run(tmp_path, NUMPY_RUN, kills=5, sig=signal.SIGKILL, seed=1)


def test_sigkill_torch_run_resumes_byte_identical(tmp_path):
    _kill_run(tmp_path, TORCH_RUN, kills=3, sig=signal.SIGKILL, seed=2)


def test_sigkill_sharded_run_resumes_byte_identical(tmp_path):
    # the ranks' blocks are in the checkpoint, and a killed parent's ranks leave with it (no orphans)
    _kill_run(tmp_path, SHARDED_RUN, kills=2, sig=signal.SIGKILL, seed=4)


def test_sigterm_run_commits_and_resumes_byte_identical(tmp_path):
    _kill_run(tmp_path, NUMPY_RUN, kills=3, sig=signal.SIGTERM, seed=3)


def test_sigkill_compare_resumes_byte_identical(tmp_path):
    _kill_compare(tmp_path, kills=2, sig=signal.SIGKILL, seed=4)


# ---- the full versions -----------------------------------------------------------------------------
KILLS = int(os.environ.get("PITCHECK_KILLS", "200"))


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_many_sigkills_run(tmp_path, backend):
    counts = _kill_run(tmp_path, NUMPY_RUN if backend == "numpy" else TORCH_RUN, KILLS, signal.SIGKILL, seed=10)
    assert counts["kills"] == KILLS and counts["mid_commit"] > 0


@pytest.mark.slow
def test_many_sigterms_run(tmp_path):
    _kill_run(tmp_path, NUMPY_RUN, KILLS // 4, signal.SIGTERM, seed=11)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_many_kills_compare(tmp_path, sig):
    _kill_compare(tmp_path, KILLS // 4, sig, seed=12)
