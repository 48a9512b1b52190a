"""Trajectories: the run directory, recomputation from the checkpoint, resume, bad input."""
import json
from dataclasses import replace

import numpy as np
import pytest

from pitcheck import PitcheckError, cli
from pitcheck.model import heads
from pitcheck.numerics import metrics, reference
from pitcheck.infra.progress import Progress
from pitcheck.infra.rundir import METRIC_COLUMNS, read_events, read_metrics
from pitcheck.trajectory import RunConfig, recorded_steps, run

U = 2.0**-53


def test_recorded_steps_are_log_spaced_with_ends():
    s = recorded_steps(1000, 10)
    assert s[0] == 0 and s[-1] == 1000 and s == sorted(set(s))
    assert 25 <= len(s) <= 35
    assert recorded_steps(0, 10) == [0]


def test_run_writes_directory_and_last_row_matches_checkpoint(tmp_path):
    cfg = RunConfig(vocab=1024, dim=32, steps=300, retraction="qr", seed=3)
    rows = run(cfg, tmp_path)
    for name in ("manifest.json", "metrics.csv", "events.jsonl", "checkpoint.npz"):
        assert (tmp_path / name).exists()
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["config"]["seed"] == 3 and manifest["versions"]["numpy"]
    assert rows[-1]["step"] == 300
    with np.load(tmp_path / "checkpoint.npz") as ck:
        Z, L, step = ck["Z"], ck["L"], int(ck["step"])
    assert step == 300
    # a clean float64 run crosses no threshold and skips no step: the events file stays empty
    assert read_events(tmp_path / "events.jsonl") == []
    again = metrics.interface_metrics(Z, L, reference.embedding_matrix(Z, L), U)
    last = read_metrics(tmp_path / "metrics.csv")[-1]
    for key in METRIC_COLUMNS[1:-3]:
        assert last[key] == pytest.approx(again[key], rel=1e-12, abs=0), key


@pytest.mark.parametrize("retraction", ["qr", "polar", "cayley"])
def test_fp64_retractions_keep_orthonormality_and_none_drifts(tmp_path, retraction):
    rows = run(RunConfig(vocab=1024, dim=32, steps=300, retraction=retraction), tmp_path / retraction)
    assert max(r["orthonormality"] for r in rows) < 1e-12
    none = run(RunConfig(vocab=1024, dim=32, steps=300, retraction="none"), tmp_path / "none")
    assert none[-1]["orthonormality"] > 1e-6


class _Interrupt:
    """Stand-in gradient stream that raises KeyboardInterrupt once, at a given step."""

    def __init__(self, at):
        self.at, self.real = at, heads.gradient

    def __call__(self, names, Z, L, seed, step, params, probe=None, stream=0):
        if step == self.at:
            self.at = None
            raise KeyboardInterrupt
        return self.real(names, Z, L, seed, step, params, probe, stream)


@pytest.mark.parametrize("backend,precision", [("numpy", "fp64"), ("torch", "bf16-mixed"), ("torch", "fp16")])
def test_interrupted_run_resumes_with_identical_results(tmp_path, monkeypatch, backend, precision):
    cfg = RunConfig(backend=backend, precision=precision, vocab=200, dim=8, steps=120, optimizer="adam",
                    retraction="cayley", adversary="gaussian,spike", device="cpu")
    full = run(cfg, tmp_path / "full")
    monkeypatch.setattr(heads, "gradient", _Interrupt(at=57))  # the heads compute the models' gradients
    with pytest.raises(PitcheckError, match="interrupted at step 57"):
        run(cfg, tmp_path / "cut")
    with np.load(tmp_path / "cut" / "checkpoint.npz") as ck:
        assert int(ck["step"]) == 57
    resumed = run(cfg, tmp_path / "cut", resume=True)
    assert (tmp_path / "full" / "metrics.csv").read_bytes() == (tmp_path / "cut" / "metrics.csv").read_bytes()
    assert [r["step"] for r in resumed] == [r["step"] for r in full]
    with np.load(tmp_path / "full" / "checkpoint.npz") as a, np.load(tmp_path / "cut" / "checkpoint.npz") as b:
        assert all(np.array_equal(a[k], b[k]) for k in a.files)


def test_same_command_gives_same_numbers(tmp_path):
    cfg = RunConfig(vocab=300, dim=8, steps=50, adversary="dense_output,heavy_tail", optimizer="momentum")
    run(cfg, tmp_path / "a")
    run(cfg, tmp_path / "b")
    assert (tmp_path / "a" / "metrics.csv").read_bytes() == (tmp_path / "b" / "metrics.csv").read_bytes()


