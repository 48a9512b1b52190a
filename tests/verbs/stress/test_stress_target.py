"""pitcheck stress on the user's own module: `target = "module:factory"` in a scenario, stepped in its own
process, judged against the budgets; exit_status as validate's."""
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from pitcheck.cli import stress as stress_cli
from pitcheck.verbs import stress as scenarios
from pitcheck.verbs.stress import StressInputError, load_file, stress
from tests.helpers import stress_args

SCENARIO = """
[scenario.{name}]
target = "{target}"
steps = {steps}
vocab = 128
dim = 8
{extra}
"""


def _file(tmp_path, *scenarios_text, name="mine.toml"):
    f = tmp_path / name
    f.write_text("".join(scenarios_text))
    return f


def _one(name, target, steps=40, extra=""):
    return SCENARIO.format(name=name, target=target, steps=steps, extra=extra)


CORRECT = "tests.zoo.correct_cholesky_qr:make"
NO_RETRACTION = "tests.zoo.broken_no_retraction:make"


def test_a_correct_module_holds_its_default_budgets(tmp_path):
    r = stress(_file(tmp_path, _one("chol", CORRECT)))
    assert r.held and r.exit_status == 0
    [res] = r.results
    metrics = {c.check.metric for c in res.checks}
    assert {"orthonormality", "pinv_drift", "penrose"} <= metrics
    assert all(c.held and c.value > 0 for c in res.checks)  # measured, not a vacuous pass


def test_a_module_without_retraction_breaks_with_its_budget_named(tmp_path, capsys):
    f = _file(tmp_path, _one("drifts", NO_RETRACTION, steps=100), _one("chol", CORRECT))
    junit = tmp_path / "r.xml"
    code = stress_cli.main(stress_args([f], junit=junit))
    cap = capsys.readouterr()
    assert code == 1
    assert "BROKEN mine::drifts: orthonormality reached" in cap.err
    assert "pinv_drift" in cap.err
    root = ET.parse(junit).getroot()
    failed = {c.get("classname") + "/" + c.get("name") for c in root.iter("testcase") if c.find("failure") is not None}
    assert "mine.drifts/orthonormality" in failed and not any(n.startswith("mine.chol/") for n in failed)
    r = stress(f, only=["drifts"])
    assert not r.held and r.exit_status == 1 and r.broken[0].scenario.name == "drifts"


def test_an_unimportable_target_is_exit_2_with_one_reason(tmp_path, capsys):
    f = _file(tmp_path, _one("gone", "tests.zoo.unimportable:make", steps=5))
    r = stress(f)
    assert r.exit_status == 2 and not r.held
    assert "cannot import tests.zoo.unimportable:make" in r.results[0].fatal
    junit = tmp_path / "r.xml"
    assert stress_cli.main(stress_args([f], junit=junit)) == 2
    err = capsys.readouterr().err
    assert "ERROR mine::gone: cannot import" in err and "Traceback" not in err
    assert ET.parse(junit).getroot().find(".//testcase/error") is not None


def test_a_missing_target_file_is_exit_2(tmp_path):
    r = stress(_file(tmp_path, _one("nofile", "nowhere.py:make", steps=5)))
    assert r.exit_status == 2 and "does not exist" in r.results[0].fatal


def test_a_target_file_is_found_beside_the_scenario_file(tmp_path):
    zoo = Path(__file__).parents[2] / "zoo" / "correct_cholesky_qr.py"
    (tmp_path / "mypit.py").write_text(zoo.read_text())
    r = stress(_file(tmp_path, _one("beside", "mypit.py:make", steps=20)))
    assert r.exit_status == 0, r.results[0].fatal


def test_a_tighter_user_threshold_breaks_where_the_default_holds(tmp_path):
    from pitcheck.verbs.stress.target import default_limit

    assert default_limit("float32", 8) > 1e-9
    tight = "[scenario.tight.budget]\npinv_drift = 1e-9\n"
    r = stress(_file(tmp_path, _one("default", CORRECT), _one("tight", CORRECT, extra=tight)))
    default, strict = r.results
    assert default.held
    assert strict.broken and r.exit_status == 1
    [broken] = [c for c in strict.checks if not c.held]
    assert broken.check.metric == "pinv_drift" and broken.check.limit == 1e-9
    assert "over its budget 1e-09" in broken.message


def test_the_scenarios_optimizer_replaces_the_modules_own(tmp_path):
    """lr = 1e-9: the scenario's SGD barely moves it, so the no-retraction module stays within its budgets
    (its own optimizer, at its rate, breaks them over as many steps)."""
    f = _file(tmp_path, _one("crawl", NO_RETRACTION, steps=100, extra='optimizer = "sgd"\nlr = 1e-9'),
              _one("own", NO_RETRACTION, steps=100))
    crawl, own = stress(f).results
    assert crawl.held and own.broken


