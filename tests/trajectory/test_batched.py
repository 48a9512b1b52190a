"""Batched cells: runs stepped together as one stacked computation write the files of
runs stepped alone, byte for byte; cells without a stacked form, and cells whose step has an event, run
alone inside their batch; a killed batch resumes; the sweep hands out batches and its results do not change."""
from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from pitcheck.verbs import compare as sw
from pitcheck.infra.errors import PitcheckError
from pitcheck.model.gradients import AdversaryParams
from pitcheck.infra.threads import thread_policy
from pitcheck.trajectory import RunBreakdown, RunConfig, RunInterrupted, Trajectory, run
from pitcheck.trajectory.batched import run_batch

ROOT = Path(__file__).resolve().parents[2]
STACKED = ["qr", "cholqr", "cholqr2", "polar", "polar-gram", "polar-ns", "cayley", "cayley-iter"]
PRECISIONS = ["fp64", "fp32", "tf32", "bf16", "bf16-mixed"]


def run_files(d: Path) -> dict:
    return {p.name: p.read_bytes() for p in d.iterdir() if p.is_file() and p.name != ".lock"}


def alone_and_batched(configs: list[RunConfig], tmp: Path):
    """Each config run alone into tmp/alone<k> and all of them as one batch into tmp/batch<k>; returns the
    batch's outcomes and each run's files both ways."""
    with thread_policy(1):
        for k, c in enumerate(configs):
            try:
                run(c, tmp / f"alone{k}", progress=False)
            except RunBreakdown:
                pass
        outcomes = run_batch([Trajectory(c, tmp / f"batch{k}", progress=False) for k, c in enumerate(configs)])
    return outcomes, [(run_files(tmp / f"alone{k}"), run_files(tmp / f"batch{k}")) for k in range(len(configs))]


def four_cells(precision: str, retraction: str, vocab: int = 32, dim: int = 4, steps: int = 12) -> list[RunConfig]:
    """Seeds, adversaries and learning rates differ: what a batch shares is shape, policy and retraction."""
    return [RunConfig(precision=precision, retraction=retraction, vocab=vocab, dim=dim, steps=steps,
                      records_per_decade=1, seed=seed, adversary=adversary, lr=lr, device="cpu")
            for seed, adversary, lr in ((0, "gaussian", 0.01), (1, "gaussian", 0.05),
                                        (2, "dense_output,sparse_input", 0.01), (3, "dense_output,sparse_input", 0.03))]


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("retraction", STACKED)
def test_a_batch_writes_the_files_of_its_cells_run_alone(tmp_path, precision, retraction):
    outcomes, files = alone_and_batched(four_cells(precision, retraction), tmp_path)
    # the stack computed every step but those with an event (polar-ns in bf16 fails now and then: each such
    # step is taken alone and the cell rejoins)
    skipped = [batched["events.jsonl"].count(b'"action": "step skipped"') for _, batched in files]
    assert [o.batched_steps for o in outcomes] == [12 - n for n in skipped]
    assert sum(skipped) == 0 or (retraction, precision) == ("polar-ns", "bf16")
    for alone, batched in files:
        assert alone == batched  # metrics.csv, checkpoint.npz, events.jsonl, manifest.json, commit.json


@pytest.mark.parametrize("precision", ["fp64", "fp32"])
def test_the_stacked_qr_calls_the_engines_lapack_not_numpys(tmp_path, monkeypatch, precision):
    """numpy's np.linalg.qr runs numpy's bundled OpenBLAS; the engine's householder_qr runs scipy's. Where the
    two builds differ (numpy 2.5.2 and scipy 1.18.1 on an H200 machine's Xeon: results/gpu/NOTE.md), a stack
    that called numpy's QR wrote other bits than its cells alone. A numpy QR one ulp off stands in for
    that build here: the float64 model (fp64) and the float64 shadow (fp32) must not see it."""
    numpy_qr = np.linalg.qr

    def another_build(x, *args, **kwargs):
        Q, R = numpy_qr(x, *args, **kwargs)
        return np.nextafter(Q, np.inf), R

    monkeypatch.setattr(np.linalg, "qr", another_build)
    _, files = alone_and_batched(four_cells(precision, "qr"), tmp_path)
    assert all(alone == batched for alone, batched in files)


