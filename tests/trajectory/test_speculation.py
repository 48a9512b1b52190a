"""A run that defers its step checks (pitcheck.trajectory.speculation, on by default on CUDA) writes the files of
a run that answers each at once: rows, events at their exact steps, checkpoint and breakdown, interrupted and
resumed, bit for bit. Here on CPU tensors, with the choice forced; its steps read nothing from the device
between settles, and a settle reads once per engine."""
from __future__ import annotations

import json
import os
import signal
from dataclasses import replace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.overrides import TorchFunctionMode  # noqa: E402

from pitcheck.infra.errors import PitcheckError  # noqa: E402
from pitcheck.numerics.arrays import TorchOps  # noqa: E402
from pitcheck.numerics.deferred_checks import DeferredChecks  # noqa: E402
from pitcheck.trajectory import RunConfig, loop, speculation, step as step_module  # noqa: E402
from pitcheck.trajectory.loop import RunBreakdown, RunInterrupted, Trajectory  # noqa: E402
from pitcheck.trajectory.step import Lockstep  # noqa: E402
from pitcheck.trajectory.speculation import Speculation  # noqa: E402

# the CPU everywhere; CUDA too where torch sees a GPU (scripts/gpu_check.sh runloop runs this file there)
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
BASE = RunConfig(vocab=96, dim=6, steps=100, precision="fp32", backend="torch", device="cpu",
                 gradient_stream="counter", optimizer="adam", lr=1e-2)


def torch_shadow(monkeypatch):
    """The shadow as on CUDA: torch float64 on the model's device, deferring its checks too."""
    monkeypatch.setattr(step_module, "shadow_engine_placement", lambda plan: ("torch", plan.device))


def injected(monkeypatch, at: dict):
    """The counter stream with this step's gradient changed where `at` names a change: 'nan' (an entry of
    G_Z), 'inf' (of G_L), or a factor for G_Z ('Z', f) or G_L ('L', f). Both runs of a comparison see it."""
    real = Lockstep.gradients

    def changed(self, names, step, probe):
        grads, shadow = real(self, names, step, probe)
        change = at.get(step)
        if change == "nan":
            grads = {**grads, "Z": grads["Z"].clone()}
            grads["Z"][3, 1] = float("nan")
        elif change == "inf":
            grads = {**grads, "L": grads["L"].clone()}
            grads["L"][2, 0] = float("inf")
        elif change:
            part, factor = change
            grads = {**grads, part: grads[part] * factor}
        return grads, shadow

    monkeypatch.setattr(Lockstep, "gradients", changed)


def files(out):
    with np.load(out / "checkpoint.npz") as ck:
        arrays = {k: ck[k].copy() for k in ck.files}
    return (out / "metrics.csv").read_bytes(), (out / "events.jsonl").read_bytes(), arrays


def same_files(a, b):
    (rows_a, events_a, ck_a), (rows_b, events_b, ck_b) = files(a), files(b)
    assert rows_a == rows_b
    assert events_a == events_b
    assert ck_a.keys() == ck_b.keys() and all(np.array_equal(ck_a[k], ck_b[k]) for k in ck_a)


def run_both(config, tmp_path, monkeypatch, expect=None):
    """The config run answering every check at once and then speculating; each run's error (or None) and the
    speculating run's number of retakes."""
    outcomes = []
    for name, defers in (("eager", False), ("deferred", True)):
        monkeypatch.setattr(loop, "speculates", lambda plan, backend, defers=defers: defers)
        trajectory = Trajectory(config, tmp_path / name, progress=False)
        error = None
        try:
            trajectory.run()
        except PitcheckError as exc:
            error = str(exc).replace(str(tmp_path / name), "OUT")
        outcomes.append((error, trajectory.speculation))
    (eager_error, none), (deferred_error, spec) = outcomes
    assert none is None and isinstance(spec, Speculation)
    assert eager_error == deferred_error
    if expect:
        assert expect in (eager_error or "")
    same_files(tmp_path / "eager", tmp_path / "deferred")
    return spec.retakes


