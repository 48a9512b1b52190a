"""The run directory store: commits all or nothing, recovery from a cut commit, the lock, strict readers."""
import errno
import json

import numpy as np
import pytest

from pitcheck import PitcheckError
from pitcheck.infra import rundir
from pitcheck.infra.rundir import RunDir, npz_bytes, read_checkpoint, read_events, read_manifest, read_metrics

FILES_1 = {"manifest.json": b'{"config": {}}\n', "metrics.csv": b"step\n0\n", "events.jsonl": b"",
           "checkpoint.npz": npz_bytes({"step": np.int64(1)})}
FILES_2 = {**FILES_1, "metrics.csv": b"step\n0\n2\n", "checkpoint.npz": npz_bytes({"step": np.int64(2)})}


def contents(d):
    return {n: (d / n).read_bytes() for n in FILES_1}


def assert_reopens_at_step_2(d):
    with RunDir(d) as store:
        assert store.record["step"] == 2
    assert contents(d) == FILES_2


def test_commit_then_reopen(tmp_path):
    with RunDir(tmp_path) as store:
        assert not store.has_run() and store.foreign_files() == []
        store.commit(1, FILES_1)
        store.commit(2, FILES_2)
    with RunDir(tmp_path) as store:
        assert store.record["step"] == 2 and store.has_run()
    assert contents(tmp_path) == FILES_2
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*FILES_1, "commit.json", ".lock"])


@pytest.mark.parametrize("fail_at", range(4))
def test_a_failed_commit_leaves_the_previous_one_and_no_stray_file(tmp_path, monkeypatch, fail_at):
    with RunDir(tmp_path) as store:
        store.commit(1, FILES_1)
        calls = []
        real = rundir._write_durable

        def failing(path, data):
            calls.append(path)
            if len(calls) == fail_at + 1:
                raise OSError(errno.EIO, "Input/output error")
            real(path, data)

        monkeypatch.setattr(rundir, "_write_durable", failing)
        if fail_at < 3:  # the two files that changed staged, then the record
            with pytest.raises(PitcheckError, match="Input/output error"):
                store.commit(2, FILES_2)
            assert contents(tmp_path) == FILES_1
        else:
            store.commit(2, FILES_2)
            assert contents(tmp_path) == FILES_2
    assert not [p for p in tmp_path.iterdir() if p.name.endswith((".staged", ".tmp"))]


def test_a_commit_rewrites_only_the_files_that_changed(tmp_path, monkeypatch):
    """The manifest and events of FILES_2 are FILES_1's: staged, synced and renamed again they would cost a
    record two writes; they stay in place, and the record still names all four (reopening checks them)."""
    with RunDir(tmp_path) as store:
        written = []
        real = rundir._write_durable
        monkeypatch.setattr(rundir, "_write_durable", lambda path, data: (written.append(path.name), real(path, data)))
        store.commit(1, FILES_1)
        assert sorted(written) == sorted([n + ".staged" for n in FILES_1] + ["commit.json.tmp"])
        written.clear()
        store.commit(2, FILES_2)
        assert sorted(written) == ["checkpoint.npz.staged", "commit.json.tmp", "metrics.csv.staged"]
        assert sorted(store.record["files"]) == sorted(FILES_1)
    assert_reopens_at_step_2(tmp_path)


def test_a_file_damaged_since_the_last_commit_is_still_refused_when_it_was_not_rewritten(tmp_path):
    with RunDir(tmp_path) as store:
        store.commit(1, FILES_1)
        (tmp_path / "manifest.json").write_bytes(b"{}\n")  # changed behind pitcheck's back
        store.commit(2, FILES_2)  # the manifest's bytes are the last commit's: not rewritten
    with pytest.raises(PitcheckError, match="manifest.json does not match the last commit"):
        RunDir(tmp_path).open()


def test_a_commit_cut_before_its_record_is_rolled_back(tmp_path):
    with RunDir(tmp_path) as store:
        store.commit(1, FILES_1)
    for name, data in FILES_2.items():  # staged, never committed
        (tmp_path / (name + ".staged")).write_bytes(data)
    (tmp_path / "commit.json.tmp").write_text("{")
    with RunDir(tmp_path) as store:
        assert store.record["step"] == 1
    assert contents(tmp_path) == FILES_1
    assert not [p for p in tmp_path.iterdir() if p.name.endswith((".staged", ".tmp"))]


