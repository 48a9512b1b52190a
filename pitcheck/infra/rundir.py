"""The run directory as a small store: one commit point per recorded step, an exclusive lock, strict reads.

A run directory holds manifest.json, metrics.csv, events.jsonl and checkpoint.npz, plus two files of the
store itself: commit.json, the commit record (the step and each file's SHA-256), and .lock.

A commit first writes every new file as NAME.staged and fsyncs it, then atomically replaces commit.json:
that rename is the commit point. Only then are the staged files renamed over the old ones. Opening the
directory finishes a commit that was cut off after its commit point (a staged file whose hash the record
names is renamed into place) and deletes the staged files of one cut off before it. So a kill at any
instant leaves the previous commit or the new one, whole, and every file is checked against the record.

The lock is an flock on .lock, held while the directory is open; the file names its holder (pid, host)
so that a second writer is told who has it. The readers here validate the files' formats and say what is
wrong in one line; what the values must be (config, state shapes) is the trajectory's business.
"""
from __future__ import annotations

import csv
import errno
import fcntl
import hashlib
import io
import json
import os
import shutil
import socket
import stat
import sys
import threading
import time
import zipfile
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np

from .errors import PitcheckError

MANIFEST, METRICS, EVENTS, CHECKPOINT = "manifest.json", "metrics.csv", "events.jsonl", "checkpoint.npz"
RUN_FILES = (MANIFEST, METRICS, EVENTS, CHECKPOINT)
COMMIT, LOCK, STAGED = "commit.json", ".lock", ".staged"
# the store's own files, which do not make a directory "hold" anything
STORE_FILES = (COMMIT, LOCK, COMMIT + ".tmp")

METRIC_COLUMNS = [
    "step",
    "orthonormality",
    "orthonormality_ratio",
    "cond_T",
    "min_diag_L",
    "breakdown_margin",
    "trisolve_forward",
    "trisolve_forward_ratio",
    "trisolve_backward",
    "trisolve_backward_ratio",
    "pinv_drift",
    "penrose",
    "penrose_1",
    "penrose_2",
    "penrose_3",
    "penrose_4",
    "pinv_error",
    "shadow_Z",
    "shadow_T",
    "loss_scale",
]
# the lm source's losses (nats/token) beside the interface metrics of the same step; empty for the other
# sources. A metrics.csv of an older pitcheck has METRIC_COLUMNS alone (its lm losses are in the manifest).
LOSS_COLUMNS = ["train_loss", "heldout_loss", "shadow_heldout_loss"]
# a sharded run's distances from the single-process run (u) and its replicas' spread
# (pitcheck.trajectory.shard_metrics). Written only when some row has them: an unsharded run's metrics.csv
# keeps the bytes it had before these columns existed, so its committed results stay as they are.
SHARD_COLUMNS = ["shard_distance_Z", "shard_distance_T", "replica_spread"]
CSV_COLUMNS = METRIC_COLUMNS + LOSS_COLUMNS + SHARD_COLUMNS
OPTIONAL_COLUMNS = LOSS_COLUMNS + SHARD_COLUMNS
# beyond the new files, room the file system needs for directory entries and rounding to blocks
FREE_SPACE_MARGIN = 1 << 20


def _oserror(action: str, path: Path, exc: OSError) -> PitcheckError:
    return PitcheckError(f"cannot {action} {path}: {exc.strerror or exc}")


# One thread a process writes the commits made with later=True, in the order they were made, while the caller
# steps on: a commit's fsyncs and renames are waits on the disk, not work (about 8% of a batched 128 x 8 class's
# wall, the CPU idle meanwhile), and no number depends on them. Made again in a forked child, which inherits
# the executor but not its thread.
_COMMITTER: tuple[int, ThreadPoolExecutor] | None = None
_COMMITTER_LOCK = threading.Lock()


def _committer() -> ThreadPoolExecutor:
    global _COMMITTER
    with _COMMITTER_LOCK:
        if _COMMITTER is None or _COMMITTER[0] != os.getpid():
            _COMMITTER = (os.getpid(), ThreadPoolExecutor(max_workers=1, thread_name_prefix="pitcheck-commit"))
        return _COMMITTER[1]


