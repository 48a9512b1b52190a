"""pitcheck.verbs.bench.benchmark and `pitcheck bench`: JSON schema, ratios to the GEMM floor from the same run, peers, scaling fit, exit codes.
Timings themselves are never asserted (shared, noisy cores): only their structure and arithmetic."""
import argparse
import json
import math

import pytest

from pitcheck import PitcheckError
from pitcheck.verbs.bench import benchmark
from pitcheck.cli import bench as bench_cli


def _args(**kw):
    p = argparse.ArgumentParser()
    bench_cli.add_parser(p.add_subparsers(dest="command"))
    argv = ["bench"]
    for k, v in kw.items():
        flag = "--" + k.replace("_", "-")
        if v is True:
            argv.append(flag)
        elif isinstance(v, list):
            for x in v:
                argv += [flag, x]
        else:
            argv += [flag, str(v)]
    return p.parse_args(argv)


@pytest.fixture(scope="module")
def doc():
    # tiny shapes, one round: structure only
    return benchmark.run_bench([(256, 4), (512, 8), (1024, 4)], quick=True, rounds=1,
                           retractions=["qr", "cholqr2", "cayley", "polar-gram", "ns5"])


def test_json_schema_and_ratios(doc):
    assert {"machine", "results", "scaling", "tracking", "targets", "not_run"} <= set(doc)
    assert doc["machine"]["threads"] == 1 and "torch" in doc["machine"]["pinned"]
    json.dumps(doc)  # serialisable
    for r in doc["results"]:
        assert {"retraction", "precision", "vocab", "dim", "ms", "gemm_ms", "ratio", "peer"} <= set(r)
        assert math.isclose(r["ratio"], r["ms"] / r["gemm_ms"], rel_tol=2e-2, abs_tol=2e-3)
        assert (r["peer"] is None) == (r["kind"] != "peer")
    kinds = {r["kind"] for r in doc["results"]}
    assert kinds == {"gemm", "floor", "retraction", "peer", "step", "metrics", "run", "record", "measure", "commit",
                     "runstep"}
    gemm = [r for r in doc["results"] if r["kind"] == "gemm"]
    assert len(gemm) == 4 and all(r["ratio"] == 1.0 for r in gemm)
    # the run step's own shape, added to the shapes asked for: the GEMM and the run step only
    extra = {r["kind"] for r in doc["results"] if (r["vocab"], r["dim"]) == benchmark.RUN_STEP_SHAPE}
    assert extra == {"gemm", "floor", "run", "record", "measure", "commit", "runstep"}
    # numpy's GEMM on the same memory beside the unit, at every shape
    floors = [r for r in doc["results"] if r["kind"] == "floor"]
    assert len(floors) == 4 and all(r["retraction"] == benchmark.NUMPY_GEMM and r["ratio"] > 0 for r in floors)
    ns5 = [r for r in doc["results"] if r["retraction"] == "ns5"]
    assert ns5 and all(r["approximate"] for r in ns5)


def test_peers_in_the_same_run(doc):
    peers = {r["retraction"] for r in doc["results"] if r["kind"] == "peer"}
    assert "torch householder" in peers
    for r in doc["results"]:
        if r["retraction"] == "torch householder":
            assert "householder" in r["peer"]
    # V x V peers stop at the quick limit (2048), and say so beyond it
    for n in doc["not_run"]:
        assert n["status"].startswith(("not installed", "not run", "does not fit"))


def test_vv_peers_are_reported_not_run_above_the_limit():
    pytest.importorskip("geoopt")
    import torch

    Z, xi = benchmark._tall_point(4096, 4, torch.float32)
    cases, notes = benchmark.peer_cases(4096, 4, Z, xi, "quick")
    assert "geoopt Cayley" not in {c.name for c in cases}
    assert any(n["peer"] == "geoopt Cayley" and "V x V" in n["status"] for n in notes)


