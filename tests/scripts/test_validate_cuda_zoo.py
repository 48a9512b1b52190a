"""scripts/gpu_check.sh's zoo section (tests/zoo through `pitcheck validate --device cuda`) cannot run here:
its script is checked for syntax and through its dry path, and scripts/studies/validate_zoo.py, which the section
runs, is run on the CPU with the options the section gives it."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_check_has_a_zoo_section_within_the_call_limit(tmp_path):
    assert subprocess.run(["bash", "-n", str(ROOT / "scripts" / "gpu_check.sh")]).returncode == 0
    env = {**os.environ, "OUT": str(tmp_path / "out"), "DRY": "1", "PYTHON": sys.executable}
    dry = subprocess.run(["bash", "scripts/gpu_check.sh", "zoo", "validate"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    lines = dry.stdout.splitlines()
    limits = {ln.split()[0]: int(ln.split()[1]) for ln in lines if ln.endswith(" s") and not ln.startswith("total")}
    assert set(limits) == {"zoo", "validate"} and f"total {sum(limits.values())} s of 600 s" in lines
    assert sum(limits.values()) < 600 and "warning" not in dry.stderr
    # a call naming more than a call's time is warned of; an unknown section is refused
    every = subprocess.run(["bash", "scripts/gpu_check.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=120)
    assert every.returncode == 0 and "over a call's 600 s" in every.stderr and "zoo 300 s" in every.stdout
    bad = subprocess.run(["bash", "scripts/gpu_check.sh", "nosuch"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and "unknown section nosuch" in bad.stderr


def test_validate_zoo_runs_targets_at_once_on_a_device_and_keeps_a_summary(tmp_path):
    out = tmp_path / "zoo"
    proc = subprocess.run([sys.executable, "scripts/studies/validate_zoo.py", "--device", "cpu", "--dtypes", "float32",
                           "--jobs", "2", "--timeout", "8", "--vocab", "64", "--dim", "4", "--steps", "5",
                           "--only", "correct_cayley,broken_negative_ids,hang", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = (out / "zoo.md").read_text()
    assert "--device cpu" in summary.splitlines()[0] and "Unexpected outcomes: none." in summary
    rows = {ln.split("|")[2].strip(): ln for ln in summary.splitlines() if ln.startswith("| float32 ")}
    assert set(rows) == {"correct_cayley", "broken_negative_ids", "hang"}
    # a timeout's row keeps the whole reason: how long each phase took
    assert "timed out after 8 s during" in rows["hang"] and "slowest phases: " in rows["hang"], rows["hang"]
    assert "| 1 | bad_input |" in rows["broken_negative_ids"]