def test_resume_refuses_a_different_config_and_overwrite_refuses(tmp_path):
    cfg = RunConfig(vocab=100, dim=4, steps=10)
    run(cfg, tmp_path)
    with pytest.raises(PitcheckError, match="config differs in retraction"):
        run(replace(cfg, retraction="polar"), tmp_path, resume=True)
    with pytest.raises(PitcheckError, match="already holds a run"):
        run(cfg, tmp_path)
    # a longer run may continue a shorter one
    rows = run(replace(cfg, steps=20), tmp_path, resume=True)
    assert rows[-1]["step"] == 20


def test_an_extended_run_has_a_fresh_runs_values_at_every_step_both_record(tmp_path):
    """The rows up to the old length follow its schedule (and keep its last step); those after, the new
    length's: the steps recorded differ from a fresh run's where a length is not a power of ten, the values at
    a step both record do not."""
    cfg = RunConfig(vocab=32, dim=4, steps=100, adversary="gaussian", retraction="qr", seed=3)
    run(cfg, tmp_path / "extended")
    run(replace(cfg, steps=300), tmp_path / "extended", resume=True)
    run(replace(cfg, steps=300), tmp_path / "fresh")
    extended, fresh = ({r["step"]: r for r in read_metrics(tmp_path / d / "metrics.csv")} for d in ("extended", "fresh"))
    assert sorted(extended) == sorted({*recorded_steps(100, cfg.records_per_decade),
                                       *(s for s in recorded_steps(300, cfg.records_per_decade) if s > 100)})
    assert sorted(fresh) == recorded_steps(300, cfg.records_per_decade) != sorted(extended)
    common = set(extended) & set(fresh)
    assert len(common) > 10 and {100, 300} <= set(extended)
    for step in common:
        for key, value in fresh[step].items():
            assert extended[step][key] == value or (value != value and extended[step][key] != extended[step][key]), (step, key)


def test_nonfinite_gradients_are_recorded_and_skipped(tmp_path):
    cfg = RunConfig(vocab=100, dim=4, steps=200, adversary="nonfinite", retraction="qr")
    rows = run(cfg, tmp_path)
    events = [e for e in read_events(tmp_path / "events.jsonl") if e["event"] == "nonfinite_gradient"]
    assert 2 <= len(events) <= 25  # p = 0.05 of 200 steps
    assert all(np.isfinite(r["orthonormality"]) for r in rows)
    assert rows[-1]["orthonormality"] < 1e-12


def test_conditioning_attack_raises_cond_and_records_crossings(tmp_path):
    cfg = RunConfig(vocab=100, dim=6, steps=300, adversary="conditioning", lr=0.05)
    rows = run(cfg, tmp_path)
    assert rows[-1]["cond_T"] > 100 * rows[0]["cond_T"]
    crossed = [e for e in read_events(tmp_path / "events.jsonl") if e["event"] == "threshold_crossed"]
    assert any(e["metric"] == "cond_T" for e in crossed)


def test_adaptive_adversary_runs(tmp_path):
    rows = run(RunConfig(vocab=100, dim=4, steps=20, adversary="adaptive", retraction="cayley"), tmp_path)
    assert rows[-1]["step"] == 20 and np.isfinite(rows[-1]["pinv_drift"])


def test_reproject_threshold_fires_events(tmp_path):
    cfg = RunConfig(vocab=200, dim=6, steps=100, retraction="none", reproject_threshold=1e-6, lr=0.05)
    rows = run(cfg, tmp_path)
    assert any(e["event"] == "reprojected" for e in read_events(tmp_path / "events.jsonl"))
    assert max(r["orthonormality"] for r in rows) < 1e-6
    # a threshold above anything the run reaches never fires
    run(replace(cfg, reproject_threshold=10.0), tmp_path / "loose")
    assert not any(e["event"] == "reprojected" for e in read_events(tmp_path / "loose" / "events.jsonl"))