CASES = {
    # nothing to retake: the deferred checks all held; else one retake per failing step
    "clean": ({}, {}, None, 0),
    # a NaN and an inf gradient: admission skips the step (nonfinite_gradient at exactly these steps)
    "nonfinite gradients": ({7: "nan", 40: "inf", 41: "nan", 90: "nan"}, {}, None, 4),
    # fp16 gradients overflowing under loss scaling: skipped, the scale halved, recorded at their steps
    "fp16 overflow": ({12: ("Z", 1e4), 13: ("Z", 1e4), 70: ("L", 1e5)}, {"precision": "fp16-mixed"}, None, 3),
    # a tangent step too large for fp32's matmuls: the step is skipped as non-finite before the retraction
    "nonfinite step": ({30: ("Z", 1e38)}, {"optimizer": "sgd", "lr": 30.0}, None, 1),
    # cholqr2 on the same stream: its Cholesky factorisations are deferred checks too
    "cholqr2 with events": ({5: "nan", 64: "inf"}, {"retraction": "cholqr2"}, None, 2),
    "polar-gram with events": ({5: "nan", 64: "inf"}, {"retraction": "polar-gram"}, None, 2),
    # placements cast on the device: a delayed recipe's amax histories go back with the state, stochastic
    # rounding redraws its seeded noise on a retake
    "delayed fp8 moments with events": ({5: "nan", 64: "inf"}, {"precision": "fp8-adam-delayed"}, None, 2),
    # ... and a delayed logits GEMM's L's waiting on the device, read every 32 steps, through the retakes
    "delayed fp8 logits with events": ({5: "nan", 40: "nan", 64: "inf"}, {"precision": "fp8-logits-delayed"}, None, 3),
    "nvfp4 stochastic gradients with events": ({5: "nan", 64: "inf"}, {"precision": "nvfp4-grad-sr"}, None, 2),
    # L's diagonal driven through zero: the run ends in a breakdown at that step, its last good state kept
    "breakdown": ({55: ("L", 1e9)}, {"optimizer": "sgd", "lr": 1.0}, "broke down at step 56", 1),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES)
def test_a_speculating_run_writes_the_files_of_a_run_that_answers_each_check_at_once(case, device, tmp_path,
                                                                                     monkeypatch):
    at, change, expect, retakes = CASES[case]
    torch_shadow(monkeypatch)
    injected(monkeypatch, at)
    config = replace(BASE, device=device, **change)
    assert run_both(config, tmp_path, monkeypatch, expect) == retakes
    if at and not expect:
        steps = {json.loads(line)["step"] for line in (tmp_path / "eager" / "events.jsonl").read_text().splitlines()
                 if "step skipped" in line}
        assert steps == {s + 1 for s in at}  # each event at the step it happened, in both runs


def test_a_loss_scale_that_grows_between_settles_judges_each_step_at_its_own_scale(tmp_path, monkeypatch):
    from pitcheck.model import amp

    # the scale doubles every 3 clean steps, so fp16 gradients overflow every few steps and the scale moves
    # between a step and its settle: a step judged at the later scale would be retaken though it fitted
    monkeypatch.setattr(amp, "LOSS_SCALE_GROWTH_INTERVAL", 3)
    retakes = run_both(replace(BASE, precision="fp16-mixed", steps=60), tmp_path, monkeypatch)
    overflows = {json.loads(line)["step"] for line in (tmp_path / "eager" / "events.jsonl").read_text().splitlines()
                 if "gradient_overflow" in line}
    assert len(overflows) > 5 and retakes == len(overflows)


def test_a_step_that_answers_a_check_at_once_while_deferring_is_retaken_alone(tmp_path, monkeypatch):
    # numpy gradients are judged on the host as they come: their events arrive during a deferred stretch, whose
    # earlier steps all held, so only the step with the event is retaken
    config = replace(BASE, gradient_stream="numpy", adversary="gaussian,nonfinite", steps=120)
    retaken = []
    real = loop.Trajectory._step
    monkeypatch.setattr(loop.Trajectory, "_step", lambda self, *a: retaken.append(self.step) or real(self, *a))
    retakes = run_both(config, tmp_path, monkeypatch)
    skipped = {json.loads(line)["step"] - 1 for line in (tmp_path / "eager" / "events.jsonl").read_text().splitlines()
               if "nonfinite_gradient" in line}
    assert len(skipped) > 2 and retakes == len(skipped)
    deferred_run = retaken[120:]  # the first 120 were the run answering every check
    assert sorted(deferred_run) == sorted(skipped)


def test_a_run_whose_every_step_is_skipped_ends_as_when_answered_at_once(tmp_path, monkeypatch):
    injected(monkeypatch, {s: "nan" for s in range(6)})
    assert run_both(replace(BASE, steps=6), tmp_path, monkeypatch, "none of the 6 steps was applied") == 6


