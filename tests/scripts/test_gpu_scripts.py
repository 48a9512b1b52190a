"""The GPU scripts (scripts/studies/gpu_bench.py, scripts/studies/gpu_runs.py) run on the CPU too: they must
not rot between the sessions that are lent a GPU, whose minutes are too few to debug a script in."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[2]


def _script(name, *args, tmp_path):
    out = tmp_path / f"{name}.json"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "studies" / name), *args, "--out", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(out.read_text())


def test_gpu_bench_times_every_map_and_says_where_it_lands(tmp_path):
    doc = _script("gpu_bench.py", "--device", "cpu", "--shapes", "96x8", "--precisions", "fp32",
                  "--step-precisions", "fp32", "--step-retractions", "qr", "--run-shapes", "96x8",
                  "--run-precisions", "fp32", "--repeats", "3", tmp_path=tmp_path)
    rows = {r["retraction"]: r for r in doc["retractions"]}
    assert "none" not in rows and {"qr", "cholqr2", "cayley", "polar"} <= set(rows)
    for name in ("qr", "cholqr2", "cayley"):  # retractions: on the manifold to a few hundred u
        assert rows[name]["ms"] > 0 and rows[name]["ortho_over_u"] < 300, rows[name]
    # an approximate map is timed and flagged, and its distance is reported, not hidden
    assert rows["ns5"]["approximate"] and rows["ns5"]["ortho_over_u"] > 1e3
    assert doc["steps"][0]["what"] == "step:qr" and doc["steps"][0]["ms"] > 0
    run = doc["run_steps"][0]
    assert run["amortised_ms"] >= run["step_ms"] > 0 and run["gemm_ms"] > 0  # no timing is asserted


def test_gpu_runs_reports_a_run_in_units_of_its_precision(tmp_path):
    doc = _script("gpu_runs.py", "--precisions", "fp32,bf16", "--vocab", "64", "--dim", "8", "--steps", "5",
                  "--cpu-steps", "5", tmp_path=tmp_path)
    runs = {r["precision"]: r for r in doc["runs"] if r["device"] == "cpu"}
    assert set(runs) == {"fp32", "bf16"} and all("error" not in r for r in runs.values())
    assert runs["fp32"]["u"] == 2.0**-24 and runs["bf16"]["u"] == 2.0**-8
    assert runs["fp32"]["pinv_drift_over_u"] == pytest.approx(runs["fp32"]["pinv_drift"] / 2.0**-24)
    # bf16 storage is far from its float64 shadow, fp32 is not
    assert runs["bf16"]["shadow_Z"] > 100 * runs["fp32"]["shadow_Z"]