@pytest.mark.parametrize("retraction", ["cayley", "polar-gram", "cholqr2"])
def test_odd_dimensions_too(tmp_path, retraction):
    # D = 6 and 3: D x D products below torch's own-loop threshold; D = 32: softplus and sigmoid of L's
    # diagonal on a full AVX512 vector (the stacked diagonal, strided, would take the scalar path)
    for k, (vocab, dim) in enumerate(((40, 6), (24, 3), (64, 32))):
        cells = four_cells("fp32", retraction, vocab, dim, steps=12)
        _, files = alone_and_batched(cells, tmp_path / str(k))
        assert all(a == b for a, b in files)


def test_cells_without_a_stacked_form_run_alone_in_their_batch(tmp_path):
    base = dict(precision="fp32", vocab=32, dim=4, steps=12, records_per_decade=2)
    configs = [RunConfig(retraction="qr", seed=0, **base), RunConfig(retraction="qr", seed=1, **base),
               RunConfig(retraction="qr", optimizer="momentum", **base),
               RunConfig(retraction="qr", adversary="gaussian,adaptive", **base),
               RunConfig(retraction="ns5", **base)]
    outcomes, files = alone_and_batched(configs, tmp_path)
    assert [o.batched_steps for o in outcomes] == [12, 12, 0, 0, 0]
    assert all(a == b for a, b in files)


def stack_steps_expected(events: bytes, steps: int) -> tuple[int, bool]:
    """(steps the stack takes of a run whose skipped steps are those of its events, whether it rejoined
    after a skipped step): each skipped step is taken alone and the run rejoins, unless the step before was
    skipped too: then (ALONE_AFTER_FAILURES = 2) it goes on alone to its end."""
    failed = {json.loads(line)["step"] - 1 for line in events.decode().splitlines() if b"nonfinite_gradient" in
              line.encode()}
    taken, rejoined = 0, False
    for s in range(steps):
        if s in failed:
            if s - 1 in failed:
                break
        else:
            rejoined |= s - 1 in failed
            taken += 1
    return taken, rejoined


def test_a_cell_whose_step_has_an_event_takes_it_alone_and_rejoins_with_the_same_numbers(tmp_path, monkeypatch):
    monkeypatch.setattr("pitcheck.trajectory.batched.ALONE_AFTER_FAILURES", 2)
    base = dict(precision="fp32", retraction="qr", vocab=32, dim=4, steps=30, records_per_decade=2)
    configs = [RunConfig(seed=0, **base),
               # non-finite gradients, now and then (the run rejoins) and often (it ends up alone)
               RunConfig(seed=1, adversary="nonfinite", adversary_params=AdversaryParams(nonfinite_probability=0.3),
                         **base),
               # huge spikes at lr 1: T breaks down after a few stacked steps; handed back, the run records it
               RunConfig(seed=2, adversary="spike", lr=1.0, **base,
                         adversary_params=AdversaryParams(spike_probability=0.5, spike_scale=1000.0)),
               RunConfig(seed=3, **base),
               RunConfig(seed=4, adversary="nonfinite", adversary_params=AdversaryParams(nonfinite_probability=0.15),
                         **base)]
    with warnings.catch_warnings():  # the events are recorded: numpy's warnings about them would be noise
        warnings.simplefilter("error", RuntimeWarning)
        outcomes, files = alone_and_batched(configs, tmp_path)
    assert outcomes[0].batched_steps == outcomes[3].batched_steps == 30
    often, now_and_then = (stack_steps_expected(files[k][1]["events.jsonl"], 30) for k in (1, 4))
    assert outcomes[1].batched_steps == often[0] < 20
    assert outcomes[4].batched_steps == now_and_then[0] and now_and_then[1]
    assert isinstance(outcomes[2].error, RunBreakdown) and b"breakdown" in files[2][1]["events.jsonl"]
    assert 0 < outcomes[2].batched_steps < 30
    assert all(a == b for a, b in files)


