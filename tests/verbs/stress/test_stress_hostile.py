"""pitcheck stress against careless or hostile input: no verdict from a run that judged nothing,
one directory per scenario whatever its name, JUnit that parses, and outputs checked before any run."""
import json
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from pitcheck.verbs import stress as scenarios
from pitcheck.cli import stress as stress_cli
from pitcheck.verbs.stress import BudgetResult, Check, Scenario, ScenarioResult, check_budget
from tests.helpers import stress_args

# a tiny run: numpy float64, V = 16, D = 4, 6 steps (recorded at 0..6), a budget every run holds
TINY = """
[scenario.{key}]
backend = "numpy"
precision = "fp64"
retraction = "qr"
steps = {steps}
vocab = 16
dim = 4
[scenario.{key}.budget]
orthonormality = 1.0
"""


def tiny(key: str, steps: int = 6) -> str:
    return TINY.format(key=key, steps=steps)




def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("pitcheck stress: error: ") and "\n" not in err, err
    return err


def _run_dirs(out: Path) -> list[Path]:
    return sorted(p.parent for p in out.rglob("metrics.csv"))


# ---------------------------------------------------------------- item 1: nothing judged is no pass

def test_zero_steps_is_refused_at_the_steps_line(tmp_path, capsys):
    f = _write(tmp_path / "s.toml", tiny("a", steps=0))
    assert stress_cli.main(stress_args([f], out=tmp_path / "o")) == 2
    err = _one_line_error(capsys)
    assert f"{f}:6:" in err and "steps" in err
    assert not _run_dirs(tmp_path / "o")  # refused before anything ran


def test_initial_state_scenario_runs_no_step_and_says_so(tmp_path, capsys):
    # the suite's bf16 storage floor is such a scenario: the start alone shows the rounding floor
    text = tiny("start", steps=0).replace("steps = 0", "steps = 0\ninitial_state = true")
    text += "[scenario.start.floor]\northonormality = 1e-300\n"
    f = _write(tmp_path / "s.toml", text)
    assert stress_cli.main(stress_args([f], json=tmp_path / "r.json")) == 0
    err = capsys.readouterr().err
    assert "initial state only" in err and "1 judged at step 0 only" in err
    [doc] = json.loads((tmp_path / "r.json").read_text())["scenarios"]
    assert doc["initial_state"] is True and {c["step"] for c in doc["checks"]} == {0}
    assert any(s.initial_state for s in scenarios.load_scenarios())


@pytest.mark.parametrize("text, line, what", [
    (tiny("a", steps=5).replace("steps = 5", "steps = 5\ninitial_state = true"), 7, "steps = 5"),
    (tiny("a", steps=0).replace("steps = 0", "steps = 0\ninitial_state = 1"), 7, "true or false"),
    (tiny("a", steps=0).replace("steps = 0", "steps = 0\ninitial_state = true")
     + "[scenario.a.budget.growth]\northonormality = 1\n", 13, "growth"),
])
def test_initial_state_misused_is_refused(tmp_path, capsys, text, line, what):
    f = _write(tmp_path / "s.toml", text)
    assert stress_cli.main(stress_args([f])) == 2
    err = _one_line_error(capsys)
    assert f"{f}:{line}:" in err and what in err


@pytest.mark.parametrize("kind", ["budget", "floor"])
def test_growth_budget_with_too_few_recorded_steps_is_refused(tmp_path, capsys, kind):
    # steps = 2 records steps 1 and 2 only: a line through two points always fits, whatever the growth
    text = tiny("a", steps=2) + f"[scenario.a.{kind}.growth]\northonormality = 0.5\n"
    f = _write(tmp_path / "s.toml", text)
    assert stress_cli.main(stress_args([f])) == 2
    err = _one_line_error(capsys)
    assert f"{f}:12:" in err and "growth" in err and "orthonormality" in err


