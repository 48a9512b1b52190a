"""pitcheck stress (pitcheck.verbs.stress, pitcheck.cli.stress): scenario files, budgets, exit codes, table, JSON and JUnit output."""
import json
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from pitcheck.verbs import stress as scenarios
from pitcheck.cli import stress as stress_cli
from pitcheck.verbs.stress import Check, check_budget
from tests.helpers import stress_args

TINY = """
[scenario.{name}]
backend = "numpy"
precision = "fp64"
retraction = "{retraction}"
steps = 20
vocab = 32
dim = 4
seed = 0
source = "theory"
why = "tiny test run"
[scenario.{name}.budget]
orthonormality = {budget}
"""




def _write(tmp_path, text, name="s.toml"):
    f = tmp_path / name
    f.write_text(text)
    return f


def test_held_budget_exits_0(tmp_path, capsys):
    f = _write(tmp_path, TINY.format(name="qr-held", retraction="qr", budget="1e-12"))
    assert stress_cli.main(stress_args([f])) == 0
    out = capsys.readouterr().out
    assert "qr-held" in out and "orthonormality" in out and "held" in out and "headroom" in out


def test_broken_budget_exits_1_names_the_metric_and_plots_it(tmp_path, capsys):
    f = _write(tmp_path, TINY.format(name="none-drifts", retraction="none", budget="1e-10")
               + TINY.format(name="qr-holds", retraction="qr", budget="1e-12"))
    out = tmp_path / "out"
    code = stress_cli.main(stress_args([f], out=out, junit=tmp_path / "r.xml", json=tmp_path / "r.json"))
    assert code == 1
    cap = capsys.readouterr()
    assert "BROKEN s::none-drifts: orthonormality reached" in cap.err and "budget from theory" in cap.err
    assert "qr-holds" in cap.out and "BROKEN" in cap.out
    assert (out / "s" / "none-drifts-orthonormality.png").stat().st_size > 1000  # beside its run
    assert (out / "s" / "none-drifts" / "metrics.csv").exists()
    root = ET.parse(tmp_path / "r.xml").getroot()
    assert root.get("tests") == "2" and root.get("failures") == "1"
    failures = root.findall(".//testcase/failure")
    assert len(failures) == 1 and "orthonormality" in failures[0].get("message")
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["held"] is False
    by = {s["scenario"]: s for s in doc["scenarios"]}
    assert by["none-drifts"]["held"] is False and by["qr-holds"]["held"] is True
    assert by["none-drifts"]["checks"][0]["value"] > 1e-10


@pytest.mark.parametrize("text, where, what", [
    ("[scenario.a]\nsteps = 10\nvocab = = 3\n", ":3:", "malformed TOML"),
    (TINY.format(name="a", retraction="qr", budget="1e-12").replace("steps = 20", "stepz = 20"), ":6:",
     "unknown key 'stepz' (did you mean 'steps'?)"),
    (TINY.format(name="a", retraction="qr", budget="1e-12").replace("orthonormality =", "orthonormalty ="), ":13:",
     "budget on unknown metric 'orthonormalty' (did you mean 'orthonormality'?)"),
    (TINY.format(name="a", retraction="qr", budget="1e-12") + "[scenario.a.budget.growth]\nfoo = 1\n", ":15:",
     "budget.growth on unknown metric 'foo'"),
    (TINY.format(name="a", retraction="qr", budget="1e-12").replace("steps = 20", 'steps = "20"'), ":6:",
     "steps must be an int"),
    (TINY.format(name="a", retraction="qr", budget="-1"), ":13:", "must be a positive finite number"),
    (TINY.format(name="a", retraction="qr", budget="1e-12").replace("budget]\northonormality", "budget]\nshadow_Z"),
     ":2:", "budget on shadow_Z, which this run does not record"),
    (TINY.format(name="a", retraction="qr", budget="1e-12") + "[scenario.a]\n", "", "malformed TOML"),
    (TINY.format(name="a", retraction="qrr", budget="1e-12"), ":2:", "unknown retraction 'qrr'"),
    (TINY.format(name="a", retraction="qr", budget="1e-12").replace('source = "theory"', 'source = "guess"'), ":10:",
     "source must be one of theory, measured, user"),
    (TINY.format(name="a", retraction="qr", budget="1e-12").replace('why', 'require_events = ["reprojectd"]\nwhy'),
     ":11:", "unknown event 'reprojectd'"),
    ("[scenarios.a]\nsteps = 1\n", ":1:", "unknown top-level key 'scenarios'"),
    ("[scenario.a]\nsteps = 1\n", ":1:", "has nothing to check"),
])
def test_bad_input_exits_2_with_file_and_line(tmp_path, capsys, text, where, what):
    f = _write(tmp_path, text)
    assert stress_cli.main(stress_args([f])) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err  # one line
    assert err.startswith(f"pitcheck stress: error: {f}{where}"), err
    assert what in err, err


def test_missing_file_and_bad_output_paths_exit_2(tmp_path, capsys):
    assert stress_cli.main(stress_args([tmp_path / "nope.toml"])) == 2
    assert "nope.toml: no such file" in capsys.readouterr().err
    f = _write(tmp_path, TINY.format(name="a", retraction="qr", budget="1e-12"))
    assert stress_cli.main(stress_args([f], junit=tmp_path)) == 2
    assert "--junit" in capsys.readouterr().err
    assert stress_cli.main(stress_args([f], only="b")) == 2