@pytest.mark.parametrize("extra, message", [
    ('retraction = "qr"', "retraction does not apply to a target scenario"),
    ("colour = 3", "unknown key 'colour'"),
    ('dtype = "float8"', "dtype must be one of"),
    ('adversary = "normal"', "'normal' has no form as a loss"),
    ('require_events = ["breakdown"]', "require_events does not apply to a target scenario"),
    ("timeout = -1", "timeout must be a positive number"),
    ("[scenario.x.budget]\nshadow_Z = 1e-3", "budget on shadow_Z, which a target's maps do not show"),
])
def test_a_target_scenarios_bad_keys_name_file_and_line(tmp_path, extra, message):
    f = _file(tmp_path, _one("x", CORRECT, extra=extra))
    with pytest.raises(StressInputError, match="mine.toml:[0-9]+: .*" + message.replace("(", r"\(")):
        load_file(f)


def test_target_is_a_known_key_and_a_bad_target_is_refused(tmp_path):
    [s] = load_file(_file(tmp_path, _one("ok", CORRECT)))
    assert s.target == CORRECT and s.own_optimizer
    with pytest.raises(StressInputError, match=r"mine.toml:3: .*not of the form module:factory"):
        load_file(_file(tmp_path, _one("bad", "no_colon_here")))
    with pytest.raises(StressInputError, match="dtype applies to a target scenario only"):
        load_file(_file(tmp_path, '[scenario.y]\ndtype = "float32"\n[scenario.y.budget]\northonormality = 1\n'))


def test_exit_status_on_pitchecks_own_scenarios(tmp_path):
    text = """
[scenario.held]
backend = "numpy"
precision = "fp64"
steps = 10
vocab = 32
dim = 4
[scenario.held.budget]
orthonormality = 1e-12
"""
    assert scenarios.stress(_file(tmp_path, text)).exit_status == 0
    broken = text.replace("held", "tight").replace("1e-12", "1e-30")
    assert scenarios.stress(_file(tmp_path, broken, name="b.toml")).exit_status == 1


@pytest.mark.parametrize("dtype,u", [("float32", 2.0**-24), ("bfloat16", 2.0**-8), ("float64", 2.0**-53)])
def test_the_default_ceiling_is_validates_threshold_at_cond_10_in_units_of_u(dtype, u):
    # TAU (16) x cond(T) 10 x (u + sqrt(D) min(u, u_fp32)): u = 2^-p of the dtype, not its eps (2u)
    from pitcheck.verbs.stress.target import default_limit

    D = 8
    assert default_limit(dtype, D) == pytest.approx(16 * 10 * (u + D ** 0.5 * min(u, 2.0**-24)), rel=1e-12)


@pytest.mark.parametrize("option", ["json", "junit"])
def test_an_output_naming_the_target_or_the_scenario_file_is_refused_before_any_run(tmp_path, capsys, option):
    zoo = Path(__file__).parents[2] / "zoo" / "correct_cholesky_qr.py"
    code = zoo.read_text()
    (tmp_path / "mypit.py").write_text(code)
    f = _file(tmp_path, _one("beside", "mypit.py:make", steps=20))
    text = f.read_text()
    for victim, words in ((tmp_path / "mypit.py", "the target source of scenario 'beside'"),
                          (f, "the scenario file")):
        assert stress_cli.main(stress_args([f], **{option: victim})) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0] and "name another file" in err[0], err
    assert (tmp_path / "mypit.py").read_text() == code and f.read_text() == text


@pytest.mark.parametrize("cond", [1.0, 1e3])
def test_a_targets_orthonormality_is_the_frobenius_norm_every_run_records(cond):
    # read off the maps (eigenvalues of W E), the same ||Z^T Z - I||_F a pitcheck run's column holds
    import numpy as np

    from pitcheck.numerics import metrics, reference
    from pitcheck.verbs.stress.target import measure
    from tests.helpers import pit_pair

    Z, L = pit_pair(64, 8, cond, seed=2)
    Z = Z @ np.diag(1 + 1e-4 * np.arange(8))  # off the manifold: Z^T Z - I = diag((1 + 1e-4 k)^2 - 1)
    got = measure(reference.embedding_matrix(Z, L), reference.head_matrix(Z, L))["orthonormality"]
    assert got == pytest.approx(metrics.orthonormality_loss(Z), rel=1e-6)


def test_default_ceilings_are_named_default_and_the_frobenius_ones_scale_by_sqrt_d(tmp_path):
    import json

    from pitcheck.verbs.stress.target import default_limit

    D = 8
    assert default_limit("float32", D, "orthonormality") == pytest.approx(D ** 0.5 * default_limit("float32", D))
    assert default_limit("float32", D, "pinv_drift") == pytest.approx(D ** 0.5 * default_limit("float32", D))
    f = _file(tmp_path, _one("mine", CORRECT, steps=20, extra='source = "user"\n[scenario.mine.budget]\n'
                                                               "pinv_drift = 1e-3\n"))
    out = tmp_path / "r.json"
    assert stress_cli.main(stress_args([f], json=out)) == 0
    s = json.loads(out.read_text())["scenarios"][0]
    sources = {c["metric"]: c["source"] for c in s["checks"]}
    assert sources == {"pinv_drift": "user", "orthonormality": "default", "penrose": "default"}
    # the options of pitcheck's own model, which a target scenario does not run, are not reported as its
    assert s["config"]["dtype"] == "float32" and not {"precision", "retraction", "head", "backend"} & set(s["config"])