def test_a_commit_cut_after_its_record_is_rolled_forward(tmp_path, monkeypatch):
    with RunDir(tmp_path) as store:
        store.commit(1, FILES_1)
        real_replace = rundir.os.replace
        moves = []

        def cut(src, dst):  # the record goes in, then the process dies after one rename
            moves.append(dst)
            if len(moves) == 3:
                raise KeyboardInterrupt
            real_replace(src, dst)

        monkeypatch.setattr(rundir.os, "replace", cut)
        with pytest.raises(KeyboardInterrupt):
            store.commit(2, FILES_2)
        monkeypatch.undo()
    assert_reopens_at_step_2(tmp_path)


def test_a_changed_file_or_record_is_refused(tmp_path):
    with RunDir(tmp_path) as store:
        store.commit(1, FILES_1)
    (tmp_path / "metrics.csv").write_bytes(b"step\n0\n1\n")
    with pytest.raises(PitcheckError, match="metrics.csv does not match the last commit"):
        RunDir(tmp_path).open()
    (tmp_path / "metrics.csv").unlink()
    with pytest.raises(PitcheckError, match="metrics.csv is missing"):
        RunDir(tmp_path).open()
    (tmp_path / "commit.json").write_text("[1, 2]")
    with pytest.raises(PitcheckError, match="not a commit record"):
        RunDir(tmp_path).open()


def test_the_lock_names_its_holder_and_is_released(tmp_path):
    first = RunDir(tmp_path).open()
    with pytest.raises(PitcheckError, match=r"in use by another pitcheck \(pid \d+ on host "):
        RunDir(tmp_path).open()
    first.close()
    RunDir(tmp_path).open().close()