def test_growth_judged_from_step_1():
    rising = [{"step": 0, "m": 1e-20}] + [{"step": s, "m": 1e-7 * s**0.5} for s in (1, 10, 100, 1000)]
    assert abs(scenarios.growth_exponent(rising, "m") - 0.5) < 1e-12  # step 0 is ignored
    assert check_budget(Check("m", "growth", 0.6), rising).held
    assert not check_budget(Check("m", "growth", 0.4), rising).held
    assert check_budget(Check("m", "growth_floor", 0.4), rising).held
    assert not check_budget(Check("m", "growth_floor", 0.6), rising).held
    assert not check_budget(Check("m", "growth", 1.0), rising[:2]).held  # too few points to fit: not a pass


def test_ceiling_reports_worst_value_and_step_and_nan_breaks_it():
    rows = [{"step": 0, "m": 1e-9}, {"step": 5, "m": 3e-7}, {"step": 9, "m": 2e-7}]
    r = check_budget(Check("m", "max", 1e-6), rows)
    assert r.held and r.value == 3e-7 and r.step == 5 and r.headroom == "3.33x"
    r = check_budget(Check("m", "max", 1e-7), rows)
    assert not r.held and "3.000e-07 at step 5" in r.message
    r = check_budget(Check("m", "max", 1.0), rows + [{"step": 10, "m": float("nan")}])
    assert not r.held and "NaN at step 10" in r.message
    assert not check_budget(Check("m", "floor", 1e-6), rows).held and check_budget(Check("m", "floor", 1e-7), rows).held


def test_cuda_scenario_is_skipped_without_a_gpu(tmp_path, monkeypatch):
    monkeypatch.setattr(scenarios.runner, "cuda_available", lambda: False)
    text = TINY.format(name="gpu", retraction="qr", budget="1e-12").replace('backend = "numpy"', 'backend = "torch"')
    text = text.replace('precision = "fp64"', 'precision = "fp32"\ndevice = "cuda"')
    f = _write(tmp_path, text)
    [s] = scenarios.load_scenarios([f])
    assert s.requires == "cuda"
    [r] = scenarios.run_scenarios([s], tmp_path / "o")
    assert r.skipped and "skipped" in scenarios.table([r])
    root = ET.fromstring(scenarios.junit_bytes([r]))
    assert root.get("skipped") == "1" and root.get("failures") == "0"


def test_adversary_params_and_events(tmp_path):
    text = TINY.format(name="a", retraction="qr", budget="1e-12").replace(
        'why', 'adversary = "gaussian,nonfinite"\nrequire_events = ["nonfinite_gradient"]\nforbid_events = ["breakdown"]\nwhy')
    text += "[scenario.a.adversary_params]\nnonfinite_probability = 0.5\n"
    [s] = scenarios.load_scenarios([_write(tmp_path, text)])
    assert s.config.adversary_params.nonfinite_probability == 0.5
    r = scenarios.run_scenario(s, tmp_path / "run")
    assert r.held, (r.errors, [c.message for c in r.checks])
    s.require_events = ["reprojected"]
    r = scenarios.run_scenario(s, tmp_path / "run")
    assert not r.held and r.errors == ["no reprojected event was recorded"]


def test_the_suite_loads_and_the_module_runs_as_a_command(tmp_path):
    assert len(scenarios.load_scenarios()) >= 20
    f = _write(tmp_path, TINY.format(name="a", retraction="cholqr2", budget="1e-12"))
    p = subprocess.run([sys.executable, "-m", "pitcheck.cli", "stress", str(f)], capture_output=True, text=True,
                       cwd=Path(__file__).resolve().parents[3], timeout=120)
    assert p.returncode == 0, p.stderr
    assert "all 1 budgets held in 1 scenarios" in p.stderr



def test_list_shows_the_suite(capsys):
    assert stress_cli.main(stress_args([], list=True)) == 0
    out = capsys.readouterr().out
    assert "retractions::fp64-cholqr2  [theory]" in out and "(needs CUDA)" in out


def test_the_library_returns_results_and_raises_what_the_cli_prints(tmp_path):
    f = _write(tmp_path, TINY.format(name="a", retraction="qr", budget="1e-12"))
    outcome = scenarios.stress([f], json=tmp_path / "r.json")
    assert outcome.held and [r.scenario.id for r in outcome.results] == ["s::a"] and outcome.plots == []
    assert json.loads((tmp_path / "r.json").read_text())["held"] is True
    with pytest.raises(scenarios.StressInputError, match="no such scenario"):
        scenarios.stress([f], only=["b"])


def test_an_output_that_fails_after_the_runs_still_shows_the_table(tmp_path, capsys, monkeypatch):
    from pitcheck.infra.errors import PitcheckError

    def refuse(path, data):
        raise PitcheckError(f"cannot write {path}: disk full")

    monkeypatch.setattr(scenarios, "write_atomic", refuse)
    f = _write(tmp_path, TINY.format(name="a", retraction="qr", budget="1e-12"))
    assert stress_cli.main(stress_args([f], json=tmp_path / "r.json")) == 2
    cap = capsys.readouterr()
    assert "s::a" in cap.out and cap.err.strip().endswith(f"pitcheck stress: error: cannot write {tmp_path / 'r.json'}: disk full")