def test_table_and_report(doc):
    t = benchmark.table(doc)
    head = t.splitlines()[0]
    for col in ("GEMM ms", benchmark.NUMPY_GEMM, "qr", "cholqr2", "ns5 (approx.)", "torch householder", "full step:qr", "metrics record"):
        assert col in head
    assert "| 1024 x 4 |" in t
    rep = benchmark.report(doc)
    assert "Targets" in rep and "Fitted scaling" in rep and "Metric tracking" in rep


def test_scaling_fit_recovers_known_exponents():
    rows = [{"retraction": "x", "kind": "retraction", "vocab": V, "dim": D, "ms": 1e-6 * V * D**2}
            for V in (1000, 4000, 16000) for D in (8, 32)]
    fit = benchmark.fit_scaling(rows)["x"]
    assert fit["V"] == 1.0 and fit["D"] == 2.0


def test_tracking_fraction_arithmetic():
    rows = [{"kind": "step", "retraction": "step:qr", "vocab": 8, "dim": 2, "precision": "fp32", "ms": 1.0},
            {"kind": "metrics", "retraction": "metrics", "vocab": 8, "dim": 2, "precision": "fp32", "ms": 10.0}]
    [t300, t2000] = benchmark.tracking_fraction(rows)
    n = t2000["records"]
    assert t2000["fraction"] == round(10 * n / (2000 + 10 * n), 4)
    assert t300["fraction"] > t2000["fraction"]


def test_targets_are_judged(doc):
    names = {t["target"] for t in doc["targets"]}
    assert "qr <= fastest peer" in names and any(n.startswith("metric tracking") for n in names)
    for t in doc["targets"]:
        assert isinstance(t["reached"], bool)


def test_main_writes_json_and_out(tmp_path, capsys):
    code = bench_cli.main(_args(shape=["256x4", "512x8"], rounds=1, retractions="qr,cholqr2", no_peers=True,
                                  no_steps=True, json=tmp_path / "b.json", out=tmp_path / "o"))
    assert code == 0
    doc = json.loads((tmp_path / "b.json").read_text())
    assert {r["retraction"] for r in doc["results"]} == {"gemm", benchmark.NUMPY_GEMM, "qr", "cholqr2"}
    assert (tmp_path / "o" / "report.md").exists() and (tmp_path / "o" / "bench.png").stat().st_size > 1000
    assert "| 512 x 8 |" in capsys.readouterr().out


@pytest.mark.parametrize("kw, what", [(dict(retractions="qr,householder"), "unknown retraction 'householder'"),
                                      (dict(rounds=0), "--rounds must be >= 1")])
def test_bad_input_exits_2(kw, what, capsys):
    assert bench_cli.main(_args(**kw)) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("pitcheck bench: error:") and what in err and "\n" not in err


def test_bad_shape_is_refused():
    with pytest.raises(SystemExit):
        _args(shape=["8192by128"])


def _not_timed(*args, **kw):
    raise AssertionError("something was timed: the input should have been refused first")


@pytest.mark.parametrize("kw, what", [
    (dict(retractions="none"), "'none' is the baseline without a retraction"),  # was an empty table
    (dict(retractions=""), "--retractions is empty"),  # was every retraction
    (dict(retractions=" , "), "--retractions is empty"),
    (dict(retractions="qr,cayley,qr"), "qr given twice"),
    (dict(shape=["256x4", "512x8", "256x4"]), "--shape 256x4 given twice"),  # was timed twice
])
def test_bench_lists_are_refused_before_anything_is_timed(kw, what, monkeypatch, capsys):
    monkeypatch.setattr(benchmark, "run_bench", _not_timed)
    argv = dict(shape=["256x4"], rounds=1, no_peers=True, no_steps=True)
    assert bench_cli.main(_args(**{**argv, **kw})) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("pitcheck bench: error:") and what in err and "\n" not in err