def test_growth_with_three_recorded_steps_is_accepted(tmp_path):
    text = tiny("a", steps=3) + "[scenario.a.budget.growth]\northonormality = 5.0\n"
    [s] = scenarios.load_scenarios([_write(tmp_path / "s.toml", text)])
    assert [c.kind for c in s.checks] == ["max", "growth"]


def test_growth_that_cannot_be_fitted_is_inconclusive_not_held_nor_broken():
    # the metric is exactly 0 from step 1: no exponent can be measured
    rows = [{"step": s, "m": 0.0 if s else 1e-16} for s in range(0, 8)]
    r = check_budget(Check("m", "growth", 1.0), rows)
    assert not r.held and r.inconclusive and r.status == "INCONCLUSIVE"
    # two positive values are still too few to show a power law
    rows = [{"step": 0, "m": 1e-16}, {"step": 1, "m": 1e-15}, {"step": 2, "m": 2e-15}, {"step": 3, "m": 0.0}]
    assert check_budget(Check("m", "growth_floor", 0.1), rows).inconclusive
    ok = check_budget(Check("m", "growth", 1.5), [{"step": s, "m": 1e-16 * s} for s in range(0, 5)])
    assert ok.held and not ok.inconclusive and ok.status == "held"


def test_an_inconclusive_check_fails_the_scenario_and_says_so(tmp_path):
    s = Scenario("a", str(tmp_path / "s.toml"), None, [Check("m", "growth", 1.0)])
    r = ScenarioResult(s, checks=[check_budget(Check("m", "growth", 1.0), [{"step": 0, "m": 1.0}, {"step": 1, "m": 0.0}])])
    assert not r.held
    assert "INCONCLUSIVE" in scenarios.table([r])
    [case] = ET.fromstring(scenarios.junit_bytes([r])).iter("testcase")
    assert case.find("failure").get("type") == "Inconclusive"


# ---------------------------------------------------------------- item 2: one directory per scenario

@pytest.mark.parametrize("names", [("a b", "a_b"), ("qr-ü", "qr-é"), ("x/y", "x_y")])
def test_names_that_sanitise_alike_get_their_own_directories(tmp_path, capsys, names):
    f = _write(tmp_path / "s.toml", "".join(tiny(json.dumps(n)) for n in names))
    out = tmp_path / "o"
    assert stress_cli.main(stress_args([f], out=out, json=tmp_path / "r.json")) == 0
    dirs = _run_dirs(out)
    assert len(dirs) == 2 and all(d.parent == out / "s" for d in dirs), dirs
    doc = json.loads((tmp_path / "r.json").read_text())
    assert sorted(s["scenario"] for s in doc["scenarios"]) == sorted(names)


def test_names_longer_than_a_file_name_get_distinct_short_directories(tmp_path):
    names = ["x" * 300, "x" * 300 + "y"]
    f = _write(tmp_path / "s.toml", "".join(tiny(json.dumps(n)) for n in names))
    results = scenarios.run_scenarios(scenarios.load_scenarios([f]), tmp_path / "o")
    assert len({r.run_dir for r in results}) == 2 and all(len(Path(r.run_dir).name) < 120 for r in results)
    assert len(_run_dirs(tmp_path / "o")) == 2


def test_plain_names_keep_their_directory_name(tmp_path):
    f = _write(tmp_path / "s.toml", tiny('"qr-fp64_1.0"'))
    [r] = scenarios.run_scenarios(scenarios.load_scenarios([f]), tmp_path / "o")
    assert Path(r.run_dir) == tmp_path / "o" / "s" / "qr-fp64_1.0"


@pytest.mark.parametrize("name", ["..", ".", "...", "../..", "/etc"])
def test_dot_and_slash_names_stay_inside_their_file_directory(tmp_path, name):
    f = _write(tmp_path / "s.toml", tiny(json.dumps(name)))
    out = tmp_path / "o"
    [r] = scenarios.run_scenarios(scenarios.load_scenarios([f]), out)
    run_dir = Path(r.run_dir)
    assert run_dir.resolve().parent == (out / "s").resolve(), run_dir
    assert _run_dirs(tmp_path) == [run_dir]