@pytest.mark.parametrize("precision", ["fp16", "fp16-mixed"])
def test_loss_scaled_cells_keep_their_own_scales_in_the_stack(tmp_path, monkeypatch, precision):
    # the scale doubles every 4 clean steps (GradScaler's 2000, shortened): overflows, halvings and growth
    # come again and again, at different steps in different cells
    monkeypatch.setattr("pitcheck.model.amp.LOSS_SCALE_GROWTH_INTERVAL", 4)
    cells = four_cells(precision, "qr", steps=40)
    cells = [dataclasses.replace(c, records_per_decade=40) for c in cells]
    outcomes, files = alone_and_batched(cells, tmp_path)
    overflows = [batched["events.jsonl"].count(b"gradient_overflow") for _, batched in files]
    assert all(n >= 2 for n in overflows)
    assert [o.batched_steps for o in outcomes] == [40 - n for n in overflows]
    scales = [[row.split(",")[header.index("loss_scale")] for row in rows]
              for header, *rows in ([line.split(",") if i == 0 else line
                                     for i, line in enumerate(batched["metrics.csv"].decode().splitlines())]
                                    for _, batched in files)]
    assert len(set(map(tuple, scales))) > 1 and all(len(set(s)) > 1 for s in scales)
    for alone, batched in files:
        assert alone == batched


def test_an_overflowed_state_warns_nothing_it_records(tmp_path):
    # huge spikes at lr 1 overflow T: non-finite gradients, metrics of inf / inf; all recorded as events
    base = dict(precision="fp64", retraction="polar-gram", vocab=16, dim=4, steps=40, records_per_decade=2)
    configs = [RunConfig(seed=0, **base), RunConfig(seed=2, adversary="spike", lr=1.0, **base,
                                                    adversary_params=AdversaryParams(spike_probability=0.5,
                                                                                     spike_scale=1000.0)),
               RunConfig(seed=3, adversary="dense_output,sparse_input", lr=0.5, **base)]
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        _, files = alone_and_batched(configs, tmp_path)
    assert b"nonfinite" in files[1][1]["events.jsonl"] and all(a == b for a, b in files)


def test_a_failed_matrix_in_the_stack_warns_nothing():
    # the singular Gram of a failed matrix (here Y = 0) goes through the stack's square root and division:
    # the mask reports it, the engine alone records it; numpy's warnings would be noise on a progress bar
    import numpy as np

    from pitcheck.numerics.arrays import NumpyOps
    from pitcheck.model.retractions import StackedOps, stacked_polar_gram
    from pitcheck.numerics.reference import random_memory

    Z = np.stack([random_memory(16, 4, np.random.default_rng(k)) for k in range(2)])
    xi = np.stack([1e-3 * Z[0], -Z[1]])
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        _, failed = stacked_polar_gram(Z, xi, StackedOps(NumpyOps()))
    assert failed.tolist() == [False, True]


KILLED_BATCH = """
import sys
from pitcheck.infra.threads import thread_policy
from pitcheck.trajectory import RunConfig, Trajectory
from pitcheck.trajectory.batched import run_batch
configs = [RunConfig(precision="fp32", retraction="qr", vocab=16, dim=4, steps=2000, records_per_decade=10,
                     seed=s) for s in range(3)]
with thread_policy(1):
    run_batch([Trajectory(c, f"{sys.argv[1]}/batch{k}", progress=False) for k, c in enumerate(configs)])
"""


def committed_step(d: Path) -> int:
    try:
        return json.loads((d / "commit.json").read_text())["step"]
    except (OSError, ValueError):
        return -1