@pytest.mark.parametrize("kw, what", [(dict(retractions=["none"]), "'none'"), (dict(retractions=[]), "empty"),
                                      (dict(shapes=[(256, 4), (256, 4)]), "given twice"),
                                      (dict(shapes=[]), "no shapes")])
def test_run_bench_refuses_the_same_lists(kw, what, monkeypatch):
    monkeypatch.setattr(benchmark, "time_interleaved", _not_timed)
    with pytest.raises(PitcheckError, match=what):
        benchmark.run_bench(**{"shapes": [(256, 4)], **kw})


@pytest.mark.parametrize("made", [False, True])
@pytest.mark.parametrize("clash", ["bench.json", "report.md", "bench.png", "."])
def test_bench_outputs_naming_one_file_are_refused_before_timing(tmp_path, clash, made, monkeypatch, capsys):
    monkeypatch.setattr(benchmark, "run_bench", _not_timed)
    out = tmp_path / "o"
    if made:
        out.mkdir()
    json_path = out / clash if clash != "." else out  # "." : --json the --out directory itself
    assert bench_cli.main(_args(shape=["256x4"], json=json_path, out=out)) == 2
    err = capsys.readouterr().err.strip()
    assert ("--json" in err and ("--out" in err or made and "is a directory" in err)) and "\n" not in err
    assert out.exists() == made
    assert not made or not any(out.iterdir())