@pytest.mark.parametrize("name", ["a\u0001b", "a\tb", "line\nbreak", "a\u2028b", "", "  ", "bell\u0007"])
def test_a_name_with_control_characters_or_blank_is_refused_at_its_line(tmp_path, capsys, name):
    f = _write(tmp_path / "s.toml", "# scenarios\n" + tiny(json.dumps(name)))
    assert stress_cli.main(stress_args([f])) == 2
    err = _one_line_error(capsys)
    assert f"{f}:3:" in err and "name" in err


def test_junit_parses_whatever_the_messages_hold(tmp_path):
    # text pitcheck does not refuse (a why, a run's error) may carry characters XML 1.0 cannot hold
    s = Scenario("a", str(tmp_path / "s.toml"), None, [Check("m", "max", 1.0)], why="bad \x01 \x1b[31m \ufffe why")
    c = BudgetResult(Check("m", "max", 1.0), 2.0, 3, False, "m reached 2 \x00 at step 3")
    r = ScenarioResult(s, checks=[c], errors=["run broke down: \x0b"])
    root = ET.fromstring(scenarios.junit_bytes([r]))
    failures = [f for f in root.iter("failure")]
    assert len(failures) == 2
    assert "\\x01" in failures[0].text and "\\x00" in failures[0].get("message")


def test_same_file_name_in_two_folders_runs_both_with_distinct_names(tmp_path, capsys):
    a = _write(tmp_path / "team1" / "ci.toml", tiny("x"))
    b = _write(tmp_path / "team2" / "ci.toml", tiny("x"))
    loaded = scenarios.load_scenarios([a, b])
    assert [s.id for s in loaded] == ["team1/ci::x", "team2/ci::x"]
    out = tmp_path / "o"
    assert stress_cli.main(stress_args([a, b], out=out, junit=tmp_path / "r.xml", json=tmp_path / "r.json")) == 0
    assert len(_run_dirs(out)) == 2
    table = capsys.readouterr().out
    assert "team1/ci::x" in table and "team2/ci::x" in table
    root = ET.parse(tmp_path / "r.xml").getroot()
    assert sorted(c.get("classname") for c in root.iter("testcase")) == ["team1/ci.x", "team2/ci.x"]
    assert sorted(s["id"] for s in json.loads((tmp_path / "r.json").read_text())["scenarios"]) == [
        "team1/ci::x", "team2/ci::x"]
    # --only takes a qualified name as well as a bare one
    assert stress_cli.main(stress_args([a, b], only="team2/ci::x", json=tmp_path / "r.json")) == 0
    assert [s["id"] for s in json.loads((tmp_path / "r.json").read_text())["scenarios"]] == ["team2/ci::x"]


def test_different_stems_keep_short_names(tmp_path):
    a = _write(tmp_path / "one" / "ci.toml", tiny("x"))
    b = _write(tmp_path / "two" / "nightly.toml", tiny("x"))
    assert [s.id for s in scenarios.load_scenarios([a, b])] == ["ci::x", "nightly::x"]


def test_the_same_file_given_twice_is_refused(tmp_path, capsys):
    f = _write(tmp_path / "d" / "s.toml", tiny("x"))
    (tmp_path / "link.toml").symlink_to(f)
    for second in (tmp_path / "d" / ".." / "d" / "s.toml", tmp_path / "link.toml"):
        assert stress_cli.main(stress_args([f, second])) == 2
        assert "given twice" in _one_line_error(capsys)


def test_two_files_that_cannot_be_told_apart_are_refused_naming_both(tmp_path, capsys):
    a = _write(tmp_path / "ci.toml", tiny("x"))
    b = _write(tmp_path / "ci.TOML", tiny("x"))
    assert stress_cli.main(stress_args([a, b])) == 2
    err = _one_line_error(capsys)
    assert str(a) in err and str(b) in err


