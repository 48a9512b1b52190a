"""`pitcheck run` inputs refused before anything is made, resume that has nothing to resume or whose input
files changed, and the loss columns of metrics.csv."""
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from pitcheck import PitcheckError
from pitcheck.infra.rundir import CSV_COLUMNS, LOSS_COLUMNS, METRIC_COLUMNS, read_metrics
from pitcheck.trajectory import RunConfig, run

SMALL = RunConfig(vocab=32, dim=4, steps=6, records_per_decade=4)


def cli(*argv, cwd=None):
    return subprocess.run([sys.executable, "-m", "pitcheck.cli", *argv], capture_output=True, text=True,
                          timeout=300, cwd=cwd)


@pytest.mark.parametrize("device, message", [("cuda", "numpy backend runs on the CPU only"),
                                             ("cuda:0", "numpy backend runs on the CPU only"),
                                             ("banana", "unknown device 'banana'"),
                                             ("cuda:²", "unknown device")])
def test_numpy_run_refuses_a_device_it_would_not_use_and_creates_nothing(tmp_path, device, message):
    out = tmp_path / "a" / "run"
    proc = cli("run", "--vocab", "32", "--dim", "4", "--steps", "2", "--device", device, "--no-progress",
               "--out", str(out))
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize("field, value, message", [
    ("shadow", "no", "shadow must be true or false"), ("teacher", 5, "teacher must be a string"),
    ("device", 5, "device must be a string"), ("backend", 3, "backend must be a string"),
    ("precision", "fp32", "numpy backend is the float64 reference")])
def test_config_types_are_checked(field, value, message):
    with pytest.raises(PitcheckError, match=message):
        replace(SMALL, **{field: value}).validate()


