"""Reproduce every fault case (hostile and careless input) against the current code and tabulate the outcomes.

Each case is run for real: the CLI in a subprocess (120 s timeout), the metrics API in-process. A case is
BAD when it shows a traceback, hangs, prints more than one stderr line for an error, exits 0 where an
error was expected, or misses what the case is about (wrong message, lost bytes, unexplained NaN).

    .venv/bin/python scripts/studies/fault_cases.py

Writes results/faults/cases.md and cases.json; exits 1 if any case is BAD.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from pitcheck import PitcheckError
from pitcheck.numerics import metrics, reference
from pitcheck.trajectory.events import EventKind
from pitcheck.infra.rundir import METRIC_COLUMNS, npz_bytes, read_events, read_metrics

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tests.helpers import damage_run_file  # noqa: E402  (the damage the tests do)
RESULTS = ROOT / "results" / "faults"
TIMEOUT = 120
MESSAGE_CHARS = 140
TEMP_ROOT = ""  # the workspace's path, shown as TMP in messages (set by main)
CLI_MAIN = "import sys; from pitcheck.cli import main; sys.exit(main(sys.argv[1:]))"
TINY = ["--vocab", "64", "--dim", "8", "--steps", "20", "--adversary", "gaussian,nonfinite", "--no-progress"]
FP16_TORCH = ["--backend", "torch", "--precision", "fp16", "--device", "cpu", "--vocab", "256", "--dim", "16",
              "--no-progress"]
KILL_RUN = ["run", "--vocab", "64", "--dim", "8", "--steps", "400", "--optimizer", "momentum", "--retraction",
            "cayley", "--adversary", "gaussian,spike", "--no-progress"]
KILL_COMPARE = ["compare", "--precisions", "fp64", "--retractions", "qr,cayley", "--vocab", "32", "--dim", "4",
                "--adversary", "gaussian", "--seed", "0", "--steps", "60", "--no-progress"]
RUN_FILES = ("metrics.csv", "events.jsonl", "checkpoint.npz")
# events that say a numerical fault was met, most telling first
FAULT_EVENTS = tuple(kind.value for kind in (EventKind.BREAKDOWN, EventKind.NONFINITE_METRIC, EventKind.NONFINITE_STATE,
                                             EventKind.NONFINITE_GRADIENT, EventKind.GRADIENT_OVERFLOW))
U64 = 2.0**-53

GROUPS = ["hang", "never-resumable", "lost history", "silent overwrite / wrong numbers", "tracebacks",
          "silent or wrong values", "metrics API"]


@dataclass
class Row:
    group: str
    case: str
    command: str
    outcome: str
    status: str
    message: str
    problems: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        return "BAD: " + "; ".join(self.problems) if self.problems else "ok"


@dataclass
class Proc:
    code: int | None  # None: killed after TIMEOUT
    out: str
    err: str


# ---- running the CLI ------------------------------------------------------------------------------------
def cli(argv: list[str], cwd: Path, prelude: str = "") -> Proc:
    """`pitcheck ARGV` in a subprocess; prelude is Python run before main (to simulate a fault)."""
    cmd = [sys.executable, "-c", prelude + "\n" + CLI_MAIN, *argv] if prelude else \
        [sys.executable, "-m", "pitcheck.cli", *argv]
    try:
        done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired as exc:
        return Proc(None, _text(exc.stdout), _text(exc.stderr))
    return Proc(done.returncode, done.stdout, done.stderr)


def _text(data) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")


def last_line(text: str) -> str:
    lines = text.strip().splitlines()
    line = lines[-1] if lines else ""
    if TEMP_ROOT:
        line = line.replace(TEMP_ROOT, "TMP")
    return line if len(line) <= MESSAGE_CHARS else line[: MESSAGE_CHARS - 3] + "..."


def observed_class(proc: Proc) -> str:
    """What the process did, in the words of the table."""
    lines = proc.err.strip().splitlines()
    if proc.code is None:
        return f"hang (killed after {TIMEOUT} s)"
    if "Traceback" in proc.err:
        return f"traceback, exit {proc.code}"
    if proc.code == 2 and len(lines) == 1 and lines[0].startswith("pitcheck: error:"):
        return "one-line error, exit 2"
    if proc.code != 0 and len(lines) > 1:
        return f"{len(lines)}-line error, exit {proc.code}"
    return f"exit {proc.code}"


def process_problems(proc: Proc) -> list[str]:
    problems = []
    if proc.code is None:
        problems.append(f"hang: killed after {TIMEOUT} s")
    if "Traceback" in proc.err:
        problems.append("traceback")
    lines = len(proc.err.strip().splitlines())
    if proc.code not in (0, None) and lines > 1:
        problems.append(f"{lines} stderr lines")
    return problems


def error_row(group, case, command, proc: Proc, match: str, extra_problems=()) -> Row:
    """A case that must end in a one-line error naming `match`, exit 2."""
    problems = process_problems(proc)
    if proc.code == 0:
        problems.append("exit 0 where an error was expected")
    elif proc.code is not None and proc.code != 2:
        problems.append(f"exit {proc.code}, expected 2")
    if proc.code is not None and match not in proc.err:
        problems.append(f"message lacks {match!r}")
    problems += list(extra_problems)
    return Row(group, case, command, observed_class(proc), str(proc.code), last_line(proc.err), problems)


def unexplained_nan(run_dir: Path) -> list[str]:
    """Non-finite metrics in metrics.csv with no nonfinite_metric event naming them (shadow columns excepted)."""
    explained = {m for e in read_events(run_dir / "events.jsonl") if e["event"] == "nonfinite_metric"
                 for m in e["metrics"]}
    lost = []
    for row in read_metrics(run_dir / "metrics.csv"):
        lost += [f"{k}@{row['step']}" for k in METRIC_COLUMNS[1:]
                 if k not in ("shadow_Z", "shadow_T") and not np.isfinite(row[k]) and k not in explained]
    return lost


def event_row(group, case, command, proc: Proc, run_dir: Path, statuses=(0, 1), extra=None) -> Row:
    """A run that must meet its fault with a recorded event (exit 0, or 1 for a breakdown), no unexplained NaN."""
    problems = process_problems(proc)
    if proc.code is not None and proc.code not in statuses:
        problems.append(f"exit {proc.code}, expected one of {statuses}")
    names = []
    if (run_dir / "events.jsonl").exists():
        names = list(dict.fromkeys(e["event"] for e in read_events(run_dir / "events.jsonl")))
        lost = unexplained_nan(run_dir)
        if lost:
            problems.append(f"NaN with no event: {', '.join(lost[:4])}")
    faults = [n for n in FAULT_EVENTS if n in names]
    if not faults:
        problems.append("no fault event recorded")
    if extra:
        problems += extra()
    outcome = f"event {faults[0]} recorded, exit {proc.code}" if faults and not problems else observed_class(proc)
    message = last_line(proc.err) if proc.code else "events: " + ", ".join(n for n in names if n != "threshold_crossed")
    return Row(group, case, command, outcome, str(proc.code), message, problems)


def correct_row(group, case, command, proc: Proc, check, message: str) -> Row:
    """A case that must succeed (exit 0) with check() returning no problems."""
    problems = process_problems(proc)
    if proc.code != 0:
        problems.append(f"exit {proc.code}, expected 0")
    else:
        problems += check()
    outcome = "correct result" if not problems else observed_class(proc)
    return Row(group, case, command, outcome, str(proc.code), message if not problems else last_line(proc.err),
               problems)


# ---- run directories --------------------------------------------------------------------------------
def files_of(d: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file() and p.name != ".lock"}


def stray_files(d: Path) -> list[str]:
    return [str(p.relative_to(d)) for p in d.rglob("*") if p.name.endswith((".staged", ".tmp"))]


def differing(a: Path, b: Path, names=RUN_FILES) -> list[str]:
    return [f"{n} differs from the uninterrupted run" for n in names
            if not (b / n).exists() or (a / n).read_bytes() != (b / n).read_bytes()]


class Workspace:
    """A temporary directory with one finished tiny run that damaged copies are made from."""

    def __init__(self, root: Path):
        self.root = root
        self.finished = root / "finished"
        proc = cli(["run", *TINY, "--out", str(self.finished)], root)
        if proc.code != 0 or not (self.finished / "events.jsonl").read_text():
            sys.exit(f"the finished tiny run failed or recorded no event: {proc.err}")
        self.count = 0

    def fresh(self, name: str) -> Path:
        self.count += 1
        d = self.root / f"{self.count:02d}-{name}"
        d.mkdir()
        return d

    def copy(self, name: str, legacy: bool = False) -> Path:
        d = self.fresh(name) / "run"
        shutil.copytree(self.finished, d)
        if legacy:  # a directory from before commit records
            (d / "commit.json").unlink()
        return d


# ---- kills ------------------------------------------------------------------------------------------
def start(argv: list[str], out: Path) -> subprocess.Popen:
    # a session of its own: compare's workers are killed with it; stderr to a file, never a pipe an orphan holds
    err = open(out.with_name(out.name + ".stderr"), "w+")
    proc = subprocess.Popen([sys.executable, "-m", "pitcheck.cli", *argv, "--out", str(out)], cwd=out.parent,
                            stdout=subprocess.DEVNULL, stderr=err, text=True, start_new_session=True)
    proc.err_file = err
    return proc


def finish(proc: subprocess.Popen) -> Proc:
    try:
        proc.wait(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        code = None
    else:
        code = proc.returncode
    proc.err_file.seek(0)
    err = proc.err_file.read()
    proc.err_file.close()
    return Proc(code, "", err)


def committed_step(out: Path) -> int:
    try:
        return json.loads(max(out.rglob("commit.json")).read_text())["step"]
    except (ValueError, OSError, KeyError):
        return -1


def kill_in_a_commit(proc: subprocess.Popen, out: Path, after_step: int = -1) -> str:
    """SIGKILL proc as soon as a commit past after_step is under way in out; say where it landed."""
    deadline = time.monotonic() + TIMEOUT
    while proc.poll() is None and time.monotonic() < deadline:
        if out.exists() and stray_files(out) and committed_step(out) >= after_step:
            break
        time.sleep(0.0005)
    if proc.poll() is not None:
        return "run ended before the kill"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.err_file.close()
    return "mid-commit" if stray_files(out) else "between commits"


# ---- the cases --------------------------------------------------------------------------------------
def hang_cases(ws: Workspace) -> list[Row]:
    rows = []
    for case, args in [
        ("fp16, cond(T) = 1e7: stored embedding overflows", ["--steps", "10", "--cond", "1e7"]),
        ("fp16, heavy_tail, lr 0.1", ["--steps", "150", "--adversary", "heavy_tail", "--lr", "0.1"]),
        ("fp16, gaussian,spike,nonfinite with momentum",
         ["--steps", "150", "--adversary", "gaussian,spike,nonfinite", "--optimizer", "momentum"]),
    ]:
        out = ws.fresh("hang") / "run"
        proc = cli(["run", *FP16_TORCH, *args, "--out", str(out)], out.parent)
        rows.append(event_row("hang", case, "pitcheck run $FP16 " + " ".join(args), proc, out))
    return rows


def never_resumable_cases(ws: Workspace) -> list[Row]:
    rows = []
    out = ws.fresh("staged-only") / "run"
    out.mkdir()
    for name in ("checkpoint.npz", "metrics.csv", "manifest.json"):
        (out / (name + ".staged")).write_bytes(b"half written")
    proc = cli(["run", *TINY, "--resume", "--out", str(out)], out.parent)
    rows.append(correct_row("never-resumable", "killed in the first save (staged files, no commit record)",
                            "pitcheck run $TINY --resume --out RUN", proc,
                            lambda: differing(ws.finished, out) + stray_files(out),
                            "resumed from scratch; files byte-identical to an uninterrupted run"))

    # the real thing: SIGKILL during the first commit, again mid-run, then resume
    base = ws.fresh("sigkill-run")
    reference_out, out = base / "reference", base / "cut"
    ref = cli([*KILL_RUN, "--out", str(reference_out)], base)
    landed = [kill_in_a_commit(start(KILL_RUN, out), out),
              kill_in_a_commit(start([*KILL_RUN, "--resume"], out), out, after_step=50)]
    proc = finish(start([*KILL_RUN, "--resume"], out))
    problems = [] if ref.code == 0 else [f"uninterrupted run failed: {last_line(ref.err)}"]
    problems += [f"kill {i + 1}: {where}" for i, where in enumerate(landed) if where == "run ended before the kill"]
    rows.append(correct_row("never-resumable", "SIGKILL as the first commit starts, again mid-run; --resume",
                            "pitcheck run --vocab 64 --dim 8 --steps 400 ... ; kill -9 twice; --resume", proc,
                            lambda: problems + differing(reference_out, out) + stray_files(out),
                            f"kills landed {', '.join(landed)}; metrics.csv, events.jsonl, checkpoint.npz "
                            "byte-identical to an uninterrupted run"))

    base = ws.fresh("sigkill-compare")
    reference_out, out = base / "reference", base / "cut"
    ref = cli([*KILL_COMPARE, "--out", str(reference_out)], base)
    where = kill_in_a_commit(start(KILL_COMPARE, out), out)
    proc = finish(start(KILL_COMPARE, out))

    def same_compare() -> list[str]:
        problems = [] if ref.code == 0 else [f"uninterrupted compare failed: {last_line(ref.err)}"]
        if where == "run ended before the kill":
            problems.append(where)
        cells = sorted(p.name for p in (reference_out / "cells").iterdir())
        for cell in cells:
            problems += differing(reference_out / "cells" / cell, out / "cells" / cell)
        return problems + differing(reference_out, out, ["summary.csv"]) + stray_files(out)

    rows.append(correct_row("never-resumable", "compare killed (SIGKILL) as a cell commits, rerun",
                            "pitcheck compare --precisions fp64 --retractions qr,cayley ... ; kill -9; rerun",
                            proc, same_compare,
                            f"kill landed {where}; cells and summary.csv byte-identical to an uninterrupted compare"))
    return rows


def lost_history_cases(ws: Workspace) -> list[Row]:
    group = "lost history"
    rows = []
    out = ws.copy("rolled-forward")
    metrics_csv = (out / "metrics.csv").read_bytes()
    (out / "metrics.csv").write_bytes(metrics_csv[: len(metrics_csv) // 2])
    (out / "metrics.csv.staged").write_bytes(metrics_csv)
    proc = cli(["run", *TINY, "--resume", "--out", str(out)], out.parent)
    rows.append(correct_row(group, "killed after the commit point, before metrics.csv was renamed in",
                            "pitcheck run $TINY --resume --out RUN", proc,
                            lambda: differing(ws.finished, out) + stray_files(out),
                            "rolled forward: metrics.csv, events.jsonl, checkpoint.npz as committed"))
    def drop_last_row(path: Path) -> None:
        path.write_text("".join(path.read_text().splitlines(keepends=True)[:-1]))

    def header_only(path: Path) -> None:
        path.write_text(",".join(METRIC_COLUMNS) + "\n")

    for slug, case, damage_metrics, legacy_message in (
            ("lost-row", "lost the checkpoint's row", drop_last_row, "rows were lost"),
            ("empty-metrics", "emptied to its header", header_only, "no row for step 0")):
        for legacy in (False, True):
            kind = "no commit record" if legacy else "committed"
            out = ws.copy(slug, legacy)
            damage_metrics(out / "metrics.csv")
            before = files_of(out)
            proc = cli(["run", *TINY, "--resume", "--out", str(out)], out.parent)
            rows.append(error_row(group, f"metrics.csv {case} ({kind})", "pitcheck run $TINY --resume --out RUN",
                                  proc, legacy_message if legacy else "does not match the last commit",
                                  ["files changed"] if files_of(out) != before else []))
    return rows


def overwrite_cases(ws: Workspace) -> list[Row]:
    group = "silent overwrite / wrong numbers"
    rows = []
    out = ws.copy("no-checkpoint", legacy=True)
    (out / "checkpoint.npz").unlink()
    before = files_of(out)
    proc = cli(["run", *TINY, "--retraction", "polar", "--resume", "--out", str(out)], out.parent)
    rows.append(error_row(group, "no checkpoint.npz, --resume with another config",
                          "pitcheck run $TINY --retraction polar --resume --out RUN", proc, "holds no checkpoint",
                          ["files changed"] if files_of(out) != before else []))

    out = ws.copy("wrong-shape", legacy=True)
    with np.load(out / "checkpoint.npz") as ck:
        arrays = {k: ck[k] for k in ck.files}
    arrays["Z"] = np.zeros((65, 8))
    (out / "checkpoint.npz").write_bytes(npz_bytes(arrays))
    proc = cli(["run", *TINY, "--resume", "--out", str(out)], out.parent)
    rows.append(error_row(group, "checkpoint's Z of the wrong shape (65 x 8 for 64 x 8)",
                          "pitcheck run $TINY --resume --out RUN", proc, "checkpoint.npz's Z is float64 (65, 8)"))

    # two runs into one --out: the first is stopped (SIGSTOP) while it holds the directory
    out = ws.fresh("two-writers") / "run"
    long_run = ["run", "--vocab", "64", "--dim", "8", "--steps", "3000", "--no-progress"]
    first = start(long_run, out)
    while first.poll() is None and not (out / "commit.json").exists():
        time.sleep(0.005)
    os.kill(first.pid, signal.SIGSTOP)
    proc = cli([*long_run, "--out", str(out)], out.parent)
    os.kill(first.pid, signal.SIGCONT)
    first_done = finish(first)
    first_problems = [] if first_done.code == 0 else [f"first writer: exit {first_done.code}"]
    rows.append(error_row(group, "two runs into one --out (second starts while the first runs)",
                          "pitcheck run ... --out RUN  (twice, concurrently)", proc,
                          f"in use by another pitcheck (pid {first.pid}", first_problems))

    base = ws.fresh("compare-fewer-steps")
    compare = ["compare", "--precisions", "fp64", "--retractions", "qr", "--vocab", "32", "--dim", "4",
               "--adversary", "gaussian", "--seed", "0", "--no-progress", "--out", str(base / "cmp")]
    first_done = cli([*compare, "--steps", "40"], base)
    summary = (base / "cmp" / "summary.csv").read_bytes() if first_done.code == 0 else b""
    proc = cli([*compare, "--steps", "20"], base)
    problems = [] if first_done.code == 0 else ["the first compare failed"]
    if (base / "cmp" / "summary.csv").read_bytes() != summary:
        problems.append("summary.csv changed")
    rows.append(error_row(group, "compare rerun with smaller --steps into a finished one",
                          "pitcheck compare ... --steps 40; same with --steps 20", proc,
                          "--steps 20: it holds a run at step 40", problems))

    out = ws.copy("fresh-over-run")
    before = files_of(out)
    proc = cli(["run", *TINY, "--retraction", "polar", "--out", str(out)], out.parent)
    rows.append(error_row(group, "fresh run into the directory of another run (no --force)",
                          "pitcheck run $TINY --retraction polar --out RUN", proc, "already holds a run",
                          ["files changed"] if files_of(out) != before else []))
    return rows


def _npy_header(path: Path, shape) -> None:
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "<f8", "fortran_order": False, "shape": shape})


def _npz_as_npy(path: Path) -> None:
    np.savez(path.with_suffix(".npz"), a=np.ones((64, 8)))
    path.with_suffix(".npz").rename(path)


def _deny_access_prelude(path: Path) -> str:
    """Make os.access deny `path`: root may write anywhere, so a read-only directory must be simulated."""
    return ("import os\nfrom pathlib import Path\n_real_access = os.access\n"
            f"os.access = lambda p, mode, **kw: False if Path(p) == Path({str(path)!r}) "
            "else _real_access(p, mode, **kw)")


FULL_DISK_PRELUDE = """
import errno
from pitcheck.infra import rundir
_real_write, _writes = rundir._write_durable, []
def _write_until_full(path, data):
    _writes.append(path)
    if len(_writes) == 2:
        raise OSError(errno.ENOSPC, "No space left on device")
    _real_write(path, data)
