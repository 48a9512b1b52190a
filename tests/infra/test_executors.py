"""pitcheck.infra.executors: any function over any tasks; the local pool keeps every core busy with pinned threads;
Ray gives identical results."""
from __future__ import annotations

import builtins
import json
import os
from pathlib import Path

import pytest

from pitcheck.infra import executors
from pitcheck.verbs import compare as sw
from pitcheck.infra.errors import PitcheckError
from pitcheck.verbs.compare.cells import needs_gpu

GRID = """
steps = 40
records_per_decade = 20
[axes]
retraction = ["qr", "cayley"]
precision = ["fp64", "fp32"]
shape = ["32x4"]
seed = [0]
"""


def tiny_grid(tmp_path) -> sw.Grid:
    path = tmp_path / "grid.toml"
    path.write_text(GRID)
    return sw.load_grid(path)


def cells_text(out: Path) -> dict:
    """Every file of every cell, as bytes."""
    return {str(p.relative_to(out)): p.read_bytes() for p in (out / "cells").rglob("*")
            if p.is_file() and p.name != ".lock"}


def square_in_worker(task: dict) -> dict:
    """A task that is no sweep's: the executor knows only that it is a picklable top-level function."""
    return {"x": task["x"], "square": task["x"] ** 2, "pid": os.getpid(),
            "threads": os.environ.get("OPENBLAS_NUM_THREADS")}


def test_map_tasks_runs_any_function_over_any_tasks_in_pinned_workers():
    results = []
    executors.map_tasks(square_in_worker, [{"x": x} for x in range(5)], results.append, workers=2)
    assert sorted((r["x"], r["square"]) for r in results) == [(x, x * x) for x in range(5)]
    assert os.getpid() not in {r["pid"] for r in results}
    assert {r["threads"] for r in results} == {"1"}  # the default: one thread per worker
    executors.map_tasks(square_in_worker, [], results.append)  # nothing to do: no pool, no result
    assert len(results) == 5


