"""scripts/measurements/device_accuracy.py runs on the CPU between GPU sessions: its CPU column is the
distance each exact map lands from the manifold, in units of u of float32, checked against float32's floor."""
import importlib.util
import json
import math
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("device_accuracy", ROOT / "scripts/measurements/device_accuracy.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cpu_column_lands_each_exact_map_near_float32s_floor(tmp_path, capsys):
    script = _script()
    assert script.main(["--shape", "512x16", "--retractions", "qr,polar,polar-gram,cholqr2",
                        "--out", str(tmp_path / "acc.json")]) == 0
    doc = json.loads((tmp_path / "acc.json").read_text())
    assert [r["retraction"] for r in doc["rows"]] == ["qr", "polar", "polar-gram", "cholqr2"]
    for row in doc["rows"]:
        # an exact map's result rounded to float32 sits within a small multiple of D u of the manifold
        assert 0 < row["cpu"] < 16 * row["dim"] and math.isfinite(row["cpu"])
        assert ("cuda" in row) == (doc["device"] is not None)
    assert "polar-gram" in capsys.readouterr().out


def test_gpu_check_runloop_section_fits_its_limit():
    """gpu_check.sh's runloop section (this script, bench --device cuda on both streams, the CUDA normals) is planned on the
    dry path, and its commands' own time limits sum to no more than the section's."""
    import os
    import re
    import subprocess

    dry = subprocess.run(["bash", "scripts/gpu_check.sh", "runloop"], cwd=ROOT, env={**os.environ, "DRY": "1"},
                         capture_output=True, text=True, timeout=120)
    assert dry.returncode == 0 and "runloop 300 s" in dry.stdout, dry.stdout + dry.stderr
    body = re.search(r"^runloop\(\) \{\n(.*?)^\}", (ROOT / "scripts/gpu_check.sh").read_text(), re.S | re.M).group(1)
    limits = [int(n) for n in re.findall(r"timeout -k 10 (\d+) ", body)]
    assert len(limits) == 5 and sum(limits) <= 300  # one call of at most 5 minutes
    assert "--gradient-stream counter" in body and "--device cuda" in body and "device_accuracy.py" in body
    assert "test_counter_normal.py" in body and "test_counter_normal_fused.py" in body


def test_gpu_check_grid_section_costs_the_grid_on_cuda_within_its_limit():
    """The grid section is planned on the dry path with its limit, and asks bench for the grid on CUDA."""
    import os
    import re
    import subprocess

    dry = subprocess.run(["bash", "scripts/gpu_check.sh", "grid"], cwd=ROOT, env={**os.environ, "DRY": "1"},
                         capture_output=True, text=True, timeout=120)
    assert dry.returncode == 0 and "grid 200 s" in dry.stdout, dry.stdout + dry.stderr
    body = re.search(r"^grid\(\) \{\n(.*?)^\}", (ROOT / "scripts/gpu_check.sh").read_text(), re.S | re.M).group(1)
    assert "--grid" in body and "--device cuda" in body and "${LIMIT[grid]}" in body


def test_gpu_check_segment_section_runs_the_smollm2_shape_and_times_the_draws_within_its_limit():
    """The segment section is planned on the dry path with its limit: a 1000-step run at 49152 x 576 on CUDA, then
    the normals' timing, whose limits add up to the section's."""
    import os
    import re
    import subprocess

    dry = subprocess.run(["bash", "scripts/gpu_check.sh", "segment"], cwd=ROOT, env={**os.environ, "DRY": "1"},
                         capture_output=True, text=True, timeout=120)
    assert dry.returncode == 0 and "segment 120 s" in dry.stdout, dry.stdout + dry.stderr
    body = re.search(r"^segment\(\) \{\n(.*?)^\}", (ROOT / "scripts/gpu_check.sh").read_text(), re.S | re.M).group(1)
    assert "--vocab 49152 --dim 576 --steps 1000" in body and "--device cuda" in body
    assert "$(( LIMIT[segment] - 30 ))" in body and "timeout -k 10 30 " in body and "counter_normal_timing.py" in body


def test_the_run_profile_script_profiles_each_part_on_cpu_tensors(tmp_path):
    """scripts/measurements/gpu_run_profile.py (gpu_check.sh's profile section) runs on CPU tensors at a small shape
    and writes each part's wall, kernel time and busiest ops."""
    import subprocess
    import sys

    out = tmp_path / "profile.json"
    done = subprocess.run([sys.executable, "scripts/measurements/gpu_run_profile.py", "--shape", "256x16", "--steps", "1",
                           "--rows", "3", "--device", "cpu", "--out", str(out)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    parts = json.loads(out.read_text())["parts"]
    assert list(parts) == ["step:cholqr2", "step:qr", "run step:cholqr2", "metrics row", "commit"]
    for part in parts.values():
        assert part["wall_ms"] > 0 and part["kernel_ms"] == 0 and len(part["top_cpu"]) == 3