def test_without_a_shadow_and_across_many_settles(tmp_path, monkeypatch):
    injected(monkeypatch, {3: "nan", 100: "inf", 101: "inf", 199: "nan"})
    assert run_both(replace(BASE, steps=200, shadow=False), tmp_path, monkeypatch) == 4


def interrupted_run(config, out, monkeypatch, at: int = 45, defers: bool = True):
    """Run `config` into `out` with SIGINT arriving as the step `at` is drawn; the run's error."""
    real = Lockstep.gradients

    def interrupting(self, names, step, probe):
        if step == at:
            os.kill(os.getpid(), signal.SIGINT)
        return real(self, names, step, probe)

    monkeypatch.setattr(loop, "speculates", lambda plan, backend: defers)
    with monkeypatch.context() as m:
        m.setattr(Lockstep, "gradients", interrupting)
        with pytest.raises(PitcheckError) as error:
            loop.run(config, out, progress=False)
    return error.value


@pytest.mark.parametrize("failing", [None, 40])
def test_an_interrupted_speculating_run_checkpoints_the_step_it_reached_and_resumes_to_the_same_files(
        failing, tmp_path, monkeypatch):
    # the signal comes between two records (40, 50), with the failing step among the deferred ones
    torch_shadow(monkeypatch)
    injected(monkeypatch, {failing: "nan"} if failing else {})
    for name, defers in (("eager-cut", False), ("cut", True)):
        error = interrupted_run(BASE, tmp_path / name, monkeypatch, defers=defers)
        assert isinstance(error, RunInterrupted) and "interrupted at step 46 " in str(error)
        with np.load(tmp_path / name / "checkpoint.npz") as ck:
            assert int(ck["step"]) == 46  # the step it reached: deferred steps that failed were retaken first
    same_files(tmp_path / "cut", tmp_path / "eager-cut")
    loop.run(BASE, tmp_path / "cut", resume=True, progress=False)
    monkeypatch.setattr(loop, "speculates", lambda plan, backend: False)
    loop.run(BASE, tmp_path / "eager", progress=False)
    same_files(tmp_path / "cut", tmp_path / "eager")


def test_a_breakdown_among_the_deferred_steps_ends_an_interrupted_run_as_it_would_have(tmp_path, monkeypatch):
    # L's diagonal through zero at step 42, the signal at 45: a run answering each check never reached it
    injected(monkeypatch, {42: ("L", 1e9)})
    config = replace(BASE, optimizer="sgd", lr=1.0)
    errors = [str(interrupted_run(config, tmp_path / name, monkeypatch, defers=defers)).replace(
        str(tmp_path / name), "OUT") for name, defers in (("eager", False), ("deferred", True))]
    assert errors[0] == errors[1] and "broke down at step 43" in errors[0]
    same_files(tmp_path / "eager", tmp_path / "deferred")


