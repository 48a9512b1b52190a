"""Where the float64 shadow runs (trajectory/step.py, shadow_engine_placement): numpy float64 on the CPU,
torch float64 on the model's CUDA device. Without a GPU the torch float64 shadow is forced on the CPU by
monkeypatching the placement function; a torch shadow must then give the numpy shadow's metrics to float64
rounding, the model's numbers unchanged, and checkpoints, resumes (in-process and after SIGKILL) and batches
that give the numbers of an uninterrupted torch-shadow run."""
from __future__ import annotations

import json
import signal

import numpy as np
import pytest
import torch

from pitcheck.infra.rundir import read_metrics
from pitcheck.trajectory import RunConfig, run
from pitcheck.trajectory import step as step_module
from pitcheck.trajectory.step import Lockstep, shadow_engine_placement
from tests.hostile import test_kills
from tests.trajectory.test_batched import alone_and_batched, four_cells
from tests.trajectory.test_trajectory import _Interrupt

TORCH_SHADOW = ("torch", "cpu")
# Adam (its moments and bias correction), qr, two adversaries, a spike: every part of a step the shadow takes
CFG = RunConfig(backend="torch", precision="fp32", vocab=256, dim=16, steps=200, optimizer="adam", retraction="qr",
                adversary="gaussian,spike", device="cpu")
SHADOW_COLUMNS = ("shadow_Z", "shadow_T")
# the CLI with the placement patched, for the SIGKILL test's subprocesses (a monkeypatch does not cross exec)
PATCHED_CLI = ("import sys; import pitcheck.trajectory.step as s; s.shadow_engine_placement = lambda c: "
               "('torch', 'cpu'); from pitcheck.cli import main; sys.exit(main(sys.argv[1:]))")


@pytest.fixture
def torch_shadow(monkeypatch):
    """Runs built while this fixture is active step a torch float64 shadow on the CPU."""
    monkeypatch.setattr(step_module, "shadow_engine_placement", lambda config: TORCH_SHADOW)


def _rows_and_checkpoint(out):
    with np.load(out / "checkpoint.npz") as ck:
        arrays = {k: ck[k] for k in ck.files}
    return read_metrics(out / "metrics.csv"), arrays