def test_thread_pinning_environment():
    env = executors.thread_env(3)
    assert env["OMP_NUM_THREADS"] == env["OPENBLAS_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "3"
    assert executors.check_workers(None) == executors.available_cores()
    for bad in (0, -1, 1.5, True):
        with pytest.raises(PitcheckError, match="--workers must be a positive integer"):
            executors.check_workers(bad)


def test_local_pool_runs_cells_in_parallel_workers_with_pinned_threads(tmp_path):
    out = tmp_path / "cmp"
    saved = {k: os.environ.get(k) for k in executors.THREAD_VARIABLES}
    info = sw.sweep(out, tiny_grid(tmp_path), workers=2, progress=False)
    assert info["computed"] == 4
    pids = {json.loads(p.read_text())["pid"] for p in (out / "costs").glob("*.json")}
    assert 1 <= len(pids) <= 2 and os.getpid() not in pids  # worker processes ran the cells, at most two
    assert {k: os.environ.get(k) for k in executors.THREAD_VARIABLES} == saved  # the parent's settings are back
    # every worker's torch ran on one thread (2 cores / 2 workers)
    for d in (out / "cells").iterdir():
        manifest = json.loads((d / "manifest.json").read_text())
        assert manifest["torch_cpu_threads"] in (1, None)


def test_one_worker_computes_what_two_compute(tmp_path):
    grid = sw.override(tiny_grid(tmp_path), retraction=["cayley"])
    sw.sweep(tmp_path / "one", grid, workers=1, progress=False)
    sw.sweep(tmp_path / "two", grid, workers=2, progress=False)
    assert cells_text(tmp_path / "one") == cells_text(tmp_path / "two")
    assert (tmp_path / "one" / "summary.csv").read_bytes() == (tmp_path / "two" / "summary.csv").read_bytes()


def test_bad_executor_options(tmp_path, monkeypatch):
    with pytest.raises(PitcheckError, match="unknown executor 'dask'"):
        executors.map_tasks(square_in_worker, [], lambda r: None, executor="dask")
    with pytest.raises(PitcheckError, match="--address names a Ray cluster"):
        executors.map_tasks(square_in_worker, [], lambda r: None, address="ray://x:10001")
    real_import = builtins.__import__

    def no_ray(name, *args, **kwargs):
        if name == "ray":
            raise ImportError("No module named 'ray'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    with pytest.raises(PitcheckError, match=r"needs Ray: pip install 'pitcheck\[ray\]'"):
        executors.map_tasks(square_in_worker, [{"name": "x"}], lambda r: None, executor="ray")


def test_ray_gives_the_local_pool_s_results_bit_for_bit(tmp_path):
    ray = pytest.importorskip("ray")
    grid = tiny_grid(tmp_path)
    local = sw.sweep(tmp_path / "local", grid, workers=2, progress=False)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
             object_store_memory=executors.LOCAL_OBJECT_STORE_BYTES)
    try:
        remote = sw.sweep(tmp_path / "ray", grid, executor="ray", progress=False)
    finally:
        ray.shutdown()
    assert remote["computed"] == local["computed"] == 4
    assert cells_text(tmp_path / "ray") == cells_text(tmp_path / "local")
    assert (tmp_path / "ray" / "summary.csv").read_bytes() == (tmp_path / "local" / "summary.csv").read_bytes()
    hosts = {json.loads(p.read_text())["pid"] for p in (tmp_path / "ray" / "costs").glob("*.json")}
    assert os.getpid() not in hosts  # Ray's workers ran the cells


def test_cells_on_cuda_request_a_gpu():
    torch_auto = {"config": {"device": "auto", "backend": "torch", "vocab": 2048, "dim": 32}}
    assert needs_gpu(torch_auto, cluster_gpus=True)
    assert not needs_gpu(torch_auto, cluster_gpus=False)
    # a Z below GPU_MIN_ELEMENTS runs faster on a CPU core: 'auto' keeps it there (and asks Ray for no GPU)
    assert not needs_gpu({"config": {"device": "auto", "backend": "torch", "vocab": 128, "dim": 8}}, cluster_gpus=True)
    assert not needs_gpu({"config": {"device": "auto", "backend": "torch"}}, cluster_gpus=True)  # 1024 x 32
    assert needs_gpu({"config": {"device": "cuda", "backend": "torch", "vocab": 128, "dim": 8}}, cluster_gpus=True)
    assert not needs_gpu({"config": {"device": "auto", "backend": "numpy"}}, cluster_gpus=True)
    assert needs_gpu({"config": {"device": "cuda", "backend": "torch"}}, cluster_gpus=False)
    assert not needs_gpu({"config": {"device": "cpu", "backend": "torch"}}, cluster_gpus=True)


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # free once closed: nothing listens there


@pytest.mark.parametrize("scheme", ["", "ray://"])
def test_ray_address_where_nothing_listens_is_refused_within_seconds(tmp_path, scheme):
    """ray.init retried such an address for minutes, silently; the sweep now says so in one line."""
    import subprocess
    import sys
    import time

    pytest.importorskip("ray")
    grid = Path(tmp_path / "g.toml")
    grid.write_text('steps = 3\n[axes]\nretraction = ["qr"]\nprecision = ["fp64"]\nshape = ["32x4"]\n')
    address = f"{scheme}127.0.0.1:{_closed_port()}"
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pitcheck.cli", "compare", "--config", str(grid), "--executor", "ray",
                           "--address", address, "--no-progress", "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=120)
    assert time.monotonic() - t0 < 60
    assert proc.returncode == 2, proc.stderr
    assert f"cannot reach Ray at {address}" in proc.stderr and "Traceback" not in proc.stderr


def test_ray_address_check_is_fast_and_reads_the_address():
    import time

    t0 = time.monotonic()
    with pytest.raises(PitcheckError, match="cannot reach Ray"):
        executors.check_ray_address(f"127.0.0.1:{_closed_port()}")
    assert time.monotonic() - t0 < 5
    for bad in ("nohost", "127.0.0.1:", "127.0.0.1:99999", "host:port"):
        with pytest.raises(PitcheckError, match="not HOST:PORT"):
            executors.check_ray_address(bad)
    executors.check_ray_address("auto")  # the local cluster's file: Ray's to read