class HostReads(TorchFunctionMode):
    """Counts the calls that bring a tensor's value to the host."""
    READS = {"item", "__bool__", "__float__", "__int__", "tolist", "numpy", "cpu"}

    def __init__(self):
        super().__init__()
        self.reads = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in self.READS:
            self.reads.append(func.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("retraction", ["qr", "cholqr2", "polar-gram"])
def test_deferred_steps_read_nothing_from_the_device_and_a_settle_reads_once_per_engine(retraction, device,
                                                                                        monkeypatch):
    # the reads pitcheck makes (torch's own convergence checks inside an SVD or eigh are not among them)
    torch_shadow(monkeypatch)
    pair = Lockstep(replace(BASE, retraction=retraction, device=device))
    spec = Speculation(pair)
    eager = HostReads()
    with eager:  # the same step answering each check: the reads the deferral saves
        pair.step(*pair.gradients(["gaussian"], 0, None), 0)
    assert len(eager.reads) >= 7
    reads = HostReads()
    with reads:
        for s in range(1, 11):
            assert spec.takes(s)
            grads, shadow_grads = pair.gradients(["gaussian"], s, None)
            assert spec.step(grads, shadow_grads, s) == s + 1
    assert reads.reads == []
    with reads:
        assert spec.settle(11) == 11
    assert reads.reads == ["tolist", "tolist"]  # the model's checks, the shadow's
    assert spec.retakes == 0 and all(not c.kept for c in spec.checks)


@pytest.mark.parametrize("precision", ["fp8-adam", "fp8-adam-delayed", "nvfp4-grad", "nvfp4-grad-sr", "fp8-store",
                                       "nvfp4-store", "fp8-gathered-z", "fp8-logits-delayed"])
def test_a_placements_deferred_steps_read_nothing_either(precision, monkeypatch):
    """The placements' casts run on the device: gradients, moments (a delayed recipe's history and scale
    included) and the copies of Z and L; a stochastic rounding's noise goes to the device, not back; a delayed
    logits GEMM's L's wait there (quantisers.PENDING_FORWARDS steps at most)."""
    torch_shadow(monkeypatch)
    pair = Lockstep(replace(BASE, precision=precision))
    spec = Speculation(pair)
    reads = HostReads()
    with reads:
        for s in range(6):
            assert spec.takes(s)
            grads, shadow_grads = pair.gradients(["gaussian"], s, None)
            assert spec.step(grads, shadow_grads, s) == s + 1
    assert reads.reads == []


def test_a_failed_deferred_check_takes_the_run_back_to_its_settled_state(monkeypatch):
    pair = Lockstep(replace(BASE, shadow=False))
    spec = Speculation(pair)
    injected(monkeypatch, {4: "nan"})
    start = {k: v.clone() for k, v in pair.engine.master.items()}
    for s in range(8):
        assert spec.takes(s)
        assert spec.step(*pair.gradients(["gaussian"], s, None), s) == s + 1
    assert spec.settle(8) == 0  # back at the first deferred step
    assert spec.retakes == 1 and spec.retake_until == 5  # steps 0..4 answered at once, then deferred again
    assert all(torch.equal(pair.engine.master[k], start[k]) for k in start)
    assert not spec.takes(4) and spec.takes(5)


def test_deferred_checks_judge_each_kept_value_by_its_rule_and_name_the_first_failing_step():
    checks = DeferredChecks()
    assert checks.settle() is None
    for step, ok in ((3, True), (4, False), (5, False)):
        checks.step = step
        checks.keep(torch.tensor(ok))
    checks.step = 2
    checks.keep(torch.tensor([1.0, 2.0]), lambda v: max(v) < 2.0)
    assert checks.settle() == 2 and checks.kept == []
    checks.keep(torch.tensor([1.0, float("nan")]), lambda v: all(x == x for x in v))
    assert checks.settle() == 2


def test_torch_ops_defer_their_checks_with_the_same_verdicts():
    ops = TorchOps()
    bad = torch.tensor([[1.0, 0.0], [0.0, float("inf")]])
    not_pd = torch.tensor([[1.0, 2.0], [2.0, 1.0]], dtype=torch.float64)
    pd = torch.tensor([[4.0, 2.0], [2.0, 3.0]], dtype=torch.float64)
    eager = (ops.isfinite_all(bad), ops.all_true(torch.tensor([True, False])))
    assert eager == (False, False)
    with pytest.raises(torch.linalg.LinAlgError):
        ops.cholesky(not_pd)
    ops.checks.deferring = True
    for step, check in enumerate([lambda: ops.isfinite_all(bad), lambda: ops.all_true(torch.tensor([True, False])),
                                  lambda: ops.cholesky(not_pd) is not None, lambda: ops.isfinite_all(torch.ones(0))]):
        ops.checks.step = step
        assert check()  # holds for now
    assert ops.checks.settle() == 0
    ops.checks.step = 9
    assert torch.equal(ops.cholesky(pd), torch.linalg.cholesky(pd)) and ops.isfinite_all(pd)
    assert ops.checks.settle() is None
    for step in (1, 2):
        ops.checks.step = step
        ops.cholesky(not_pd) if step == 2 else ops.all_true(torch.tensor([True]))
    assert ops.checks.settle() == 2


def test_a_run_defers_its_checks_only_on_cuda_and_where_nothing_else_reads_each_step():
    plan = BASE.resolve()
    assert not speculation.speculates(plan, "torch")  # the CPU: answers cost microseconds
    cuda = replace(BASE, device="cuda")
    for change, expected in (({}, True), ({"reproject_threshold": 0.1}, False),
                             ({"adversary": "adaptive", "gradient_stream": "numpy"}, False)):
        plan = replace(cuda, **change).resolve()
        plan.__dict__["device"] = "cuda"  # the cached device, as on a machine with a GPU
        assert speculation.speculates(plan, "torch") is expected
    assert not speculation.speculates(plan, "numpy")