class CommitQueue:
    """A run directory's commits handed to the commit thread: written in order; the first that fails is kept,
    and raised by drain() (once) and by check() (always); no commit queued after it is written, since the
    files it leaves out as kept are the failed commit's, which never landed."""

    def __init__(self):
        self.pending: list[Future] = []
        self.failed: BaseException | None = None
        self.raised = False

    def check(self) -> None:
        if self.failed is not None:
            raise self.failed

    def submit(self, write, *args) -> None:
        self.pending = [f for f in self.pending if not f.done()]  # a failed one left its error in `failed`
        self.pending.append(_committer().submit(self._guarded, write, *args))

    def _guarded(self, write, *args) -> None:
        if self.failed is not None:
            return
        try:
            write(*args)
        except BaseException as exc:
            self.failed = exc
            raise

    def drain(self) -> None:
        pending, self.pending = self.pending, []
        for future in pending:
            future.exception()  # waits
        if self.failed is not None and not self.raised:
            self.raised = True
            raise self.failed


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_durable(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _unlink_quietly(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


def _stat(path: Path) -> os.stat_result | None:
    """os.stat through every link (/dev/stdout's /proc/self/fd/1 included); None for a path not there yet."""
    try:
        return os.stat(path)
    except FileNotFoundError:
        return None


def _standard_stream(st: os.stat_result | None) -> int | None:
    """1 or 2 when st is the file this process's stdout or stderr writes (/dev/stdout, or the file stdout is
    redirected to), else None: such an output goes through that stream, after what was printed before."""
    if st is None:
        return None
    for fd in (1, 2):
        try:
            fst = os.fstat(fd)
        except OSError:
            continue
        if (fst.st_dev, fst.st_ino) == (st.st_dev, st.st_ino):
            return fd
    return None


def writes_to_stdout(path: Path | str | None) -> bool:
    """Whether an output at `path` goes to this process's stdout (/dev/stdout, or the file stdout is
    redirected to): what a verb prints to stdout would then land inside it."""
    if path is None or str(path).strip() == "":
        return False
    try:
        return _standard_stream(_stat(Path(path))) == 1
    except OSError:
        return False


def _write_stream(fd: int, data: bytes) -> None:
    for stream in (sys.stdout, sys.stderr):  # what is already printed comes first
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def write_atomic(path: Path | str, data: bytes) -> None:
    """Replace one file atomically (write PATH.tmp, fsync, rename); on failure no .tmp is left behind.

    Only a regular file or a new path is replaced, and a symbolic link is followed: its target is replaced,
    the link stays a link. A character device (/dev/null) or a FIFO is written in place, as `>` in a shell
    would (a rename would replace the device node itself), and /dev/stdout, /dev/stderr or the file either
    is redirected to is written through that stream, after what was printed before.
    """
    path = Path(path)
    try:
        st = _stat(path)
        fd = _standard_stream(st)
        if fd is not None:
            _write_stream(fd, data)
            return
        if st is not None and stat.S_ISDIR(st.st_mode):
            raise PitcheckError(f"cannot write {path}: it is a directory")
        if st is not None and not stat.S_ISREG(st.st_mode):
            with open(path, "wb") as f:  # no fsync: a device or FIFO has none
                f.write(data)
            return
    except OSError as exc:
        raise _oserror("write", path, exc) from None
    # the link's final target (of a dangling link: the file to create)
    target = Path(os.path.realpath(path)) if path.is_symlink() else path
    tmp = target.with_name(target.name + ".tmp")
    try:
        _write_durable(tmp, data)
        os.replace(tmp, target)
        _fsync_dir(target.parent)
    except OSError as exc:
        _unlink_quietly(tmp)
        raise _oserror("write", path, exc) from None
    except BaseException:
        _unlink_quietly(tmp)
        raise


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class LaterBytes:
    """A file's bytes made when its commit is written (by the commit thread, for a commit made with later):
    the call that makes them; once made, their digest and the seconds the call took. The bytes themselves are
    dropped once written, and so is the call, with whatever it held (a device's copies)."""

    def __init__(self, make):
        self.make, self.data, self.digest, self.seconds = make, None, None, None

    def made(self) -> bytes:
        if self.data is None:
            started = time.monotonic()
            make, self.make = self.make, None  # dropped even when it fails: what it held goes with it
            self.data = make()
            self.digest, self.seconds = sha256(self.data), time.monotonic() - started
        return self.data


def check_out_file(path: Path | str, option: str = "--out") -> Path:
    """A file we may write: not '', not a directory, in a directory that exists and is writable.
    Checked before the work that produces it, so nothing computed is thrown away.

    As write_atomic writes it: a symbolic link is judged by its target; a character device or FIFO
    (/dev/null, /dev/stdout) must itself be writable."""
    if str(path).strip() == "":
        raise PitcheckError(f"{option} is empty: name a file")
    path = Path(path)
    try:
        st = _stat(path)
    except OSError as exc:
        raise PitcheckError(f"{option} {path}: {exc.strerror or exc}") from None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise PitcheckError(f"{option} {path} is a directory, not a file")
    if st is not None and not stat.S_ISREG(st.st_mode):
        if not (stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode)) and _standard_stream(st) is None:
            raise PitcheckError(f"{option} {path} is neither a regular file nor a character device or FIFO")
        if not os.access(path, os.W_OK):
            raise PitcheckError(f"{option} {path} is not writable")
        return path
    parent = (Path(os.path.realpath(path)) if path.is_symlink() else path).parent
    if not parent.is_dir():
        raise PitcheckError(f"{option} {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise PitcheckError(f"{option} {path}: directory {parent} is not writable")
    return path


def output_identity(path: Path | str) -> tuple | None:
    """What writing an output replaces: the regular file it names (through links) or the new file it
    creates; None when it replaces nothing (a device, a FIFO, the standard streams: written in place)."""
    path = Path(path)
    try:
        st = _stat(path)
    except OSError:
        st = None
    if st is None:
        return ("new", os.path.realpath(path))
    if _standard_stream(st) is not None or not stat.S_ISREG(st.st_mode):
        return None
    return ("file", st.st_dev, st.st_ino)


def check_distinct_outputs(outputs) -> None:
    """Refuse two outputs, (option, path) pairs, that name one file: the later write would silently replace
    the earlier. Paths are compared after resolving links and '..' (an existing file by device and inode).
    /dev/null, /dev/stdout and other devices or FIFOs may take several outputs: each is written after the
    other, nothing is replaced."""
    seen: dict[tuple, str] = {}
    for option, path in outputs:
        if path is None or str(path).strip() == "":
            continue
        key = output_identity(path)
        if key is None:
            continue
        if key in seen:
            raise PitcheckError(f"{option} {path} names the file {seen[key]} writes: give each output its own file")
        seen[key] = option


def check_outputs_spare_inputs(outputs, inputs) -> None:
    """Refuse an output, an (option, path) pair, that names an input, a (what, path) pair: writing it would
    replace the file the work reads (the target module itself, a scenario file)."""
    held = {}
    for what, path in inputs:
        if path is not None:
            key = output_identity(path)
            if key is not None:
                held[key] = (what, path)
    for option, path in outputs:
        if path is None or str(path).strip() == "":
            continue
        key = output_identity(path)
        if key in held:
            what, source = held[key]
            raise PitcheckError(f"{option} {path} would replace {source}, {what}: name another file")


def check_out_path(path: Path | str, option: str = "--out") -> Path:
    """A directory we may create or write in: not '', not a file, with a writable nearest ancestor."""
    if str(path).strip() == "":
        raise PitcheckError(f"{option} is empty: name a directory")
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise PitcheckError(f"{option} {path} is a file, not a directory")
    ancestor = path
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise PitcheckError(f"{option} {path}: {ancestor} is a file, not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise PitcheckError(f"{option} {path}: {ancestor} is not writable")
    return path


class RunDir:
    """One run directory, opened for writing: locked, recovered to its last commit, checked against it."""

    def __init__(self, path: Path | str):
        self.path = check_out_path(path)
        self.record: dict | None = None
        self._lock_fd: int | None = None
        self.queue = CommitQueue()  # the commits made with later=True

    # ---- opening and closing ----------------------------------------------------------------
    def open(self) -> "RunDir":
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _oserror("create", self.path, exc) from None
        self._lock()
        try:
            self._recover()
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Wait for the commits still being written (their first error raised), then release the lock."""
        try:
            self.drain()
        finally:
            self._release()

    def _release(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None

    def __enter__(self) -> "RunDir":
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()

    def _lock(self) -> None:
        lock = self.path / LOCK
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise _oserror("write in", self.path, exc) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise _oserror("lock", lock, exc) from None
            holder = lock.read_text(errors="replace").strip() or "a process that has not yet written its pid"
            raise PitcheckError(f"{self.path} is in use by another pitcheck ({holder}); wait for it to finish "
                                "or choose another --out") from None
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"pid {os.getpid()} on host {socket.gethostname()}\n".encode())
        except OSError as exc:
            os.close(fd)
            raise _oserror("write in", self.path, exc) from None
        self._lock_fd = fd

    def _recover(self) -> None:
        """Finish or discard a cut-off commit, then check every file against the record."""
        record = self._read_record()
        try:
            for staged in sorted(self.path.glob("*" + STAGED)):
                name = staged.name[: -len(STAGED)]
                if record and record["files"].get(name) == sha256(staged.read_bytes()):
                    os.replace(staged, self.path / name)  # committed, not yet in place: roll forward
                else:
                    staged.unlink()  # never committed: roll back
            _unlink_quietly(self.path / (COMMIT + ".tmp"))
            _fsync_dir(self.path)
        except OSError as exc:
            raise _oserror("recover", self.path, exc) from None
        if record:
            for name, digest in record["files"].items():
                path = self.path / name
                if not path.is_file() or sha256(path.read_bytes()) != digest:
                    what = "is missing" if not path.is_file() else "does not match the last commit"
                    raise PitcheckError(f"{path} {what} (step {record['step']}): it was changed or damaged "
                                        "after pitcheck wrote it; restore it, or pass --force to start over")
        self.record = record

    def _read_record(self) -> dict | None:
        path = self.path / COMMIT
        if not path.exists():
            return None
        try:
            record = json.loads(path.read_text())
            ok = (isinstance(record, dict) and isinstance(record.get("step"), int)
                  and isinstance(record.get("files"), dict)
                  and all(isinstance(k, str) and isinstance(v, str) for k, v in record["files"].items())
                  and set(record["files"]) <= set(RUN_FILES)
                  # the step of the checkpoint a record kept from an earlier commit
                  and (isinstance(record.get("checkpoint_step", 0), int)
                       and 0 <= record.get("checkpoint_step", 0) <= record["step"]))
        except (OSError, UnicodeDecodeError, ValueError):
            ok = False
        if not ok:
            raise PitcheckError(f"{path} is not a commit record pitcheck wrote; pass --force to start over")
        return record

    # ---- what the directory holds -----------------------------------------------------------
    def has(self, name: str) -> bool:
        return (self.path / name).is_file()

    def has_run(self) -> bool:
        """True when a commit or any run file is here (a run of this or an older pitcheck)."""
        return self.record is not None or any(self.has(n) for n in RUN_FILES)

    def foreign_files(self) -> list[str]:
        """Entries that are neither run files nor the store's own."""
        return sorted(p.name for p in self.path.iterdir() if p.name not in RUN_FILES + STORE_FILES)

    def clear(self) -> None:
        """Delete the run (the commit record first: from then on nothing here counts as committed)."""
        try:
            for name in (COMMIT,) + RUN_FILES:
                _unlink_quietly(self.path / name)
            _fsync_dir(self.path)
        except OSError as exc:
            raise _oserror("clear", self.path, exc) from None
        self.record = None

    # ---- committing -------------------------------------------------------------------------
    def commit(self, step: int, files: dict[str, bytes | LaterBytes | None], later: bool = False, **extra) -> None:
        """Replace the run files with these, all or none; a file given as None keeps the last commit's, and
        `extra` adds keys (JSON values) to the commit record. later: return at once and let the process's commit
        thread write them, after every commit made before (drain() waits for them and raises the first error;
        a commit after a failed one is not written, so the directory keeps the last whole commit). A file
        given as LaterBytes is made as its commit is written, on the commit thread for a later one."""
        self.queue.check()
        kept = (self.record or {}).get("files", {})
        held = [name for name, data in files.items() if data is None and name not in kept]
        if held:
            raise PitcheckError(f"{self.path}: {', '.join(held)} cannot be kept: no commit holds it yet")
        record = {"step": int(step), **extra, "files": {
            name: kept[name] if data is None else data if isinstance(data, LaterBytes) else sha256(data)
            for name, data in files.items()}}  # a LaterBytes stands for its digest until it is made
        # a file the last commit already put in place with these bytes stays as it is (a run's manifest, and
        # its events between events): two writes, fsyncs and renames fewer a record
        files = {name: data for name, data in files.items() if kept.get(name) != record["files"][name]}
        if later:
            self.queue.submit(self._write_files, step, record, files)
        else:
            self.drain()
            self._write_files(step, record, files)
        self.record = record

    def drain(self) -> None:
        """Wait until every commit made with later=True is written; raise the first one's error, once (a
        commit after it still raises it)."""
        self.queue.drain()

    def _write_files(self, step: int, record: dict, files: dict[str, bytes | LaterBytes]) -> None:
        later = [d for d in files.values() if isinstance(d, LaterBytes)]
        files = {name: d.made() if isinstance(d, LaterBytes) else d for name, d in files.items()}
        # every LaterBytes a record names is made by now: its own here, a kept one by the commit that made it
        record = {**record, "files": {name: d.digest if isinstance(d, LaterBytes) else d
                                      for name, d in record["files"].items()}}
        _write_commit(self.path, step, record, files)
        for d in later:
            d.data = None

    # ---- reading ----------------------------------------------------------------------------
    def read_manifest(self) -> dict:
        return read_manifest(self.path / MANIFEST)

    def read_checkpoint(self) -> dict:
        return read_checkpoint(self.path / CHECKPOINT)

    def read_metrics(self, columns: list[str] | None = None) -> list[dict]:
        return read_metrics(self.path / METRICS, columns)

    def read_events(self) -> list[dict]:
        return read_events(self.path / EVENTS)


def _write_commit(directory: Path, step: int, record: dict, files: dict[str, bytes]) -> None:
    """Write a commit's files and its record into the run directory: staged, the record's rename the commit point."""
    need = sum(len(d) for d in files.values()) + FREE_SPACE_MARGIN
    try:
        free = shutil.disk_usage(directory).free
    except OSError as exc:
        raise _oserror("stat", directory, exc) from None
    if free < need:
        raise PitcheckError(f"not enough free space in {directory}: the commit of step {step} needs "
                            f"{need / 2**20:.1f} MiB, {free / 2**20:.1f} MiB is free")
    staged = [directory / (name + STAGED) for name in files]
    tmp = directory / (COMMIT + ".tmp")
    try:
        for path, data in zip(staged, files.values()):
            _write_durable(path, data)
        _write_durable(tmp, (json.dumps(record, indent=1, sort_keys=True) + "\n").encode())
        os.replace(tmp, directory / COMMIT)  # the commit point
    except BaseException as exc:
        # before the commit point: this commit never happened
        for path in staged + [tmp]:
            _unlink_quietly(path)
        if isinstance(exc, OSError):
            raise _oserror("write", directory, exc) from None
        raise
    # after it: put the files in place; a cut here is finished by the next open
    try:
        _fsync_dir(directory)
        for path, name in zip(staged, files):
            os.replace(path, directory / name)
        _fsync_dir(directory)
    except OSError as exc:
        raise _oserror("write", directory, exc) from None


# ---- the file formats ---------------------------------------------------------------------------
def npz_bytes(arrays: dict) -> bytes:
    """An .npz as np.savez writes it, but with fixed member timestamps: the same state, the same bytes. A value
    may be a call that gives the array (a device's copy to the host), made here."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zf:
        for name, value in arrays.items():
            value = value() if callable(value) else value
            member = io.BytesIO()
            np.lib.format.write_array(member, np.asanyarray(value), allow_pickle=False)
            zf.writestr(zipfile.ZipInfo(name + ".npy", date_time=(1980, 1, 1, 0, 0, 0)), member.getvalue())
    return buf.getvalue()


def read_checkpoint(path: Path | str) -> dict:
    path = Path(path)
    try:
        ck = np.load(path, allow_pickle=False)
        if not isinstance(ck, np.lib.npyio.NpzFile):  # an .npy gives an array
            raise ValueError("not an .npz archive")
        with ck:
            return {k: ck[k] for k in ck.files}
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as exc:
        raise PitcheckError(f"{path} is not a readable checkpoint ({exc})") from None


def csv_bytes(rows: list[dict]) -> bytes:
    """metrics.csv: every interface metric of every row, and its losses where it has them (else empty);
    the SHARD_COLUMNS only when some row has them (then empty in a row without)."""
    sharded = any(k in r for r in rows for k in SHARD_COLUMNS)
    columns = CSV_COLUMNS if sharded else METRIC_COLUMNS + LOSS_COLUMNS
    optional = OPTIONAL_COLUMNS if sharded else LOSS_COLUMNS
    out = io.StringIO()
    w = csv.DictWriter(out, fieldnames=columns, lineterminator="\n")
    w.writeheader()
    for r in rows:
        cells = {k: (repr(float(r[k])) if k != "step" else int(r[k])) for k in METRIC_COLUMNS}
        cells.update({k: repr(float(r[k])) if k in r else "" for k in optional})
        w.writerow(cells)
    return out.getvalue().encode()


def read_metrics(path: Path | str, columns: list[str] | None = None) -> list[dict]:
    """Rows of a metrics.csv: a 'step' column of increasing integers, every other cell a float; an empty
    loss or shard cell (a source without losses, an unsharded run) is left out of its row.

    With `columns`, the header must be exactly those; with CSV_COLUMNS, the headers without the optional
    columns are accepted too (an unsharded run's, without SHARD_COLUMNS; an older pitcheck's, METRIC_COLUMNS
    alone).
    """
    path = Path(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise PitcheckError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
    reader = csv.DictReader(io.StringIO(text, newline=""))
    if not reader.fieldnames or reader.fieldnames[0] != "step" or len(set(reader.fieldnames)) != len(
            reader.fieldnames):
        raise PitcheckError(f"{path} is not a metrics file: its header does not start with 'step'")
    accepted = [columns] + ([METRIC_COLUMNS + LOSS_COLUMNS, METRIC_COLUMNS] if columns == CSV_COLUMNS else [])
    if columns is not None and reader.fieldnames not in accepted:
        raise PitcheckError(f"{path} does not have pitcheck's metric columns (header {','.join(reader.fieldnames)})")
    rows, last, line = [], -1, 1
    try:
        for line, raw in enumerate(reader, start=2):
            if None in raw or None in raw.values():
                raise ValueError("wrong number of cells")
            row = {k: (int(v) if k == "step" else float(v)) for k, v in raw.items()
                   if not (k in OPTIONAL_COLUMNS and v == "")}
            if row["step"] <= last:
                raise ValueError(f"step {row['step']} does not follow step {last}")
            last = row["step"]
            rows.append(row)
    except (ValueError, csv.Error) as exc:
        raise PitcheckError(f"{path} line {line}: {exc}") from None
    return rows


def events_bytes(events: list[dict]) -> bytes:
    return "".join(_event_line(e) for e in events).encode()


def _event_line(event: dict) -> str:
    return json.dumps(event, sort_keys=True) + "\n"


class EventLines:
    """events_bytes of a run's events, kept between its commits: a run's event list only grows (new dicts
    appended, none changed), so a commit encodes only the events since the last. A stuck run records about
    9400 events over 10^4 steps, and encoding them all again at each record cost up to 48 ms. A list that is
    not the last one extended (another list, a changed or dropped event object) is encoded whole."""

    def __init__(self):
        self.events: list[dict] = []  # the objects encoded (held, so that their ids are not reused)
        self.lines: list[str] = []

    def encode(self, events: list[dict]) -> bytes:
        n = len(self.events)
        if len(events) < n or any(a is not b for a, b in zip(events, self.events)):
            self.events, self.lines, n = [], [], 0
        new = events[n:]
        self.events.extend(new)
        self.lines.extend(map(_event_line, new))
        return "".join(self.lines).encode()


def read_events(path: Path | str) -> list[dict]:
    """Events of an events.jsonl (none if there is no file): JSON objects with a step and an event name."""
    path = Path(path)
    if not path.exists():
        return []
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise PitcheckError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
    events = []
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            e = json.loads(line)
        except ValueError as exc:
            raise PitcheckError(f"{path} line {n} is not JSON ({exc})") from None
        if not (isinstance(e, dict) and type(e.get("step")) is int and e["step"] >= 0
                and isinstance(e.get("event"), str)):
            raise PitcheckError(f"{path} line {n} is not an event (an object with a step and an event name)")
        events.append(e)
    return events


def manifest_bytes(manifest: dict) -> bytes:
    return (json.dumps(manifest, indent=2) + "\n").encode()


def read_manifest(path: Path | str) -> dict:
    path = Path(path)
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise PitcheckError(f"{path} is not a readable manifest ({getattr(exc, 'strerror', None) or exc})") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("config"), dict):
        raise PitcheckError(f"{path} is not a pitcheck manifest: it has no config")
    return manifest