def test_cuda_asked_for_where_there_is_none_is_refused_before_the_directory(tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    cfg = replace(SMALL, backend="torch", precision="fp32", device="cuda")
    cfg.validate()  # the config itself is fine (a stress file checks it so)
    with pytest.raises(PitcheckError, match="no CUDA device"):
        cfg.validate(here=True)
    with pytest.raises(PitcheckError, match="no CUDA device"):
        run(cfg, tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


def test_resume_of_a_directory_that_does_not_exist_is_refused(tmp_path):
    proc = cli("run", "--vocab", "32", "--dim", "4", "--steps", "2", "--resume", "--no-progress",
               "--out", str(tmp_path / "nothing"))
    assert proc.returncode == 2 and "nothing to resume" in proc.stderr, proc.stderr
    assert not (tmp_path / "nothing").exists()
    # an existing directory a kill left before the first commit still starts (the sweep relies on it)
    (tmp_path / "empty").mkdir()
    assert run(SMALL, tmp_path / "empty", resume=True, progress=False)[-1]["step"] == 6


def test_a_run_refused_after_its_directory_was_made_removes_what_it_made(tmp_path, monkeypatch):
    def refuse(*args):
        raise PitcheckError("refused")

    # the manifest is built after the directory is made and locked (trajectory/loop.py)
    monkeypatch.setattr("pitcheck.trajectory.loop.manifest", refuse)
    with pytest.raises(PitcheckError, match="refused"):
        run(SMALL, tmp_path / "new" / "deeper", progress=False)
    assert not (tmp_path / "new").exists()
    # a directory that was there keeps itself and its files, and gets no lock left behind
    (tmp_path / "mine").mkdir()
    with pytest.raises(PitcheckError, match="refused"):
        run(SMALL, tmp_path / "mine", progress=False)
    assert (tmp_path / "mine").is_dir() and list((tmp_path / "mine").iterdir()) == []
    # a directory already holding a run (and its lock file) keeps all of it
    monkeypatch.undo()
    run(SMALL, tmp_path / "held", progress=False)
    before = sorted(p.name for p in (tmp_path / "held").iterdir())
    with pytest.raises(PitcheckError, match="already holds a run"):
        run(SMALL, tmp_path / "held", progress=False)
    assert sorted(p.name for p in (tmp_path / "held").iterdir()) == before


def test_resume_after_the_teacher_changed_is_refused(tmp_path):
    rng = np.random.default_rng(0)
    teacher = tmp_path / "t.npy"
    np.save(teacher, rng.standard_normal((32, 4)))
    cfg = replace(SMALL, teacher=str(teacher))
    run(cfg, tmp_path / "run", progress=False)
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["teacher_sha256"] and manifest["vocabulary_sha256"] is None
    run(replace(cfg, steps=8), tmp_path / "run", resume=True, progress=False)  # unchanged: resumes
    np.save(teacher, rng.standard_normal((32, 4)))
    with pytest.raises(PitcheckError, match="teacher .* changed since the run started"):
        run(replace(cfg, steps=10), tmp_path / "run", resume=True, progress=False)


# ---- loss columns ---------------------------------------------------------------------------------------
def test_metrics_csv_has_empty_loss_columns_for_a_source_without_losses(tmp_path):
    rows = run(SMALL, tmp_path / "run", progress=False)
    text = (tmp_path / "run" / "metrics.csv").read_text().splitlines()
    # an unsharded run has no shard columns: its header (and bytes) are what they were before them
    assert text[0].split(",") == METRIC_COLUMNS + LOSS_COLUMNS and CSV_COLUMNS[:len(text[0].split(","))] == text[0].split(",")
    assert all(line.endswith(",,,") for line in text[1:])
    assert [set(r) for r in read_metrics(tmp_path / "run" / "metrics.csv")] == [set(METRIC_COLUMNS)] * len(rows)


def test_an_older_directory_without_loss_columns_reads_and_resumes(tmp_path):
    """A run directory of an older pitcheck (header without the loss columns) resumes to what a current one
    resumes to."""
    import shutil

    from pitcheck.infra.rundir import RunDir

    run(SMALL, tmp_path / "new", progress=False)
    shutil.copytree(tmp_path / "new", tmp_path / "old")
    lines = (tmp_path / "old" / "metrics.csv").read_text().splitlines()
    legacy = "".join(line[:-3] + "\n" if n else ",".join(METRIC_COLUMNS) + "\n" for n, line in enumerate(lines))
    with RunDir(tmp_path / "old") as store:
        files = {n: (tmp_path / "old" / n).read_bytes() for n in ("manifest.json", "events.jsonl", "checkpoint.npz")}
        store.commit(6, {**files, "metrics.csv": legacy.encode()})
    # the same rows (repr: the shadow columns of a numpy run are NaN, which == would call different)
    assert repr(read_metrics(tmp_path / "old" / "metrics.csv")) == repr(read_metrics(tmp_path / "new" / "metrics.csv"))
    for d in ("new", "old"):
        run(replace(SMALL, steps=12), tmp_path / d, resume=True, progress=False)
    for f in ("metrics.csv", "events.jsonl", "checkpoint.npz"):
        assert (tmp_path / "new" / f).read_bytes() == (tmp_path / "old" / f).read_bytes(), f


def test_cells_written_before_the_loss_columns_summarise_to_their_committed_numbers(tmp_path):
    """A 12-cell slice of results/compare's cells (written before the loss columns; kept in tests/data since
    results/ no longer holds cell directories) still reads and summarises to the rows of summary.csv
    committed with them: every value equal to 1e-12 relative (the growth fit's last bits follow the BLAS)."""
    from pitcheck.verbs import compare as sw

    root = Path(__file__).resolve().parents[1] / "data" / "compare-before-loss-columns"
    grid_json = json.loads((root / "grid.json").read_text())
    grid = sw.Grid(axes=grid_json["axes"], steps=grid_json["steps"], records_per_decade=grid_json["records_per_decade"],
                   fixed=grid_json["fixed"], description=grid_json["description"], source=grid_json["source"])
    cells = sw.cells(grid)
    assert all(sw.finished(root, c) for c in cells)
    rows = sw.summarise(root, grid, cells)
    committed = sw.read_summary(root / "summary.csv")
    assert len(rows) == len(committed)
    for mine, theirs in zip(rows, committed):
        for k in sw.SUMMARY_COLUMNS:
            if mine["precision"] == "fp64" and k in ("floor", "error_over_floor"):
                # fp64's floor is Householder QR's own rounding error: this machine's LAPACK, not the cells
                continue
            if isinstance(theirs[k], float):
                # the growth fit's last bits follow the machine's BLAS
                assert mine[k] == pytest.approx(theirs[k], rel=1e-12, abs=1e-15, nan_ok=True), (mine["retraction"], k)
            else:
                assert mine[k] == theirs[k], (mine["retraction"], k)


def test_the_python_api_infers_the_backend_from_the_precision_as_the_cli_and_compare_do():
    """RunConfig(precision="bf16") runs on torch (it was refused: the numpy default needed backend="torch"
    spelled out, while compare inferred it); fp64 stays on the numpy reference; an explicit choice stands."""
    assert RunConfig().backend == "numpy"
    assert RunConfig(precision="bf16").backend == "torch"
    assert RunConfig(precision="fp64", backend="torch").backend == "torch"
    RunConfig(precision="bf16", vocab=16, dim=2).validate()
    with pytest.raises(PitcheckError, match="numpy backend"):
        RunConfig(precision="bf16", backend="numpy").validate()