# ---- (c) the placement itself ---------------------------------------------------------------------------
def test_placement_is_numpy_on_cpu_and_torch_on_the_models_cuda_device(monkeypatch):
    from dataclasses import replace

    assert shadow_engine_placement(CFG.resolve()) == ("numpy", "cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # nothing runs on CUDA here
    assert shadow_engine_placement(replace(CFG, device="cuda").resolve()) == ("torch", "cuda")
    assert shadow_engine_placement(replace(CFG, device="cuda:1").resolve()) == ("torch", "cuda:1")
    assert shadow_engine_placement(replace(CFG, device="auto", vocab=4096).resolve()) == ("torch", "cuda")
    assert shadow_engine_placement(replace(CFG, device="auto").resolve()) == ("numpy", "cpu")  # 256 x 16: 'auto' keeps it on the CPU
    assert shadow_engine_placement(replace(CFG, device="cpu").resolve()) == ("numpy", "cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert shadow_engine_placement(replace(CFG, device="auto").resolve()) == ("numpy", "cpu")


def test_the_lockstep_builds_the_shadow_the_placement_names(torch_shadow):
    pair = Lockstep(CFG)
    assert (pair.shadow.backend, pair.shadow.device) == TORCH_SHADOW
    assert pair.shadow.policy.name == "fp64" and pair.shadow_description == "torch float64 on cpu"


def test_the_manifest_says_where_the_shadow_ran(tmp_path, monkeypatch):
    from dataclasses import replace

    small = replace(CFG, steps=3)
    run(small, tmp_path / "numpy", progress=False)
    run(replace(small, shadow=False), tmp_path / "none", progress=False)
    monkeypatch.setattr(step_module, "shadow_engine_placement", lambda config: TORCH_SHADOW)
    run(small, tmp_path / "torch", progress=False)
    said = {d: json.loads((tmp_path / d / "manifest.json").read_text())["shadow"] for d in ("numpy", "none", "torch")}
    assert said == {"numpy": "numpy float64 on cpu", "none": None, "torch": "torch float64 on cpu"}


# ---- (a) a torch shadow measures what the numpy shadow measures -------------------------------------------
def test_torch_shadow_metrics_agree_with_the_numpy_shadows(tmp_path, monkeypatch):
    """Both shadows are float64 trajectories of the same steps from the same start on the same gradients
    (the model's, which do not depend on the shadow): they differ only by the rounding of two float64
    libraries (MKL/OpenBLAS QR and GEMM against torch's), so:

    - every column not read from the shadow, and the model's checkpoint arrays, are bit-identical;
    - the two shadow states differ by float64 rounding accumulated over 200 steps: ||S_t - S_n|| / ||S_n||
      <= 1e-12 for master Z and raw L (measured: about 1e-15; 200 steps x u = 2.2e-14, and 1e-12 leaves a
      margin for Adam's division by sqrt(v) amplifying early differences, while a wrong step is >= 1e-8);
    - by the triangle inequality |shadow_Z(t) - shadow_Z(n)| <= ||Zs_t - Zs_n|| / ||Zs|| (to first order),
      so shadow_Z and shadow_T agree to 1e-12 absolute, i.e. to about 1e-6 relative at their values of
      1e-7 .. 1e-6 (measured: 2e-16 absolute, 1e-9 relative at worst). A shadow that took one step
      differently moves them by about lr x ||step|| / ||Z|| ~ 1e-4 .. 1e-3, eight orders above the bound.
    """
    run(CFG, tmp_path / "numpy", progress=False)
    monkeypatch.setattr(step_module, "shadow_engine_placement", lambda config: TORCH_SHADOW)
    run(CFG, tmp_path / "torch", progress=False)
    (rows_n, ck_n), (rows_t, ck_t) = _rows_and_checkpoint(tmp_path / "numpy"), _rows_and_checkpoint(tmp_path / "torch")
    assert [r["step"] for r in rows_n] == [r["step"] for r in rows_t] and rows_n[-1]["step"] == 200
    for rn, rt in zip(rows_n, rows_t):
        for key in rn:
            if key in SHADOW_COLUMNS:
                assert abs(rn[key] - rt[key]) <= 1e-12, (rn["step"], key, rn[key], rt[key])
                assert rt[key] == pytest.approx(rn[key], rel=1e-6), (rn["step"], key)
            else:
                assert rn[key] == rt[key] or (rn[key] != rn[key] and rt[key] != rt[key]), (rn["step"], key)
    assert ck_n.keys() == ck_t.keys()  # a numpy shadow's checkpoint and a torch shadow's hold the same arrays
    for key in ck_n:
        if key.startswith("shadow_") and ck_n[key].dtype.kind == "f" and ck_n[key].ndim:
            dist = np.linalg.norm(ck_t[key] - ck_n[key]) / max(np.linalg.norm(ck_n[key]), 1e-300)
            assert dist <= 1e-12, (key, dist)
        else:
            assert np.array_equal(ck_n[key], ck_t[key]), key
    assert max(r["shadow_Z"] for r in rows_t) > 1e-7  # fp32 moved away from its shadow: the bound is not vacuous


# ---- (b) checkpoints and resumes of a torch shadow -------------------------------------------------------
def test_torch_shadow_run_interrupted_and_resumed_is_byte_identical(tmp_path, monkeypatch, torch_shadow):
    from pitcheck import PitcheckError
    from pitcheck.model import heads

    full = run(CFG, tmp_path / "full", progress=False)
    monkeypatch.setattr(heads, "gradient", _Interrupt(at=57))
    with pytest.raises(PitcheckError, match="interrupted at step 57"):
        run(CFG, tmp_path / "cut", progress=False)
    monkeypatch.undo()  # the placement too: put it back for the resume
    monkeypatch.setattr(step_module, "shadow_engine_placement", lambda config: TORCH_SHADOW)
    resumed = run(CFG, tmp_path / "cut", resume=True, progress=False)
    assert [r["step"] for r in resumed] == [r["step"] for r in full]
    for name in ("metrics.csv", "events.jsonl", "checkpoint.npz"):
        assert (tmp_path / "full" / name).read_bytes() == (tmp_path / "cut" / name).read_bytes(), name


def test_torch_shadow_run_killed_by_sigkill_resumes_byte_identical(tmp_path, monkeypatch):
    argv = ["run", "--backend", "torch", "--precision", "fp32", "--device", "cpu", "--vocab", "256", "--dim", "8",
            "--steps", "300", "--optimizer", "adam", "--retraction", "qr", "--adversary", "gaussian,spike",
            "--no-progress"]
    monkeypatch.setattr(test_kills, "CLI", PATCHED_CLI)
    checked = []

    def check(ref, out):
        test_kills.assert_same_run(ref, out)
        assert json.loads((out / "manifest.json").read_text())["shadow"] == "torch float64 on cpu"
        checked.append(out)

    counts = test_kills.kill_and_resume(argv, tmp_path / "cut", 3, signal.SIGKILL, 5, ["--resume"], check)
    assert counts["kills"] == 3 and checked


def test_a_batch_with_torch_shadows_writes_the_files_of_its_runs_alone(tmp_path, torch_shadow):
    outcomes, files = alone_and_batched(four_cells("fp32", "qr"), tmp_path)
    assert [o.batched_steps for o in outcomes] == [12] * 4
    for alone, batched in files:
        assert alone == batched
    manifest = json.loads((tmp_path / "batch0" / "manifest.json").read_text())
    assert manifest["shadow"] == "torch float64 on cpu"


# ---- what else reads or steps the shadow: skipped steps, undo on breakdown, a stateful source --------------
def test_a_torch_shadow_skips_the_steps_the_model_skips(tmp_path, torch_shadow):
    cfg = RunConfig(backend="torch", precision="fp16", device="cpu", vocab=256, dim=16, steps=40, optimizer="adam",
                    adversary="gaussian,spike,nonfinite")
    rows = run(cfg, tmp_path, progress=False)
    with np.load(tmp_path / "checkpoint.npz") as ck:
        assert int(ck["engine_opt_step"]) == int(ck["shadow_opt_step"]) < 40
    assert rows[-1]["shadow_Z"] < 0.05


def test_undo_puts_a_torch_shadow_back_when_its_step_breaks_down(torch_shadow, monkeypatch):
    from pitcheck.model.engine import StateBreakdown

    pair = Lockstep(CFG)
    grads, shadow_grads = pair.gradients(["gaussian"], 0, None)
    before = (pair.engine.state_dict(), pair.shadow.state_dict())
    real = pair.shadow.step

    def moves_then_breaks(g, step):  # the shadow's state moves, then its step breaks down
        real(g, step)
        raise StateBreakdown("planted", "T")

    monkeypatch.setattr(pair.shadow, "step", moves_then_breaks)
    with pytest.raises(StateBreakdown, match="the float64 shadow: planted"):
        pair.step(grads, shadow_grads, 0)
    for engine, saved in zip((pair.engine, pair.shadow), before):
        after = engine.state_dict()
        assert after.keys() == saved.keys() and all(np.array_equal(after[k], saved[k]) for k in saved)
    monkeypatch.undo()
    monkeypatch.setattr(step_module, "shadow_engine_placement", lambda config: TORCH_SHADOW)
    pair.step(grads, shadow_grads, 0)  # and the step then goes as a clean one does
    assert pair.shadow.opt_step == pair.engine.opt_step == 1


def test_lm_source_with_a_torch_shadow_gives_the_numpy_shadows_losses(tmp_path, monkeypatch):
    """The lm source builds a body for the shadow too and steps it on the same batches (add_gradients,
    _advance_source): the model's columns are bit-identical; shadow_Z and shadow_T agree to 1e-12 absolute, the
    bound of test_torch_shadow_metrics_agree_with_the_numpy_shadows (measured: 1.6e-16, i.e. 2e-9 relative at
    distances of 1e-7); the shadow body's held-out loss (about 5.5 nats) to 1e-12 relative (measured: equal)."""
    from tests.sources.test_lm import lm_config

    cfg = lm_config()
    run(cfg, tmp_path / "numpy", progress=False)
    monkeypatch.setattr(step_module, "shadow_engine_placement", lambda config: TORCH_SHADOW)
    run(cfg, tmp_path / "torch", progress=False)
    rows_n, rows_t = read_metrics(tmp_path / "numpy" / "metrics.csv"), read_metrics(tmp_path / "torch" / "metrics.csv")
    assert len(rows_n) == len(rows_t) and "shadow_heldout_loss" in rows_t[-1]
    for rn, rt in zip(rows_n, rows_t):
        for key in rn:
            if key in SHADOW_COLUMNS:
                assert abs(rn[key] - rt[key]) <= 1e-12, (rn["step"], key, rn[key], rt[key])
            elif key == "shadow_heldout_loss":
                assert rt[key] == pytest.approx(rn[key], rel=1e-12, abs=0), (rn["step"], key)
            else:
                assert rn[key] == rt[key] or (rn[key] != rn[key] and rt[key] != rt[key]), (rn["step"], key)
