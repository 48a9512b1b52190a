"""A large state's checkpoint is written only while checkpoints stay a small share of the run: a record in
between commits its rows and keeps the last checkpoint, and a resume from such a commit goes on from that
checkpoint, recomputing the rows after it bit for bit. Small states are checkpointed at every record."""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from pitcheck.infra.errors import PitcheckError
from pitcheck.infra.rundir import RunDir
from pitcheck.trajectory import RunConfig
from pitcheck.trajectory import loop
from pitcheck.trajectory.config import recorded_steps
from pitcheck.trajectory.loop import run
from pitcheck.trajectory.step import Lockstep

CFG = RunConfig(vocab=128, dim=6, steps=300, optimizer="momentum", retraction="cayley", adversary="gaussian,nonfinite")


class Killed(BaseException):
    """Stands for a SIGKILL: nothing of the loop's own handling runs."""


def commit_record(out):
    return json.loads((out / "commit.json").read_text())


def killed_at(step, monkeypatch, out, config=CFG):
    """Run `config` into `out` until the step `step` would be taken, as if the process died there."""
    real = Lockstep.step

    def dying(self, grads, shadow_grads, at):
        if at == step:
            raise Killed
        return real(self, grads, shadow_grads, at)

    monkeypatch.setattr(Lockstep, "step", dying)
    with pytest.raises(Killed):
        run(config, out, progress=False)
    monkeypatch.setattr(Lockstep, "step", real)


def test_records_between_checkpoints_keep_the_last_and_a_resume_recomputes_their_rows(tmp_path, monkeypatch):
    run(CFG, tmp_path / "whole", progress=False)
    assert (tmp_path / "whole" / "events.jsonl").read_text().count("nonfinite_gradient") > 5  # events to recompute
    assert "checkpoint_step" not in commit_record(tmp_path / "whole")  # a small state: every record checkpoints
    # every state counts as large, and no checkpoint is ever due by time: only the first and the last are taken
    monkeypatch.setattr(loop, "LARGE_CHECKPOINT_BYTES", 0)
    monkeypatch.setattr(loop, "CHECKPOINT_SHARE", 0.0)
    killed_at(250, monkeypatch, tmp_path / "cut")
    record = commit_record(tmp_path / "cut")
    last = max(s for s in recorded_steps(300, CFG.records_per_decade) if s < 250)  # the last record before 250
    assert record["checkpoint_step"] == 0 and record["step"] == last
    with np.load(tmp_path / "cut" / "checkpoint.npz") as ck:
        assert int(ck["step"]) == 0
    assert (tmp_path / "cut" / "metrics.csv").read_text().splitlines()[-1].startswith(f"{last},")
    # the commit holds rows up to its own step, past the checkpoint's: fewer --steps would drop them
    with pytest.raises(PitcheckError, match=f"it holds a run at step {last}; give --steps >= {last}"):
        run(replace(CFG, steps=last - 1), tmp_path / "cut", resume=True, progress=False)
    run(CFG, tmp_path / "cut", resume=True, progress=False)
    for name in ("metrics.csv", "events.jsonl"):
        assert (tmp_path / "cut" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes()
    with np.load(tmp_path / "whole" / "checkpoint.npz") as a, np.load(tmp_path / "cut" / "checkpoint.npz") as b:
        assert int(b["step"]) == 300 and all(np.array_equal(a[k], b[k]) for k in a.files)
    assert "checkpoint_step" not in commit_record(tmp_path / "cut")  # the last record checkpoints


def test_a_checkpoint_is_due_once_its_cost_is_the_share_of_the_time_since(monkeypatch):
    monkeypatch.setattr(loop, "LARGE_CHECKPOINT_BYTES", 100)
    clock = [1000.0]
    monkeypatch.setattr(loop.time, "monotonic", lambda: clock[0])
    cadence = loop.CheckpointCadence()
    cadence.taken(started=999.0, state_bytes=100)  # 1 s for a large state
    clock[0] = 1019.0  # 1 s of checkpoint in 19 s: over 5%
    assert not cadence.due(first=False, last=False)
    assert cadence.due(first=True, last=False) and cadence.due(first=False, last=True)
    clock[0] = 1020.0
    assert cadence.due(first=False, last=False)
    cadence.taken(started=1020.0, state_bytes=99)  # a small state: every record
    assert cadence.due(first=False, last=False)


def test_a_commit_record_whose_kept_checkpoint_is_not_the_files_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(loop, "LARGE_CHECKPOINT_BYTES", 0)
    monkeypatch.setattr(loop, "CHECKPOINT_SHARE", 0.0)
    killed_at(250, monkeypatch, tmp_path / "cut")
    record = commit_record(tmp_path / "cut")
    record["checkpoint_step"] = 100  # a record that says another checkpoint is kept: the rows past 0 mix states
    (tmp_path / "cut" / "commit.json").write_text(json.dumps(record))
    with pytest.raises(PitcheckError, match="rows after step 0, the checkpoint's"):
        run(CFG, tmp_path / "cut", resume=True, progress=False)
    record["checkpoint_step"] = 999  # past the record's own step: not a record pitcheck writes
    (tmp_path / "cut" / "commit.json").write_text(json.dumps(record))
    with pytest.raises(PitcheckError, match="not a commit record pitcheck wrote"):
        run(CFG, tmp_path / "cut", resume=True, progress=False)


def test_a_file_can_be_kept_only_from_a_commit(tmp_path):
    store = RunDir(tmp_path / "d")
    store.open()
    try:
        with pytest.raises(PitcheckError, match="checkpoint.npz cannot be kept: no commit holds it yet"):
            store.commit(1, {"checkpoint.npz": None, "metrics.csv": b"step\n"})
    finally:
        store.close()