def test_a_batch_killed_by_sigkill_resumes_to_the_numbers_of_uninterrupted_runs(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", KILLED_BATCH, str(tmp_path)], cwd=ROOT)
    try:
        deadline = time.monotonic() + 120
        while not all(committed_step(tmp_path / f"batch{k}") >= 20 for k in range(3)):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        time.sleep(0.3)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    configs = [RunConfig(precision="fp32", retraction="qr", vocab=16, dim=4, steps=2000, records_per_decade=10,
                         seed=s) for s in range(3)]
    with thread_policy(1):
        trajectories = [Trajectory(c, tmp_path / f"batch{k}", resume=True, progress=False)
                        for k, c in enumerate(configs)]
        assert 0 < min(t.step for t in trajectories) < 2000
        run_batch(trajectories)
        for k, c in enumerate(configs):
            run(c, tmp_path / f"alone{k}", progress=False)
    for k in range(3):
        alone, resumed = run_files(tmp_path / f"alone{k}"), run_files(tmp_path / f"batch{k}")
        for name in ("metrics.csv", "checkpoint.npz", "events.jsonl"):
            assert alone[name] == resumed[name]


def test_runs_of_different_policies_handed_over_together_are_not_stacked_together(tmp_path):
    cells = four_cells("fp32", "qr")[:2] + four_cells("bf16", "qr")[2:]
    outcomes, files = alone_and_batched(cells, tmp_path)
    assert [o.batched_steps for o in outcomes] == [12] * 4  # two stacks of two
    assert all(a == b for a, b in files)


def test_runs_resumed_at_different_steps_are_batched_by_step(tmp_path):
    configs = four_cells("fp32", "qr", steps=40)
    with thread_policy(1):
        for k, c in enumerate(configs):
            run(c, tmp_path / f"alone{k}", progress=False)
        # two runs interrupted at step 10, two at step 25 (checkpoints written as an interrupted run writes them)
        for k, c in enumerate(configs):
            t = Trajectory(c, tmp_path / f"batch{k}", progress=False)
            stop = 10 if k < 2 else 25
            outcome = run_batch_until(t, stop)
            assert outcome == stop
        outcomes = run_batch([Trajectory(c, tmp_path / f"batch{k}", resume=True, progress=False)
                              for k, c in enumerate(configs)])
    assert [o.batched_steps for o in outcomes] == [30, 30, 15, 15]
    for k in range(4):
        alone, batched = run_files(tmp_path / f"alone{k}"), run_files(tmp_path / f"batch{k}")
        assert alone["checkpoint.npz"] == batched["checkpoint.npz"] and alone["metrics.csv"] == batched["metrics.csv"]


def test_an_interrupted_batch_saves_the_runs_beside_it_too(tmp_path, monkeypatch):
    from pitcheck.trajectory import batched

    monkeypatch.setattr(batched, "ALONE_AFTER_FAILURES", 2)
    base = dict(precision="fp32", retraction="qr", vocab=16, dim=4, steps=40, records_per_decade=4)
    configs = [RunConfig(seed=0, **base),
               RunConfig(seed=1, adversary="nonfinite", adversary_params=AdversaryParams(nonfinite_probability=0.5),
                         **base)]
    step = batched.StackedRuns.step

    def step_then_interrupt(self):
        step(self)
        if self.runs[0].step == 20:
            assert self.beside  # the second run has left the stack by then, and steps beside it
            signal.raise_signal(signal.SIGINT)

    with thread_policy(1):
        for k, c in enumerate(configs):
            run(c, tmp_path / f"alone{k}", progress=False)
        monkeypatch.setattr(batched.StackedRuns, "step", step_then_interrupt)
        outcomes = run_batch([Trajectory(c, tmp_path / f"batch{k}", progress=False) for k, c in enumerate(configs)])
        assert all("interrupted at step" in str(o.error) for o in outcomes)
        assert committed_step(tmp_path / "batch0") == committed_step(tmp_path / "batch1") == 20
        monkeypatch.setattr(batched.StackedRuns, "step", step)
        run_batch([Trajectory(c, tmp_path / f"batch{k}", resume=True, progress=False) for k, c in enumerate(configs)])
    for k in range(2):
        alone, resumed = run_files(tmp_path / f"alone{k}"), run_files(tmp_path / f"batch{k}")
        for name in ("metrics.csv", "checkpoint.npz", "events.jsonl"):
            assert alone[name] == resumed[name]


def test_a_signal_stops_the_whole_batch_not_just_the_run_it_reached(tmp_path):
    base = dict(precision="fp32", retraction="qr", vocab=16, dim=4, steps=40, records_per_decade=4)
    configs = [RunConfig(seed=0, optimizer="momentum", **base), RunConfig(seed=1, optimizer="momentum", **base),
               RunConfig(seed=2, **base), RunConfig(seed=3, **base)]
    with thread_policy(1):
        trajectories = [Trajectory(c, tmp_path / f"batch{k}", progress=False) for k, c in enumerate(configs)]
        step = trajectories[0].pair.step

        def step_then_interrupt(grads, shadow_grads, k):
            events = step(grads, shadow_grads, k)
            if k + 1 == 5:
                signal.raise_signal(signal.SIGINT)
            return events

        trajectories[0].pair.step = step_then_interrupt  # the first run alone is interrupted at step 5
        outcomes = run_batch(trajectories)
    assert [type(o.error) for o in outcomes] == [RunInterrupted] * 4
    assert "at step 5" in str(outcomes[0].error) and all("went on" in str(o.error) for o in outcomes[1:])
    assert committed_step(tmp_path / "batch0") == 5
    assert not any((tmp_path / f"batch{k}" / "checkpoint.npz").exists() for k in (1, 2, 3))
    for k, c in enumerate(configs):  # every directory unlocked: the same command resumes them all
        Trajectory(c, tmp_path / f"batch{k}", resume=True, progress=False).close()


def run_batch_until(trajectory: Trajectory, stop: int) -> int:
    """Run alone until SIGINT arrives after step `stop` (the run commits that step and stops); the step committed."""
    step = trajectory.pair.step

    def step_then_interrupt(grads, shadow_grads, k):
        events = step(grads, shadow_grads, k)
        if k + 1 == stop:
            signal.raise_signal(signal.SIGINT)
        return events

    trajectory.pair.step = step_then_interrupt
    with pytest.raises(PitcheckError, match=f"interrupted at step {stop}"):
        trajectory.run()
    return committed_step(trajectory.out)


GRID = """
steps = 30
records_per_decade = 4
[axes]
retraction = ["qr", "polar-ns"]
precision = ["fp64", "fp32", "bf16", "fp16"]
adversary = ["gaussian", "dense_output+sparse_input"]
shape = ["16x4"]
seed = [0, 1]
"""


def test_the_sweep_hands_out_batches_and_its_results_do_not_change(tmp_path):
    path = tmp_path / "grid.toml"
    path.write_text(GRID)
    grid = sw.load_grid(path)
    tasks = [{"name": c.name, "config": c.config.to_json()} for c in sw.cells(grid)]
    handed = sw.batch_tasks(tasks, 3)
    batches = [t for t in handed if "cells" in t]
    # qr and polar-ns in fp64, fp32, bf16 and fp16 (loss scaling, per cell): 4 cells each, in batches of 3 and 1
    assert sorted(len(t["cells"]) for t in batches) == [3] * 8
    assert len(handed) == 32 - 24 + 8 and sw.batch_tasks(tasks, 1) == tasks
    assert all(len({c["config"]["precision"] for c in t["cells"]}) == 1 for t in batches)
    assert all(len({c["config"]["retraction"] for c in t["cells"]}) == 1 for t in batches)
    alone = sw.sweep(tmp_path / "alone", grid, workers=2, progress=False, batch=1)
    batched = sw.sweep(tmp_path / "batched", grid, workers=2, progress=False, batch=3)
    assert alone["computed"] == batched["computed"] == 32
    files = {}
    for which in ("alone", "batched"):
        cells = tmp_path / which / "cells"
        files[which] = {str(p.relative_to(cells)): p.read_bytes() for p in cells.rglob("*")
                        if p.is_file() and p.name != ".lock"}
    assert files["alone"] == files["batched"]
    assert (tmp_path / "alone" / "summary.csv").read_bytes() == (tmp_path / "batched" / "summary.csv").read_bytes()
    assert len(list((tmp_path / "batched" / "costs").glob("*.json"))) == 32


def test_bad_batch_is_one_line():
    for bad in (0, -2, 1.5, True, "4"):
        with pytest.raises(PitcheckError, match="--batch must be a positive integer") as info:
            sw.batch_tasks([], bad)
        assert "\n" not in str(info.value)


def test_stack_key_keeps_only_the_stacked_class_and_small_shapes():
    plain = RunConfig(precision="fp32", retraction="qr", vocab=128, dim=8)
    assert sw.stack_key(plain) is not None
    assert sw.stack_key(RunConfig(precision="fp32", retraction="qr", vocab=128, dim=8, seed=5, lr=0.3,
                                  adversary="spike")) == sw.stack_key(plain)
    assert sw.stack_key(RunConfig(precision="fp16", retraction="qr", vocab=128, dim=8)) is not None
    for other in (dict(optimizer="adam"), dict(retraction="ns5"), dict(head="tied",
                  retraction="qr"), dict(vocab=2048, dim=32), dict(adversary="adaptive"), dict(reproject_every=5)):
        config = {**dict(precision="fp32", retraction="qr", vocab=128, dim=8), **other}
        if config.get("head") == "tied":
            config["retraction"] = RunConfig.retraction
        assert sw.stack_key(RunConfig(**config)) is None, other
    assert sw.stack_key(RunConfig(precision="bf16", retraction="qr", vocab=128, dim=8)) != sw.stack_key(plain)


def test_cli_refuses_a_bad_batch_before_anything_runs(tmp_path, capsys):
    from pitcheck.cli import main

    assert main(["compare", "--quick", "--batch", "0", "--out", str(tmp_path / "x")]) == 2
    assert "--batch must be a positive integer" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_a_map_that_overflows_warns_nothing_alone_or_stacked():
    # cayley-iter's truncated series overflows from a huge step: the engine records a skipped step (alone) or
    # the stack reports the cell failed; numpy's warnings on the way would be noise on a progress bar
    import numpy as np

    from pitcheck.model.batched_engine import StackedPit
    from pitcheck.model.engine import Engine, StepSettings
    from pitcheck.numerics.policy import get_policy
    from pitcheck.numerics.reference import random_memory

    def engine():
        e = Engine("numpy", get_policy("fp64"), StepSettings("cayley-iter", "sgd", lr=1e120))
        e.initialise(random_memory(16, 4, np.random.default_rng(0)), np.eye(4))
        return e

    G = np.random.default_rng(1).standard_normal((16, 4))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        events = engine().step({"Z": G, "L": np.zeros((4, 4))}, 0)
        failed = StackedPit([engine(), engine()]).step(np.stack([G, 1e-3 * G]), np.zeros((2, 4, 4)))
    assert [e["event"] for e in events] == ["nonfinite_state"] and failed.tolist() == [True, True]


def test_a_run_beside_the_stack_that_breaks_down_leaves_it_with_its_files_as_alone(tmp_path, monkeypatch):
    """Non-finite gradients now and then and huge spikes at lr 1 (seed 1): the run fails two stack steps in a
    row, goes beside the stack, and breaks down there at step 16 of 40 (L's diagonal at 0). It must leave
    with that error and the files it writes alone; the run stepped with it is untouched."""
    monkeypatch.setattr("pitcheck.trajectory.batched.ALONE_AFTER_FAILURES", 2)
    base = dict(precision="fp32", retraction="qr", vocab=32, dim=4, steps=40, records_per_decade=2)
    configs = [RunConfig(seed=0, **base),
               RunConfig(seed=1, adversary="nonfinite,spike", lr=1.0, **base, adversary_params=AdversaryParams(
                   nonfinite_probability=0.6, spike_probability=0.5, spike_scale=1000.0))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        outcomes, files = alone_and_batched(configs, tmp_path)
    assert outcomes[0].error is None and outcomes[0].batched_steps == 40
    assert isinstance(outcomes[1].error, RunBreakdown) and "broke down at step 16" in str(outcomes[1].error)
    assert all(alone == batched for alone, batched in files)