def test_a_run_directory_that_would_hold_another_scenarios_plot_is_refused(tmp_path, capsys):
    # a broken budget on 'y' plots s/y-orthonormality.png: the scenario so named would share that path
    f = _write(tmp_path / "s.toml", tiny("y") + tiny('"y-orthonormality.png"'))
    assert stress_cli.main(stress_args([f], out=tmp_path / "o")) == 2
    err = _one_line_error(capsys)
    assert "'s::y'" in err and "y-orthonormality.png" in err
    assert not _run_dirs(tmp_path / "o")


def test_a_broken_budget_is_plotted_beside_its_run(tmp_path):
    f = _write(tmp_path / "s.toml", tiny("a").replace("orthonormality = 1.0", "orthonormality = 1e-30"))
    out = tmp_path / "o"
    assert stress_cli.main(stress_args([f], out=out)) == 1
    assert (out / "s" / "a-orthonormality.png").stat().st_size > 1000


# ---------------------------------------------------------------- item 3: outputs checked before any run

@pytest.mark.parametrize("make", [
    lambda t: dict(json=t / "r", junit=t / "r"),
    lambda t: dict(json=t / "r", junit=t / "x" / ".." / "r"),
    lambda t: dict(json=t / "o", out=t / "o"),
    lambda t: dict(junit=t / "o" / "s", out=t / "o"),       # the run directories of s.toml
    lambda t: dict(json=t / "o" / "s" / "r.json", out=t / "o"),  # o/s exists: an earlier run's
    lambda t: dict(json=t / "fresh", out=t / "fresh"),           # --out to be created, named by --json too
    lambda t: dict(json=t / "s.toml"),                       # the scenario file itself
    lambda t: dict(out=t / "afile" / "sub"),
    lambda t: dict(json=""),
])
def test_outputs_that_clash_or_cannot_be_created_are_refused_before_any_run(tmp_path, capsys, make):
    f = _write(tmp_path / "s.toml", tiny("a"))
    (tmp_path / "o" / "s").mkdir(parents=True)
    (tmp_path / "afile").write_text("")
    (tmp_path / "x").mkdir()
    kw = make(tmp_path)
    kw.setdefault("out", tmp_path / "o")
    assert stress_cli.main(stress_args([f], **kw)) == 2
    _one_line_error(capsys)
    assert not _run_dirs(tmp_path)
    assert (tmp_path / "s.toml").read_text() == tiny("a")


def test_distinct_outputs_beside_the_runs_are_accepted(tmp_path):
    f = _write(tmp_path / "s.toml", tiny("a"))
    out = tmp_path / "o"
    out.mkdir()
    assert stress_cli.main(stress_args([f], out=out, json=out / "r.json", junit=out / "r.xml")) == 0
    assert json.loads((out / "r.json").read_text())["held"] is True
    ET.parse(out / "r.xml")


def test_outputs_through_a_link_keep_the_link_and_a_fifo_is_written_in_place(tmp_path):
    """stress writes with rundir.write_atomic like every verb: a link's target is replaced, the link kept;
    a FIFO (a stand-in for /dev/null) is written in place, not replaced by a regular file."""
    import os
    import threading
    f = _write(tmp_path / "s.toml", tiny("a"))
    target = tmp_path / "target.json"
    link = tmp_path / "link.json"
    link.symlink_to(target)
    fifo = tmp_path / "fifo.xml"
    os.mkfifo(fifo)
    got = {}
    reader = threading.Thread(target=lambda: got.setdefault("xml", fifo.read_bytes()))
    reader.start()
    assert stress_cli.main(stress_args([f], json=link, junit=fifo)) == 0
    reader.join(10)
    assert link.is_symlink() and json.loads(target.read_text())["held"] is True
    assert fifo.exists() and not fifo.is_file()  # still a FIFO
    ET.fromstring(got["xml"])