def test_bench_outputs_that_cannot_be_written_are_refused_before_timing(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(benchmark, "run_bench", _not_timed)
    (tmp_path / "o" / "bench.png").mkdir(parents=True)
    (tmp_path / "file").write_text("x")
    for kw, what in [(dict(out=tmp_path / "o"), "bench.png is a directory"),
                     (dict(json=tmp_path / "missing" / "b.json"), "does not exist"),
                     (dict(json=tmp_path), "is a directory"),
                     (dict(out=tmp_path / "file" / "sub"), "is a file")]:
        assert bench_cli.main(_args(shape=["256x4"], **kw)) == 2
        err = capsys.readouterr().err.strip()
        assert what in err and "\n" not in err


@pytest.mark.parametrize("kw, what", [(dict(rounds=0), "--rounds must be >= 1, got 0"),
                                      (dict(retractions=["qr", "householder"]), "unknown retraction 'householder'"),
                                      (dict(json_path="o", out="o"), "--json"),
                                      (dict(gradient_stream="philox"), "unknown gradient stream 'philox'")])
def test_bench_raises_on_bad_input_before_timing(kw, what, monkeypatch, tmp_path):
    """The library raises PitcheckError, without the CLI's prefix; nothing is timed or written."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(benchmark, "run_bench", _not_timed)
    with pytest.raises(PitcheckError, match=what) as info:
        benchmark.bench([(256, 4)], **kw)
    assert not str(info.value).startswith("pitcheck") and not any(tmp_path.iterdir())


def test_bench_returns_the_document_it_writes(tmp_path):
    doc = benchmark.bench([(256, 4)], rounds=1, retractions=["qr"], peers=False, steps=False,
                          json_path=tmp_path / "b.json", out=tmp_path / "o")
    assert json.loads((tmp_path / "b.json").read_text()) == doc
    assert (tmp_path / "o" / "bench.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    assert (tmp_path / "o" / "report.md").read_text() == benchmark.report(doc) + "\n"


def test_the_steps_draw_from_the_stream_asked_for(monkeypatch):
    """--gradient-stream reaches the engine of every step case and the whole run's config, and the document
    and its report say which stream it was."""
    from pitcheck.verbs.bench import runcost

    built = []
    real = runcost.RunTimer.build
    monkeypatch.setattr(runcost.RunTimer, "build", classmethod(lambda cls, c: built.append(c) or real.__func__(cls, c)))
    cases = benchmark.step_cases(256, 4, ["qr"], gradient_stream="counter")
    steps = [c for c in cases if c.kind == "step"]
    assert steps and all(c.fn.__defaults__[0].gradient_stream == "counter" for c in steps)
    doc = benchmark.run_bench([(256, 4)], quick=True, rounds=1, retractions=["qr"], peers=False,
                              gradient_stream="counter")
    assert doc["gradient_stream"] == "counter" and built and all(c.gradient_stream == "counter" for c in built)
    assert "counter stream" in benchmark.report(doc)


def test_whole_run_step_is_the_step_plus_its_share_of_records(doc):
    from pitcheck.verbs.bench.runcost import AMORTISED_STEPS, records_per_step
    from pitcheck.trajectory import RunConfig, recorded_steps

    rows = [r for r in doc["results"] if r["kind"] == "runstep"]
    assert {(r["vocab"], r["dim"]) for r in rows} == {(256, 4), (512, 8), (1024, 4), benchmark.RUN_STEP_SHAPE}
    assert records_per_step() == len(recorded_steps(AMORTISED_STEPS, RunConfig.records_per_decade)) / AMORTISED_STEPS
    for r in rows:
        a = r["amortised"]
        step = next(x for x in doc["results"] if x["kind"] == "run" and (x["vocab"], x["dim"]) == (r["vocab"], r["dim"]))
        record = next(x for x in doc["results"] if x["kind"] == "record" and (x["vocab"], x["dim"]) == (r["vocab"], r["dim"]))
        assert (a["step_ms"], a["record_ms"]) == (step["ms"], record["ms"])
        assert math.isclose(r["ms"], step["ms"] + records_per_step() * record["ms"], rel_tol=1e-3)
        assert r["ms"] > step["ms"]
    targets = [t for t in doc["targets"] if t["target"].startswith("run step:qr")]
    assert len(targets) == 1 and (targets[0]["vocab"], targets[0]["dim"]) == benchmark.RUN_STEP_SHAPE
    text = benchmark.report(doc)
    assert "Whole run step" in text and "whole run step:qr (amortised)" in text


def small_grid(tmp_path, axes: str):
    from pitcheck.verbs import compare as sweep

    path = tmp_path / "grid.toml"
    path.write_text(f'steps = 30\nrecords_per_decade = 5\n[axes]\n{axes}precision = ["fp32"]\nshape = ["32x4"]\n'
                    'seed = [0, 1, 2]\n')
    return sweep.load_grid(str(path))


def watch_builds(monkeypatch, timer_class, built: list, closed: list) -> None:
    """timer_class.build records what each timer was built from (its argument) and each scratch it closes."""
    real_build = timer_class.build

    def build(what):
        timer = real_build(what)
        built.append(what)
        real_close = timer.close
        timer.close = lambda: (closed.append(timer.scratch), real_close())
        return timer

    monkeypatch.setattr(timer_class, "build", build)


def test_grid_rate_costs_every_cell_by_its_class(tmp_path, monkeypatch):
    from pitcheck.verbs.bench import runcost

    grid = small_grid(tmp_path, 'retraction = ["qr", "cayley"]\n')
    timed, closed = [], []
    watch_builds(monkeypatch, runcost.RunTimer, timed, closed)
    g = benchmark.grid_rate(rounds=1, grid=grid)
    assert g["cells"] == 6 and g["cost_classes"] == 2 and len(timed) == 2  # one run per class, not per seed
    assert {c.retraction for c in timed} == {"qr", "cayley"}
    assert math.isclose(g["cells_per_second"], 6 / g["cell_seconds"], rel_tol=1e-2)
    assert [c["cells"] for c in g["classes"]] == [3, 3]
    assert math.isclose(sum(c["cells"] * c["seconds_per_cell"] for c in g["classes"]), g["cell_seconds"], rel_tol=1e-2)
    assert len(closed) == 2 and not any((tmp_path.parent / c).exists() for c in closed)
    doc = {"machine": {"processor": "x", "cpus": 2, "torch": "t", "numpy": "n", "clock": "c"}, "mode": "quick",
           "rounds": 1, "results": [], "grid": g}
    assert f"{g['cells']} cells of 30 steps" in benchmark.report(doc)


def test_grid_rate_batched_costs_each_batch_as_one_stack_and_the_rest_by_class(tmp_path, monkeypatch):
    from pitcheck.verbs.bench import runcost

    grid = small_grid(tmp_path, 'retraction = ["qr"]\noptimizer = ["sgd", "momentum"]\n')
    built, closed = [], []
    watch_builds(monkeypatch, runcost.StackTimer, built, closed)
    g = benchmark.grid_rate(rounds=1, grid=grid, batch=8)
    b = g["batched"]
    # the three SGD cells are one stack; momentum has no stacked form: its cells cost what its class costs
    assert [[c.optimizer for c in configs] for configs in built] == [["sgd"] * 3] and b["batches"] == 1 and b["cells_batched"] == 3
    momentum = next(c for c in g["classes"] if c["optimizer"] == "momentum")
    assert math.isclose(b["cell_seconds"], 3 * b["stacks"][0]["seconds_per_cell"] + 3 * momentum["seconds_per_cell"],
                        rel_tol=1e-2)
    assert math.isclose(b["cells_per_second"], 6 / b["cell_seconds"], rel_tol=1e-2)
    assert len(closed) == 1 and not any((tmp_path.parent / c).exists() for c in closed)
    assert "batched" not in benchmark.grid_rate(rounds=1, grid=grid)  # batch=1: every cell alone
    doc = {"machine": {"processor": "x", "cpus": 2, "torch": "t", "numpy": "n", "clock": "c"}, "mode": "quick",
           "rounds": 1, "results": [], "grid": g}
    assert "3 cells in 1 batches" in benchmark.report(doc)


def test_cell_seconds_and_cost_classes():
    from pitcheck.verbs.bench.runcost import cell_seconds, cost_classes
    from pitcheck.trajectory import RunConfig, recorded_steps

    n = len(recorded_steps(1000, 10))
    assert math.isclose(cell_seconds(2.0, 30.0, 1000, 10), (1000 * 2.0 + n * 30.0) / 1e3)
    configs = [RunConfig(seed=s, retraction=r) for s in (0, 1) for r in ("qr", "polar")]
    classes = cost_classes(configs)
    assert len(classes) == 2 and all(len(v) == 2 for v in classes.values())


def test_a_record_is_timed_whole_and_as_its_metrics_row_and_its_commit(doc, tmp_path):
    """A record's two halves are timed apart (the metrics row; the commit written through) beside the record,
    and the halves do what their names say: measure() writes nothing, commit() writes the run's files."""
    from pitcheck.trajectory import RunConfig
    from pitcheck.verbs.bench.runcost import RunTimer

    for V, D in {(r["vocab"], r["dim"]) for r in doc["results"] if r["kind"] == "run"}:
        parts = {r["kind"]: r for r in doc["results"] if (r["vocab"], r["dim"]) == (V, D)}
        assert parts["measure"]["retraction"] == "run metrics row" and parts["commit"]["retraction"] == "run commit"
        assert parts["measure"]["ms"] > 0 and parts["commit"]["ms"] > 0
    timer = RunTimer.build(RunConfig(backend="torch", precision="fp32", vocab=64, dim=4, device="cpu", steps=10))
    try:
        run = timer.trajectory.out
        timer.step()
        timer.measure()
        timer.trajectory.store.drain()  # a commit left to the commit thread would be written by now
        assert timer.trajectory.rows[-1]["step"] == 1 and not (run / "metrics.csv").exists()
        timer.commit()
        assert (run / "metrics.csv").read_text().splitlines()[-1].startswith("1,")
    finally:
        timer.close()
    assert "run commit" in benchmark.table(doc) and "run metrics row" in benchmark.table(doc)


@pytest.mark.parametrize("device, what", [("gpu", "unknown device 'gpu'"), ("cuda:7", "device cuda:7 asked for"),
                                          (3, "bench: device must be cpu, cuda, cuda:N or auto")])
def test_a_device_bench_cannot_use_is_refused_before_timing(device, what, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(benchmark, "run_bench", _not_timed)
    with pytest.raises(PitcheckError, match=what):
        benchmark.bench([(256, 4)], device=device)


def test_auto_is_the_cpu_without_a_gpu_and_the_grid_stays_on_the_cpu(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert benchmark.bench_device("auto", grid=True) == "cpu" and benchmark.bench_device("cpu", grid=False) == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert benchmark.bench_device("auto", grid=False) == "cuda" and benchmark.bench_device("cuda", grid=True) == "cuda"


def test_grid_rate_on_a_device_times_each_torch_class_there_beside_its_cpu_cost(tmp_path, monkeypatch):
    """The torch classes are built again on the device (the CPU here stands in for a GPU: the same code path
    but the clock); the numpy classes are not; totals are cells x seconds, and `faster` compares one device
    running them one after another with the CPU pool's wall."""
    from pitcheck.verbs.bench import runcost

    from pitcheck.verbs import compare as sweep
    from pitcheck.verbs.compare.grid import configs

    path = tmp_path / "grid.toml"
    path.write_text('steps = 30\nrecords_per_decade = 5\n[axes]\nretraction = ["qr"]\nprecision = ["fp32", "fp64"]\n'
                    'shape = ["32x4"]\nseed = [0, 1, 2]\n')
    grid = sweep.load_grid(str(path))
    classes = runcost.cost_classes(c for _, c in configs(grid))
    assert sorted(k[0] for k in classes) == ["numpy", "torch"]
    rows = [{"seconds_per_cell": 2.0}, {"seconds_per_cell": 2.0}]
    built, closed = [], []
    watch_builds(monkeypatch, runcost.RunTimer, built, closed)
    d = benchmark.device_grid_rate(grid, classes, rows, "cpu", rounds=1)
    assert [c.backend for c in built] == ["torch"] and all(c.device == "cpu" for c in built) and len(closed) == 1
    assert d["cells"] == 3 and d["cpu_cell_seconds"] == 6.0 and len(d["classes"]) == 1
    assert math.isclose(d["device_cell_seconds"], 3 * d["classes"][0]["device_seconds_per_cell"], rel_tol=1e-2)
    assert benchmark.faster_placement("cuda", 2.9, 6.0, 2) == "cuda" and benchmark.faster_placement("cuda", 3.0, 6.0, 2) == "cpu"
    assert benchmark.faster_placement("cuda", 0.0, 6.0, 2) == "cpu"  # no cells timed there: nothing to move
    slow = dict(d, device="cuda", device_cell_seconds=1e9)
    doc = {"machine": {"processor": "x", "cpus": 2, "torch": "t", "numpy": "n", "clock": "c"}, "mode": "quick",
           "rounds": 1, "results": [], "grid": {"cells": 6, "steps": 30, "cost_classes": 2, "cell_seconds": 12.0,
                                                 "cells_per_second": 0.5, "wall_estimate_s": 6.0, "cores": 2,
                                                 "on_device": slow}}
    assert "Its 3 torch cells on cuda, one after another" in benchmark.report(doc)


def test_a_gpu_clock_is_wall_time_between_synchronisations(monkeypatch):
    """On CUDA a case's time is wall time with the device synchronised at both ends (its kernels run
    asynchronously: CPU time would time their launches); on the CPU it stays the process's CPU time."""
    import torch

    synced = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(device))
    assert benchmark.device_clock("cpu") is benchmark._cpu_seconds
    clock = benchmark.device_clock("cuda:0")
    case = benchmark.Case("sleep", "run", lambda: __import__("time").sleep(0.01), 8, 2)
    benchmark.time_interleaved([case], rounds=2, target_s=0.0, clock=clock)
    assert min(case.times) >= 0.009 and synced and set(synced) == {"cuda:0"}