@pytest.mark.parametrize("argv,message", [
    (["run", "--vocab", "10", "--dim", "32"], "V=10 < D=32"),
    (["run", "--retraction", "householder"], "unknown retraction"),
    (["run", "--adversary", "gaussian,nope"], "unknown gradient model"),
    (["run", "--lr", "nan"], "--lr must be"),
    (["run", "--backend", "numpy", "--precision", "bf16"], "numpy backend is the float64 reference"),
    (["run", "--steps", "-3"], "--steps must be"),
])
def test_cli_bad_input_is_one_line(tmp_path, capsys, argv, message):
    assert cli.main(argv + ["--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("pitcheck: error:") and message in err and "\n" not in err


@pytest.mark.parametrize("given, backend", [
    (["--precision", "fp32"], "torch"),  # inferred as compare infers it: no --backend needed
    (["--precision", "bf16"], "torch"),
    ([], "numpy"),  # fp64, the default: the numpy reference
    (["--precision", "fp64", "--backend", "torch"], "torch"),  # an explicit backend is kept
])
def test_cli_run_infers_the_backend_from_the_precision(tmp_path, given, backend):
    import json

    out = tmp_path / "run"
    argv = ["run", "--vocab", "32", "--dim", "4", "--steps", "3", "--device", "cpu", "--no-progress", *given]
    assert cli.main(argv + ["--out", str(out)]) == 0
    assert json.loads((out / "manifest.json").read_text())["config"]["backend"] == backend


def test_cli_run_prints_summary(tmp_path, capsys):
    assert cli.main(["run", "--vocab", "64", "--dim", "4", "--steps", "5", "--out", str(tmp_path)]) == 0
    assert "step 5: orthonormality" in capsys.readouterr().out


def test_progress_bar_draws_when_enabled(capsys):
    p = Progress(10, "demo", enabled=True)
    p.update(10)
    p.update(10)  # the loop and the run's end both report the last step: drawn once
    assert capsys.readouterr().err.count("demo [") == 1
    quiet = Progress(10, "quiet", enabled=False)
    quiet.update(10)
    assert capsys.readouterr().err == ""


def test_reproject_every_bounds_the_drift_of_no_retraction(tmp_path):
    cfg = RunConfig(vocab=200, dim=6, steps=200, retraction="none", lr=0.05)
    free = run(cfg, tmp_path / "free")
    guarded = run(replace(cfg, reproject_every=1), tmp_path / "every1")
    sparse = run(replace(cfg, reproject_every=50), tmp_path / "every50")
    assert free[-1]["orthonormality"] > 1e-4
    assert max(r["orthonormality"] for r in guarded) < 1e-13
    at_200 = [r for r in sparse if r["step"] == 200][0]  # 200 is a multiple of 50: just re-projected
    assert at_200["orthonormality"] < 1e-13 < max(r["orthonormality"] for r in sparse)


def test_teacher_start_is_its_polar_factor(tmp_path, capsys):
    rng = np.random.default_rng(0)
    teacher = rng.standard_normal((120, 6)) @ np.diag([1, 2, 3, 4, 5, 6.0])
    np.save(tmp_path / "teacher.npy", teacher)
    assert cli.main(["run", "--teacher", str(tmp_path / "teacher.npy"), "--steps", "0",
                     "--out", str(tmp_path / "run")]) == 0
    with np.load(tmp_path / "run" / "checkpoint.npz") as ck:
        Z = ck["Z"]
    assert Z.shape == (120, 6)
    assert np.allclose(Z, reference.polar_memory(teacher), atol=1e-14)
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert len(manifest["teacher_sha256"]) == 64
    # a shape that contradicts the teacher, an unreadable file, a rank-deficient teacher: one-line errors
    assert cli.main(["run", "--teacher", str(tmp_path / "teacher.npy"), "--vocab", "100",
                     "--out", str(tmp_path / "a")]) == 2
    assert "not V x D" in capsys.readouterr().err
    assert cli.main(["run", "--teacher", str(tmp_path / "missing.npy"), "--out", str(tmp_path / "b")]) == 2
    assert "cannot read teacher" in capsys.readouterr().err
    np.save(tmp_path / "flat.npy", np.ones((50, 4)))
    assert cli.main(["run", "--teacher", str(tmp_path / "flat.npy"), "--out", str(tmp_path / "c")]) == 2
    assert "rank deficient" in capsys.readouterr().err


def test_real_ctrl_c_checkpoints_and_resumes_identically(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    args = ["run", "--vocab", "256", "--dim", "8", "--steps", "20000", "--optimizer", "momentum",
            "--retraction", "cayley", "--no-progress"]
    code = "import sys; from pitcheck.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.Popen([sys.executable, "-c", code, *args, "--out", str(tmp_path / "cut")],
                            stderr=subprocess.PIPE, text=True)
    ck, csv = tmp_path / "cut" / "checkpoint.npz", tmp_path / "cut" / "metrics.csv"
    deadline = time.monotonic() + 60
    # wait until the run is stepping (a few recorded steps), then interrupt it somewhere mid-run
    while time.monotonic() < deadline and not (csv.exists() and len(csv.read_text().splitlines()) > 5):
        time.sleep(0.05)
    time.sleep(0.3)
    os.kill(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "checkpoint saved" in err
    with np.load(ck) as c:
        stopped_at = int(c["step"])
    assert 0 < stopped_at < 20000
    cfg = RunConfig(vocab=256, dim=8, steps=stopped_at + 300, optimizer="momentum", retraction="cayley")
    run(cfg, tmp_path / "cut", resume=True)
    run(cfg, tmp_path / "full")
    with np.load(tmp_path / "full" / "checkpoint.npz") as a, np.load(ck) as b:
        assert all(np.array_equal(a[k], b[k]) for k in a.files)
