"""A record's checkpoint is made by the commit thread: the state's arrays are handed over as calls (on CUDA
their copies to pinned host memory start at once, on a stream of their own), and the thread makes the
archive, its digest and the files while the run steps on. The bytes are those the run itself would make; a
large state's next checkpoint waits until the last one is made, and its cost counts the thread's seconds."""
from __future__ import annotations

import json
import threading
from dataclasses import replace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from pitcheck.infra import rundir  # noqa: E402
from pitcheck.infra.rundir import LaterBytes, RunDir, npz_bytes, sha256  # noqa: E402
from pitcheck.model.backend import ArrayBackend  # noqa: E402
from pitcheck.numerics.policy import get_policy  # noqa: E402
from pitcheck.trajectory import RunConfig, checkpoint, loop  # noqa: E402
from pitcheck.trajectory.loop import CheckpointCadence, run  # noqa: E402
from pitcheck.trajectory.step import Lockstep  # noqa: E402

CFG = RunConfig(vocab=64, dim=4, steps=60, precision="bf16-mixed", backend="torch", device="cpu",
                gradient_stream="counter")


def test_a_records_checkpoint_is_made_on_the_commit_thread_with_the_bytes_made_at_once(tmp_path, monkeypatch):
    made_on = []
    real = checkpoint.npz_bytes

    def watched(arrays):
        made_on.append(threading.current_thread().name)
        return real(arrays)

    monkeypatch.setattr(checkpoint, "npz_bytes", watched)
    run(CFG, tmp_path / "run", progress=False)
    assert made_on and all(name.startswith("pitcheck-commit") for name in made_on)
    # the same state's archive made at once, on this thread, is the same bytes
    pair = Lockstep(CFG)
    with np.load(tmp_path / "run" / "checkpoint.npz") as ck:
        pair.load({k: ck[k] for k in ck.files})
    at_once = real(pair.arrays(int(60)))
    assert (tmp_path / "run" / "checkpoint.npz").read_bytes() == at_once
    record = json.loads((tmp_path / "run" / "commit.json").read_text())
    assert record["files"]["checkpoint.npz"] == sha256(at_once)


def test_later_arrays_are_calls_that_give_the_arrays_given_at_once():
    pair = Lockstep(replace(CFG, steps=3))
    for s in range(3):
        pair.step(*pair.gradients(["gaussian"], s, None), s)
    now, later = pair.arrays(3), pair.arrays(3, later=True)
    assert now.keys() == later.keys()
    assert any(callable(v) for v in later.values())
    for k, v in later.items():
        got = v() if callable(v) else v
        assert np.asarray(got).dtype == np.asarray(now[k]).dtype and np.array_equal(got, now[k]), k
    assert npz_bytes(later) == npz_bytes(now)


@pytest.mark.parametrize("layout", ["rows", "columns", "permuted", "strided", "empty"])
def test_the_host_buffer_of_a_copy_is_laid_out_as_a_copy_at_once_so_the_archive_is_the_same(layout):
    from pitcheck.model.backend import host_buffer_like

    x = {"rows": torch.randn(5, 3), "columns": torch.randn(5, 3).T, "permuted": torch.randn(4, 5, 3).permute(2, 0, 1),
         "strided": torch.randn(6, 4)[::2], "empty": torch.randn(0, 3)}[layout]
    buffer = host_buffer_like(x)
    buffer.copy_(x)
    at_once = x.to("cpu", torch.float64)
    assert buffer.to(torch.float64).stride() == at_once.stride()
    assert npz_bytes({"a": buffer.to(torch.float64).numpy()}) == npz_bytes({"a": at_once.numpy()})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned copies on a CUDA stream need a GPU")
def test_a_cuda_host_copy_overlaps_and_gives_numpys_array():
    arrays = ArrayBackend("torch", get_policy("bf16-mixed"), "cuda")
    for x in (torch.randn(4096, 64, device="cuda").to(torch.bfloat16), torch.randn(64, 4096, device="cuda").T):
        later = arrays.host_copy(x)
        at_once = arrays.numpy(x)
        x = x * 2  # the step after: a new tensor; the copy is of the one handed over
        got = later()
        assert got.dtype == np.float64 and np.array_equal(got * 2, arrays.numpy(x))
        assert npz_bytes({"a": got}) == npz_bytes({"a": at_once})  # the same layout: the same archive


