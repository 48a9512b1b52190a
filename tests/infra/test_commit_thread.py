"""Commits written by the process's commit thread (RunDir.commit(later=True)): in order, the bytes a commit
made at once writes; a failed one raises at drain() and no commit after it is written, so the directory keeps
its last whole commit; a run whose recorded step's commit fails ends with that error and resumes from there
to the numbers of a run never cut; a forked child makes its own thread."""
import errno
import threading

import numpy as np
import pytest

from pitcheck import PitcheckError
from pitcheck.infra import rundir
from pitcheck.infra.rundir import RunDir, npz_bytes
from pitcheck.trajectory import RunConfig, run

FILES = [{"manifest.json": b'{"config": {}}\n', "metrics.csv": b"step\n" + b"".join(b"%d\n" % s for s in range(k + 1)),
          "events.jsonl": b"" if k < 3 else b'{"step": 3}\n', "checkpoint.npz": npz_bytes({"step": np.int64(k)})}
         for k in range(6)]


def contents(d):
    return {n: (d / n).read_bytes() for n in FILES[0]}


def test_later_commits_are_written_in_order_with_the_bytes_of_commits_made_at_once(tmp_path):
    with RunDir(tmp_path / "later") as store:
        for k, files in enumerate(FILES):
            store.commit(k, files, later=True)
        store.drain()
        assert store.record["step"] == 5
    with RunDir(tmp_path / "now") as store:
        for k, files in enumerate(FILES):
            store.commit(k, files)
    assert contents(tmp_path / "later") == contents(tmp_path / "now") == FILES[5]
    for d in ("later", "now"):
        with RunDir(tmp_path / d) as store:
            assert store.record["step"] == 5


def test_the_commit_thread_writes_while_the_caller_goes_on(tmp_path, monkeypatch):
    """commit(later=True) returns before the write; drain() waits for it."""
    release = threading.Event()
    real = rundir._write_durable

    def held(path, data):
        release.wait(10)
        real(path, data)

    with RunDir(tmp_path) as store:
        store.commit(0, FILES[0])
        monkeypatch.setattr(rundir, "_write_durable", held)
        store.commit(1, FILES[1], later=True)  # would block here if it were written at once
        assert contents(tmp_path) == FILES[0]
        release.set()
        store.drain()
        assert contents(tmp_path) == FILES[1]


def test_a_failed_later_commit_raises_at_drain_and_nothing_after_it_is_written(tmp_path, monkeypatch):
    """Commit 2 fails on the thread while 3 and 4 wait behind it: 3 and 4 left out files as kept from 2,
    which never landed, so they must not be written either; the directory stays at commit 1, whole."""
    release = threading.Event()
    real = rundir._write_durable

    def failing(path, data):
        release.wait(10)
        if b"2\n" in data and path.name == "metrics.csv.staged" and b"3\n" not in data:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, data)

    with RunDir(tmp_path) as store:
        store.commit(0, FILES[0])
        store.commit(1, FILES[1])
        monkeypatch.setattr(rundir, "_write_durable", failing)
        for k in (2, 3, 4):
            store.commit(k, FILES[k], later=True)  # none raises yet: the thread has not written 2
        release.set()
        with pytest.raises(PitcheckError, match="No space left on device"):
            store.drain()
        with pytest.raises(PitcheckError, match="No space left on device"):  # and every commit after it
            store.commit(5, FILES[5])
        assert contents(tmp_path) == FILES[1]
        store.drain()  # raised once: closing does not raise it again over whatever the caller raises
    assert not [p for p in tmp_path.iterdir() if p.name.endswith((".staged", ".tmp"))]
    with RunDir(tmp_path) as store:
        assert store.record["step"] == 1