def test_clear_removes_the_run_and_nothing_else(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with RunDir(tmp_path) as store:
        store.commit(1, FILES_1)
        assert store.foreign_files() == ["notes.txt"]
        store.clear()
        assert not store.has_run() and store.record is None
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock", "notes.txt"]


def test_checkpoint_bytes_depend_on_the_state_only():
    arrays = {"Z": np.arange(6.0).reshape(3, 2), "step": np.int64(4)}
    assert npz_bytes(arrays) == npz_bytes({k: v.copy() for k, v in arrays.items()})


def test_readers_refuse_what_pitcheck_did_not_write(tmp_path):
    p = tmp_path / "f"
    for data in (b"", b"\x00\xff garbage", b"PK\x03\x04broken zip"):
        p.write_bytes(data)
        with pytest.raises(PitcheckError, match="not a readable checkpoint"):
            read_checkpoint(p)
        with pytest.raises(PitcheckError, match="not a readable manifest|not a pitcheck manifest"):
            read_manifest(p)
    np.save(tmp_path / "a.npy", np.ones(3))
    with pytest.raises(PitcheckError, match="not a readable checkpoint"):
        read_checkpoint(tmp_path / "a.npy")
    for text, match in [("", "not a metrics file"), ("x,y\n1,2\n", "not a metrics file"),
                        ("step,a\n0,1\n0,2\n", "does not follow"), ("step,a\n0,1\n1\n", "wrong number of cells"),
                        ("step,a\n0,zz\n", "line 2"), ("step,a\n0,1,2\n", "wrong number of cells")]:
        p.write_text(text)
        with pytest.raises(PitcheckError, match=match):
            read_metrics(p)
    p.write_text("step,a\n0,nan\n3,inf\n")
    assert [r["step"] for r in read_metrics(p)] == [0, 3]  # NaN and inf are values a run may record
    for text in ("{", "[1]", '{"step": -1, "event": "x"}', '{"step": 1.5, "event": "x"}', '{"step": 1}'):
        p.write_text(text + "\n")
        with pytest.raises(PitcheckError, match="line 1"):
            read_events(p)
    p.write_text(json.dumps({"config": []}))
    with pytest.raises(PitcheckError, match="no config"):
        read_manifest(p)
    p.write_bytes(b"\xff\xfe")
    with pytest.raises(PitcheckError, match="cannot read"):
        read_metrics(p)


def test_out_paths(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("x")
    for bad, match in [("", "is empty"), (tmp_path / "file", "is a file"), (tmp_path / "file" / "sub", "is a file")]:
        with pytest.raises(PitcheckError, match=match):
            rundir.check_out_path(bad)
    monkeypatch.setattr(rundir.os, "access", lambda p, mode: False)
    with pytest.raises(PitcheckError, match="not writable"):
        rundir.check_out_path(tmp_path / "new")


# ---- write_atomic and output paths: replace regular files only ---------------------------------------
def _null_device(tmp_path):
    """A character device like /dev/null, made in tmp_path (never the machine's own)."""
    import os
    import stat

    node = tmp_path / "null"
    try:
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        with open(node, "wb"):
            pass
    except OSError as exc:  # not root, or a file system mounted nodev
        pytest.skip(f"cannot make a device node here: {exc.strerror}")
    return node


def test_write_atomic_writes_a_device_in_place(tmp_path, monkeypatch):
    import os
    import stat

    node = _null_device(tmp_path)
    rundir.write_atomic(node, b"swallowed")
    assert stat.S_ISCHR(os.stat(node).st_mode) and not (tmp_path / "null.tmp").exists()
    # /dev is not writable by users; /dev/null is: a device is judged by itself, not by its directory
    monkeypatch.setattr(rundir.os, "access", lambda p, mode: os.path.samefile(p, node))
    assert rundir.check_out_file(node, "--json") == node


def test_write_atomic_writes_a_fifo_in_place(tmp_path):
    import os
    import stat

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader waiting, so opening to write does not block
    try:
        rundir.write_atomic(fifo, b"through the pipe\n")
        assert stat.S_ISFIFO(os.stat(fifo).st_mode)
        assert os.read(reader, 100) == b"through the pipe\n"
    finally:
        os.close(reader)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]


def test_write_atomic_through_a_link_replaces_its_target_and_keeps_the_link(tmp_path):
    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "r.json"
    target.write_text("old")
    link = tmp_path / "r.json"
    link.symlink_to(target)
    rundir.write_atomic(link, b"new")
    assert link.is_symlink() and target.read_bytes() == b"new"
    dangling = tmp_path / "d.json"
    dangling.symlink_to(tmp_path / "real" / "created.json")
    rundir.write_atomic(dangling, b"made")
    assert dangling.is_symlink() and (tmp_path / "real" / "created.json").read_bytes() == b"made"
    # a link into a directory that does not exist is refused before the work, like the path itself
    broken = tmp_path / "b.json"
    broken.symlink_to(tmp_path / "missing" / "x.json")
    with pytest.raises(PitcheckError, match="does not exist"):
        rundir.check_out_file(broken, "--json")
    with pytest.raises(PitcheckError, match="is a directory"):
        rundir.write_atomic(tmp_path / "real", b"x")


@pytest.mark.parametrize("redirect", ["pipe", "file"])
def test_write_atomic_to_stdout_goes_through_the_stream_in_order(tmp_path, redirect):
    """/dev/stdout (here a link to /proc/self/fd/1 in tmp_path: never the machine's /dev) is written through
    the process's stdout, after what it printed before, whether stdout is a pipe or a file."""
    import subprocess
    import sys

    link = tmp_path / "stdout"
    link.symlink_to("/proc/self/fd/1")
    code = ("import sys; from pitcheck.infra.rundir import write_atomic, check_out_file; print('table', flush=False); "
            f"check_out_file({str(link)!r}); write_atomic({str(link)!r}, b'json\\n'); print('summary')")
    if redirect == "pipe":
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True).stdout
    else:
        with open(tmp_path / "out.txt", "wb") as f:
            subprocess.run([sys.executable, "-c", code], stdout=f, check=True)
        out = (tmp_path / "out.txt").read_bytes()
    assert out == b"table\njson\nsummary\n"
    assert link.is_symlink()


def test_distinct_outputs(tmp_path):
    import os

    (tmp_path / "sub").mkdir()
    (tmp_path / "r").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "r")
    for a, b in [("r", "r"), ("r", "sub/../r"), ("r", "link"), ("new", "sub/../new")]:
        with pytest.raises(PitcheckError, match="--report .* names the file --json writes"):
            rundir.check_distinct_outputs([("--json", tmp_path / a), ("--report", tmp_path / b)])
    rundir.check_distinct_outputs([("--json", tmp_path / "r"), ("--report", tmp_path / "new"), ("--junit", None)])
    os.mkfifo(tmp_path / "fifo")  # written in place: nothing is replaced, so it may take two outputs
    rundir.check_distinct_outputs([("--json", tmp_path / "fifo"), ("--report", tmp_path / "fifo")])