def test_a_later_file_is_made_when_written_and_its_bytes_then_dropped(tmp_path):
    store = RunDir(tmp_path / "d")
    store.open()
    calls = []
    data = LaterBytes(lambda: calls.append(1) or b"state")
    store.commit(1, {"checkpoint.npz": data, "metrics.csv": b"rows"}, later=True)
    store.commit(2, {"checkpoint.npz": None, "metrics.csv": b"more rows"}, later=True)  # keeps it
    store.drain()
    assert calls == [1] and data.digest == sha256(b"state") and data.data is None and data.make is None
    assert data.seconds is not None and data.seconds >= 0
    record = json.loads((tmp_path / "d" / "commit.json").read_text())
    assert record["files"] == {"checkpoint.npz": sha256(b"state"), "metrics.csv": sha256(b"more rows")}
    assert (tmp_path / "d" / "checkpoint.npz").read_bytes() == b"state"
    store.close()


def test_a_failing_later_file_leaves_the_last_whole_commit(tmp_path):
    store = RunDir(tmp_path / "d")
    store.open()
    store.commit(1, {"checkpoint.npz": b"one", "metrics.csv": b"rows"})

    def broken():
        raise OSError(28, "No space left on device")

    store.commit(2, {"checkpoint.npz": LaterBytes(broken), "metrics.csv": b"more"}, later=True)
    with pytest.raises(OSError):
        store.drain()
    record = json.loads((tmp_path / "d" / "commit.json").read_text())
    assert record["step"] == 1 and (tmp_path / "d" / "checkpoint.npz").read_bytes() == b"one"
    store.close()


def test_a_large_states_next_checkpoint_waits_until_the_last_is_made(monkeypatch):
    cadence = CheckpointCadence()
    pending = LaterBytes(lambda: b"x")
    cadence.taken(0.0, loop.LARGE_CHECKPOINT_BYTES, pending)
    monkeypatch.setattr(loop, "CHECKPOINT_SHARE", 1e9)  # any time since would be enough, were it made
    assert cadence.seconds is None and not cadence.due(first=False, last=False)
    assert cadence.due(first=False, last=True) and cadence.due(first=True, last=False)
    pending.made()
    cadence.at -= 1.0  # a second since the checkpoint: the test does not hang on how fast these lines run
    assert cadence.seconds >= cadence.main_seconds and cadence.due(first=False, last=False)
    # its cost counts the thread's seconds: a slow one makes the next wait longer
    pending.seconds = 1e6
    monkeypatch.setattr(loop, "CHECKPOINT_SHARE", 0.05)
    assert not cadence.due(first=False, last=False)
    small = CheckpointCadence()
    small.taken(0.0, 10, LaterBytes(lambda: b""))
    assert small.due(first=False, last=False)  # a small state: every record


def test_the_commit_thread_copes_with_the_run_finishing_first(tmp_path, monkeypatch):
    # every record's checkpoint is a large one, made slowly: the run's end drains them all, in order
    monkeypatch.setattr(loop, "LARGE_CHECKPOINT_BYTES", 0)
    real = checkpoint.npz_bytes
    gate = threading.Event()

    def slow(arrays):
        gate.wait(0.05)
        return real(arrays)

    monkeypatch.setattr(checkpoint, "npz_bytes", slow)
    run(CFG, tmp_path / "slow", progress=False)
    monkeypatch.setattr(checkpoint, "npz_bytes", real)
    monkeypatch.setattr(loop, "LARGE_CHECKPOINT_BYTES", 64 * 2**20)
    run(CFG, tmp_path / "plain", progress=False)
    for name in ("checkpoint.npz", "metrics.csv", "events.jsonl"):
        assert (tmp_path / "slow" / name).read_bytes() == (tmp_path / "plain" / name).read_bytes()
    assert rundir.sha256((tmp_path / "slow" / "checkpoint.npz").read_bytes()) == json.loads(
        (tmp_path / "slow" / "commit.json").read_text())["files"]["checkpoint.npz"]