def test_close_waits_for_the_thread_and_raises_its_error(tmp_path, monkeypatch):
    store = RunDir(tmp_path).open()
    store.commit(0, FILES[0])
    monkeypatch.setattr(rundir, "_write_durable", lambda path, data: (_ for _ in ()).throw(OSError(errno.EIO, "EIO")))
    store.commit(1, FILES[1], later=True)
    with pytest.raises(PitcheckError, match="EIO"):
        store.close()
    with RunDir(tmp_path) as again:  # the lock was released all the same
        assert again.record["step"] == 0


def test_a_run_whose_recorded_commit_fails_ends_with_it_and_resumes_to_the_uncut_numbers(tmp_path, monkeypatch):
    config = RunConfig(precision="fp32", retraction="qr", vocab=32, dim=4, steps=200, seed=3)
    run(config, tmp_path / "uncut", progress=False)
    real, calls = rundir._write_durable, []

    def failing(path, data):
        calls.append(path.name)
        if path.name == "checkpoint.npz.staged" and calls.count("checkpoint.npz.staged") == 12:
            raise OSError(errno.EIO, "Input/output error")
        real(path, data)

    monkeypatch.setattr(rundir, "_write_durable", failing)
    with pytest.raises(PitcheckError, match="Input/output error"):
        run(config, tmp_path / "cut", progress=False)
    monkeypatch.setattr(rundir, "_write_durable", real)
    with RunDir(tmp_path / "cut") as store:
        assert 0 < store.record["step"] < 200
    run(config, tmp_path / "cut", resume=True, progress=False)
    for name in ("metrics.csv", "checkpoint.npz", "events.jsonl"):
        assert (tmp_path / "cut" / name).read_bytes() == (tmp_path / "uncut" / name).read_bytes()


def test_a_forked_child_makes_its_own_commit_thread(monkeypatch):
    parent = rundir._committer()
    assert rundir._committer() is parent
    pid = rundir.os.getpid()
    monkeypatch.setattr(rundir.os, "getpid", lambda: pid + 1)  # as a child after fork sees it
    child = rundir._committer()
    assert child is not parent
    assert child.submit(lambda: 7).result(timeout=10) == 7


def test_event_lines_encode_the_new_events_only_and_a_changed_list_whole():
    from pitcheck.infra.rundir import EventLines, events_bytes

    lines = EventLines()
    events = [{"step": 1, "event": "a"}, {"step": 2, "event": "b"}]
    assert lines.encode(events) == events_bytes(events)
    events.append({"step": 3, "event": "c", "x": 1.5})
    assert lines.encode(events) == events_bytes(events) and len(lines.lines) == 3
    resumed = [dict(e) for e in events]  # equal dicts, other objects (a resumed run's list): encoded whole
    assert lines.encode(resumed) == events_bytes(resumed)
    assert lines.encode(resumed[:1]) == events_bytes(resumed[:1])  # a shorter list
    replaced = resumed[:1] + [{"step": 9, "event": "z"}]
    assert lines.encode(replaced) == events_bytes(replaced)  # an object in the middle changed
    other = [replaced[0], {"step": 4, "event": "y"}, {"step": 5, "event": "w"}]  # longer, its second event another
    assert lines.encode(other) == events_bytes(other)
    assert lines.encode([]) == b""


def test_a_stuck_runs_events_file_is_the_encoding_of_its_events(tmp_path):
    """The grid's stuck cell (fp64 cholqr, LM mix, seed 2): its hundreds of events, committed record by record
    through EventLines, are events_bytes of the run's whole list as it holds it."""
    from pitcheck.infra.rundir import events_bytes
    from pitcheck.trajectory import Trajectory

    config = RunConfig(precision="fp64", retraction="cholqr", vocab=128, dim=8, steps=900, seed=2,
                       adversary="dense_output,sparse_input")
    trajectory = Trajectory(config, tmp_path / "r", progress=False)
    trajectory.run()
    assert sum(e.get("action") == "step skipped" for e in trajectory.events) > 100
    assert (tmp_path / "r" / "events.jsonl").read_bytes() == events_bytes(trajectory.events)