rundir._write_durable = _write_until_full
"""
LITTLE_FREE_SPACE_PRELUDE = ("import shutil\n"
                             "shutil.disk_usage = lambda p: shutil._ntuple_diskusage(10**9, 10**9 - 1000, 1000)")


def traceback_cases(ws: Workspace) -> list[Row]:
    group = "tracebacks"
    rows = []
    for args, match in [
        (["--cond", "1e17"], "--cond must be a number in [1, 1e+15]"),
        (["--seed", "-1"], "--seed must be >= 0"),
        (["--vocab", "1000000000", "--dim", "1000"], "is too large"),
    ]:
        base = ws.fresh("bad-number")
        proc = cli(["run", *TINY, *args, "--out", str(base / "run")], base)
        rows.append(error_row(group, " ".join(args), "pitcheck run $TINY " + " ".join(args), proc, match))

    out = ws.fresh("huge-lr") / "run"
    proc = cli(["run", *TINY, "--adversary", "gaussian", "--lr", "1e6", "--out", str(out)], out.parent)

    def last_good_state_kept() -> list[str]:
        with np.load(out / "checkpoint.npz") as ck:
            ok = int(ck["step"]) == 0 and np.isfinite(ck["L"]).all() and np.diag(ck["L"]).min() > 0
        return [] if ok else ["checkpoint is not the last good state"]

    rows.append(event_row(group, "huge --lr underflows L's diagonal", "pitcheck run $TINY --adversary gaussian "
                          "--lr 1e6", proc, out, statuses=(1,), extra=last_good_state_kept))

    for case, make, match in [
        (".npz renamed .npy as --teacher", _npz_as_npy, "zip archive (an .npz?)"),
        ("--teacher whose header claims 1e9 x 1e4", lambda p: _npy_header(p, (10**9, 10**4)), "is too large"),
    ]:
        base = ws.fresh("teacher")
        make(base / "teacher.npy")
        proc = cli(["run", "--teacher", str(base / "teacher.npy"), "--steps", "1", "--no-progress",
                    "--out", str(base / "run")], base)
        rows.append(error_row(group, case, "pitcheck run --teacher teacher.npy --steps 1", proc, match))

    base = ws.fresh("out-file")
    (base / "a_file").write_text("x")
    proc = cli(["run", *TINY, "--out", str(base / "a_file")], base)
    rows.append(error_row(group, "--out an existing file", "pitcheck run $TINY --out a_file", proc,
                          "is a file, not a directory"))

    for case, out_name, target_name in [("--out inside an unwritable directory", "locked/run", "locked"),
                                        ("--out a read-only directory", "locked", "locked")]:
        base = ws.fresh("unwritable")
        (base / "locked").mkdir()
        if os.geteuid() == 0:
            proc = cli(["run", *TINY, "--out", str(base / out_name)], base, _deny_access_prelude(base / target_name))
            how = "  (simulated: os.access denies it; running as root)"
        else:
            (base / "locked").chmod(0o500)
            proc = cli(["run", *TINY, "--out", str(base / out_name)], base)
            (base / "locked").chmod(0o700)
            how = "  (chmod 500)"
        rows.append(error_row(group, case, f"pitcheck run $TINY --out {out_name}{how}", proc, "is not writable"))

    out = ws.copy("full-disk")
    before = files_of(out)
    proc = cli(["run", *TINY, "--steps", "40", "--resume", "--out", str(out)], out.parent, FULL_DISK_PRELUDE)
    problems = (["files changed"] if files_of(out) != before else []) + \
        [f"stray file {name}" for name in stray_files(out)]
    if not problems:
        again = cli(["run", *TINY, "--steps", "40", "--resume", "--out", str(out)], out.parent)
        problems += [] if again.code == 0 else [f"resume after the full disk: exit {again.code}"]
    rows.append(error_row(group, "disk fills up in the middle of a commit",
                          "pitcheck run $TINY --steps 40 --resume --out RUN  (simulated: 2nd write raises ENOSPC)",
                          proc, "No space left on device", problems))

    base = ws.fresh("little-space")
    proc = cli(["run", *TINY, "--out", str(base / "run")], base, LITTLE_FREE_SPACE_PRELUDE)
    left = [p.name for p in (base / "run").iterdir() if p.name != ".lock"] if (base / "run").exists() else []
    rows.append(error_row(group, "--out on a disk with 1 kB free",
                          "pitcheck run $TINY --out RUN  (simulated: shutil.disk_usage says 1000 bytes free)", proc,
                          "not enough free space", [f"left behind: {left}"] if left else []))

    for name in ("checkpoint.npz", "metrics.csv", "manifest.json", "events.jsonl"):
        for how in ("truncated", "empty", "garbage", "nan"):
            out = ws.copy("damaged")
            damage_run_file(out / name, how)
            before = files_of(out)
            proc = cli(["run", *TINY, "--resume", "--out", str(out)], out.parent)
            rows.append(error_row(group, f"{how} {name}, --resume", f"pitcheck run $TINY --resume --out RUN  "
                                  f"(RUN/{name} {how})", proc, "does not match the last commit",
                                  ["files changed"] if files_of(out) != before else []))

    base = ws.fresh("plot")
    proc = cli(["plot", str(ws.finished), "--out", str(base / "missing" / "p.png")], base)
    rows.append(error_row(group, "plot into a missing directory", "pitcheck plot RUN --out missing/p.png", proc,
                          "does not exist"))
    proc = cli(["plot", str(ws.finished), "--out", str(base)], base)
    rows.append(error_row(group, "plot onto a directory", "pitcheck plot RUN --out DIR", proc, "is a directory"))

    rows.append(ctrl_c_case(ws))
    return rows


def ctrl_c_case(ws: Workspace) -> Row:
    out = ws.fresh("ctrl-c") / "run"
    # 2000 steps: the signal cannot arrive after the run is done, however late a loaded machine delivers it
    argv = ["run", "--backend", "torch", "--precision", "bf16", "--device", "cpu", *TINY, "--steps", "2000",
            "--out", str(out)]
    # SIG_DFL: as a terminal's foreground job, even when this script runs in a background (SIGINT-ignoring) shell
    proc = subprocess.Popen([sys.executable, "-m", "pitcheck.cli", *argv], cwd=out.parent,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(0.5)  # inside torch's import, which takes seconds
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=TIMEOUT)
        done = Proc(proc.returncode, "", err)
    except subprocess.TimeoutExpired:
        proc.kill()
        done = Proc(None, "", proc.communicate()[1])
    problems = process_problems(done)
    lines = done.err.strip().splitlines()
    # during start-up: 130; if the machine was slow enough for the run to have begun, its steps are kept
    in_start_up = done.code == 130 and lines == ["pitcheck: interrupted"]
    in_run = done.code == 2 and len(lines) == 1 and "checkpoint saved" in lines[0]
    if not (in_start_up or in_run):
        problems.append(f"expected exit 130 and 'pitcheck: interrupted' (or exit 2, checkpoint saved), "
                        f"got exit {done.code}")
    outcome = f"one-line message, exit {done.code}" if not problems else observed_class(done)
    return Row("tracebacks", "Ctrl-C during start-up (SIGINT 0.5 s after launch)",
               "pitcheck run --backend torch --precision bf16 $TINY --steps 2000; kill -INT", outcome,
               str(done.code), last_line(done.err), problems)


def wrong_value_cases(ws: Workspace) -> list[Row]:
    group = "silent or wrong values"
    rows = []
    for args, match in [
        (["--reproject-threshold", "nan"], "--reproject-threshold must be a finite number"),
        (["--head", "tied", "--retraction", "cayley"], "--retraction applies to --head pit only"),
    ]:
        base = ws.fresh("bad-option")
        proc = cli(["run", *TINY, *args, "--out", str(base / "run")], base)
        rows.append(error_row(group, " ".join(args), "pitcheck run $TINY " + " ".join(args), proc, match))

    cwd = ws.fresh("empty-out")
    proc = cli(["run", *TINY, "--out", ""], cwd)
    rows.append(error_row(group, "--out ''", "pitcheck run $TINY --out ''", proc, "--out is empty",
                          [f"wrote into the current directory: {os.listdir(cwd)}"] if os.listdir(cwd) else []))

    out = ws.fresh("fp16-degenerate") / "run"
    args = ["--steps", "20", "--adversary", "gaussian", "--lr", "1e6"]
    proc = cli(["run", *FP16_TORCH, *args, "--out", str(out)], out.parent)
    rows.append(event_row(group, "L degenerates in fp16 (penrose NaN without event)",
                          "pitcheck run $FP16 " + " ".join(args), proc, out))

    # found by this script: at V=64, D=8 every update overflows the fp16 state, so every step is skipped
    out = ws.fresh("all-skipped") / "run"
    proc = cli(["run", *FP16_TORCH, *args, "--vocab", "64", "--dim", "8", "--out", str(out)], out.parent)

    def says_none_applied() -> list[str]:
        return [] if "none of the 20 steps was applied" in proc.err else ["no message that no step was applied"]

    rows.append(event_row(group, "every step skipped (fp16 state overflows at V=64, D=8): not a result",
                          "pitcheck run $FP16 --vocab 64 --dim 8 " + " ".join(args), proc, out, statuses=(1,),
                          extra=says_none_applied))

    out = ws.fresh("shadow-skips") / "run"
    args = ["--steps", "40", "--optimizer", "adam", "--adversary", "gaussian,spike,nonfinite"]
    proc = cli(["run", *FP16_TORCH, *args, "--out", str(out)], out.parent)

    def shadow_follows() -> list[str]:
        with np.load(out / "checkpoint.npz") as ck:
            steps = int(ck["engine_opt_step"]), int(ck["shadow_opt_step"])
        shadow_z = read_metrics(out / "metrics.csv")[-1]["shadow_Z"]
        problems = [] if steps[0] == steps[1] else [f"optimizer steps: model {steps[0]}, shadow {steps[1]}"]
        return problems + ([] if shadow_z < 0.05 else [f"shadow_Z {shadow_z:.3g} (the shadow ran other steps)"])

    rows.append(event_row(group, "fp16 skips steps: the shadow must skip them too (shadow_Z meaningful)",
                          "pitcheck run $FP16 " + " ".join(args), proc, out, statuses=(0,), extra=shadow_follows))
    return rows


def api_row(case: str, call: str, compute, match: str = "") -> Row:
    """A metrics API call that must be refused with a PitcheckError naming `match`."""
    try:
        value = compute()
    except PitcheckError as exc:
        problems = [] if match in str(exc) else [f"message lacks {match!r}"]
        return Row("metrics API", case, call, "refused with message", "-", last_line(f"PitcheckError: {exc}"),
                   problems)
    except Exception as exc:  # a raw error is what the issue reports
        return Row("metrics API", case, call, f"raw {type(exc).__name__}", "-", last_line(f"{exc}"),
                   [f"raised {type(exc).__name__}, not a PitcheckError"])
    return Row("metrics API", case, call, "returned a value", "-", last_line(repr(value)),
               ["returned a value where a refusal was expected"])


def metrics_api_cases() -> list[Row]:
    import torch

    rng = np.random.default_rng(0)
    Z = reference.random_memory(100, 6, rng)
    L = reference.cholesky_factor(reference.spd_with_condition(6, 100.0, rng))
    E = reference.embedding_matrix(Z, L)
    Z_nan = Z.copy()
    Z_nan[1, 0] = np.nan
    rows = [
        api_row("upper-triangular L for an exact pair", "interface_metrics(Z, L.T, E, u)",
                lambda: metrics.interface_metrics(Z, L.T.copy(), E, U64), "lower triangular"),
        api_row("NaN in Z", "interface_metrics(Z_nan, L, E, u)",
                lambda: metrics.interface_metrics(Z_nan, L, E, U64), "non-finite"),
        api_row("u < 0", "orthonormality_ratio(Z, -1e-3)", lambda: metrics.orthonormality_ratio(Z, -1e-3), "u"),
        api_row("u = 0", "interface_metrics(Z, L, E, 0.0)", lambda: metrics.interface_metrics(Z, L, E, 0.0), "u"),
        api_row("sample_rows = 0", "interface_metrics(Z, L, E, u, sample_rows=0)",
                lambda: metrics.interface_metrics(Z, L, E, U64, sample_rows=0), "sample_rows"),
    ]

    Zt, Lt = torch.from_numpy(Z).to(torch.bfloat16), torch.from_numpy(L).to(torch.bfloat16)
    Et = torch.linalg.solve_triangular(Lt.float().T, torch.linalg.solve_triangular(Lt.float(), Zt.float().T,
                                       upper=False), upper=True).T.to(torch.bfloat16)
    call = "interface_metrics(Z_bf16, L_bf16, E_bf16, 2**-8)"
    try:
        got = metrics.interface_metrics(Zt, Lt, Et, 2.0**-8)
        want = metrics.interface_metrics(Zt.double().numpy(), Lt.double().numpy(), Et.double().numpy(), 2.0**-8)
    except Exception as exc:
        rows.append(Row("metrics API", "bf16 torch tensors", call, f"raw {type(exc).__name__}", "-",
                        last_line(f"{type(exc).__name__}: {exc}"), ["bf16 tensors not accepted"]))
    else:
        problems = [] if got == want else ["values differ from float64 copies of the tensors"]
        if not all(np.isfinite(v) for v in got.values() if not isinstance(v, bool)):
            problems.append("non-finite values")
        rows.append(Row("metrics API", "bf16 torch tensors", call,
                        "correct result" if not problems else "wrong values", "-",
                        f"{len(got)} finite values, equal to those of float64 copies" if not problems else "",
                        problems))
    return rows


# ---- the table --------------------------------------------------------------------------------------
def write_tables(rows: list[Row], seconds: float) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    bad = sum(1 for r in rows if r.problems)
    summary = f"{len(rows)} cases: {len(rows) - bad} ok, {bad} bad"
    (RESULTS / "cases.json").write_text(json.dumps(
        {"summary": summary, "wall_s": round(seconds, 1),
         "rows": [{**asdict(r), "verdict": r.verdict} for r in rows]}, indent=1) + "\n")

    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    lines = [
        "# Fault cases, reproduced",
        "",
        f"Written by `scripts/studies/fault_cases.py` ({summary}; wall {seconds:.0f} s). Every outcome below was observed "
        "by running the case: the CLI in a subprocess with a 120 s timeout, the metrics API in-process.",
        "",
        f"`$TINY` = `{' '.join(TINY)}`; `$FP16` = `{' '.join(FP16_TORCH)}`. RUN is a copy of a finished "
        "`$TINY` run, damaged as the case says; TMP is the script's temporary directory. The message is stderr's "
        "last line (or the events recorded).",
        "",
    ]
    for group in GROUPS:
        lines += [f"## {group}", "", "| case | command / call | outcome | exit | message or events | verdict |",
                  "|---|---|---|---|---|---|"]
        for r in (r for r in rows if r.group == group):
            lines.append(f"| {cell(r.case)} | `{cell(r.command)}` | {cell(r.outcome)} | {r.status} | "
                         f"{cell(r.message)} | {cell(r.verdict)} |")
        lines.append("")
    (RESULTS / "cases.md").write_text("\n".join(lines))
    print(summary)


def main() -> int:
    global TEMP_ROOT
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="pitcheck-faults-") as tmp:
        TEMP_ROOT = tmp
        ws = Workspace(Path(tmp))
        rows = []
        for cases in (hang_cases, never_resumable_cases, lost_history_cases, overwrite_cases, traceback_cases,
                      wrong_value_cases):
            rows += cases(ws)
            print(f"{cases.__name__}: {len(rows)} cases so far", file=sys.stderr)
        rows += metrics_api_cases()
    for r in rows:
        if r.problems:
            print(f"BAD [{r.group}] {r.case}: {r.verdict} -- {r.message}", file=sys.stderr)
    write_tables(rows, time.monotonic() - t0)
    return 1 if any(r.problems for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
