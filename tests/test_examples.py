"""examples/ run as a user would run them: each file copied into a fresh directory beside the example
module examples/mypit.py, its commands run there, and their exit statuses and reports checked."""
import os
import shlex
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
BIN = Path(sys.executable).parent


def project(tmp_path: Path) -> Path:
    """A user's repository: mypit.py, the same module as mypkg/pit.py, and the example files."""
    for name in ("mypit.py", "budgets.toml", "test_mypit.py", "api.py"):
        shutil.copy(EXAMPLES / name, tmp_path / name)
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    shutil.copy(EXAMPLES / "mypit.py", tmp_path / "mypkg" / "pit.py")
    return tmp_path


def env() -> dict:
    e = dict(os.environ)
    e["PATH"] = f"{BIN}{os.pathsep}{e.get('PATH', '')}"
    e.pop("PYTHONPATH", None)
    return e


def run(cmd, cwd, timeout=120):
    proc = subprocess.run(cmd, cwd=cwd, env=env(), capture_output=True, text=True, timeout=timeout,
                          shell=isinstance(cmd, str))
    return proc


def workflow_commands() -> list[str]:
    doc = yaml.safe_load((EXAMPLES / "github-actions.yml").read_text())
    commands = []
    for job in doc["jobs"].values():
        for step in job["steps"]:
            for line in step.get("run", "").splitlines():
                if line.strip().startswith("pitcheck "):
                    commands.append(line.strip())
    return commands


def test_the_workflow_is_a_valid_github_actions_file():
    doc = yaml.safe_load((EXAMPLES / "github-actions.yml").read_text())
    steps = doc["jobs"]["validate"]["steps"]
    runs = "\n".join(s.get("run", "") for s in steps)
    assert "--index-url https://download.pytorch.org/whl/cpu" in runs
    assert runs.index("download.pytorch.org/whl/cpu") < runs.index("pip install \"pitcheck")
    setup = next(s for s in steps if s.get("uses", "").startswith("actions/setup-python"))
    assert setup["with"]["cache"] == "pip"
    upload = next(s for s in steps if s.get("uses", "").startswith("actions/upload-artifact"))
    assert upload["if"] == "always()" and "report.xml" in upload["with"]["path"]


def test_the_workflows_pitcheck_commands_pass_on_the_example_module(tmp_path):
    cwd = project(tmp_path)
    commands = workflow_commands()
    assert any(c.startswith("pitcheck validate mypkg.pit:make") and "--junit report.xml" in c for c in commands)
    for command in commands:
        proc = run(shlex.split(command), cwd)
        assert proc.returncode == 0, f"{command}\n{proc.stdout}\n{proc.stderr}"
    suite = ET.parse(cwd / "report.xml").getroot()
    cases = suite.iter("testcase")
    assert len(list(cases)) >= 10
    assert (cwd / "budgets.xml").exists()


def test_the_pytest_file_runs_with_the_plugin(tmp_path):
    cwd = project(tmp_path)
    proc = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_mypit.py",
                "--pitcheck", "mypit.py:make", "--pitcheck-vocab", "64", "--pitcheck-dim", "8",
                "--pitcheck-steps", "20", "--junitxml", "pitcheck.xml"], cwd)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    names = [c.get("name") for c in ET.parse(cwd / "pitcheck.xml").getroot().iter("testcase")]
    assert "test_embed_and_logits_are_pseudo_inverses" in names
    assert "pitcheck[mypit.py:make-float32-penrose]" in names
    assert sum(n.startswith("pitcheck[") for n in names) == 10


def test_the_budgets_file_holds_through_pitcheck_stress(tmp_path):
    cwd = project(tmp_path)
    proc = run(["pitcheck", "stress", "budgets.toml", "--junit", "budgets.xml", "--out", "runs"], cwd)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "held" in proc.stdout
    assert ET.parse(cwd / "budgets.xml").getroot() is not None


def test_the_budgets_file_breaks_when_a_budget_is_too_tight(tmp_path):
    cwd = project(tmp_path)
    text = (cwd / "budgets.toml").read_text().replace("pinv_drift = 1e-4", "pinv_drift = 1e-12")
    (cwd / "budgets.toml").write_text(text)
    proc = run(["pitcheck", "stress", "budgets.toml", "--out", "runs"], cwd)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "BROKEN" in proc.stdout + proc.stderr


def test_the_api_script_runs(tmp_path):
    cwd = project(tmp_path)
    proc = run([sys.executable, "api.py"], cwd)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 of 10 checks failed" in proc.stdout or "pass" in proc.stdout
    assert "||W E - I||_F" in proc.stdout
    assert "budgets: held" in proc.stdout
