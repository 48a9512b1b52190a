"""Baseline heads: standard tying and untied tables drift off W E = I where PIT does not."""
import math

import numpy as np
import pytest

from pitcheck import PitcheckError, cli
from pitcheck.model.engine import Engine, StepSettings
from pitcheck.model.heads import HEADS, PIT_ONLY, get_head
from pitcheck.numerics.policy import get_policy
from pitcheck.infra.rundir import read_metrics
from pitcheck.trajectory import RunConfig, run

BASE = dict(vocab=400, dim=8, steps=200, adversary="gaussian,dense_output", lr=0.05)


@pytest.mark.parametrize("head", ["tied", "untied"])
def test_baselines_drift_where_pit_stays_consistent(tmp_path, head):
    base = run(RunConfig(**BASE, head=head), tmp_path / head)
    pit = run(RunConfig(**BASE, head="pit"), tmp_path / "pit")
    assert base[0]["pinv_drift"] < 1e-14  # both start from the same orthonormal Z0
    assert base[-1]["pinv_drift"] > 1e-3
    assert pit[-1]["pinv_drift"] < 1e-12
    assert all(math.isnan(base[-1][k]) for k in ("cond_T", "trisolve_forward"))


def test_tied_drift_is_the_tables_orthonormality_loss(tmp_path):
    rows = run(RunConfig(**BASE, head="tied"), tmp_path)
    # W E - I = E^T E - I for standard tying
    assert rows[-1]["pinv_drift"] == pytest.approx(rows[-1]["orthonormality"], rel=1e-10)


def test_untied_tables_see_independent_gradients(tmp_path):
    run(RunConfig(**BASE, head="untied"), tmp_path)
    with np.load(tmp_path / "checkpoint.npz") as ck:
        E, B = ck["engine_master_E"], ck["engine_master_B"]
    assert not np.allclose(E, B)


def test_baseline_on_torch_with_shadow(tmp_path):
    cfg = RunConfig(**{**BASE, "steps": 30}, head="untied", backend="torch", precision="bf16-mixed", device="cpu")
    rows = run(cfg, tmp_path)
    assert 0 < rows[-1]["shadow_Z"] < 0.05 and 0 < rows[-1]["shadow_T"] < 0.05


def test_bad_head_options_are_clear(tmp_path, capsys):
    with pytest.raises(PitcheckError, match="unknown head"):
        run(RunConfig(head="shared"), tmp_path / "a")
    with pytest.raises(PitcheckError, match="adaptive"):
        run(RunConfig(head="tied", adversary="adaptive"), tmp_path / "b")
    assert cli.main(["run", "--head", "tied", "--vocab", "50", "--dim", "4", "--steps", "3",
                     "--out", str(tmp_path / "c")]) == 0
    assert read_metrics(tmp_path / "c" / "metrics.csv")[-1]["step"] == 3


@pytest.mark.parametrize("name,has_retraction,not_applicable,parameters,moments", [
    ("pit", True, set(), ["Z", "raw"], ["mZ", "vZ", "mL", "vL"]),
    ("tied", False, set(PIT_ONLY) | {"shadow_T"}, ["E"], ["mE", "vE"]),
    ("untied", False, set(PIT_ONLY), ["E", "B"], ["mE", "vE", "mB", "vB"]),
])
def test_the_head_registry(name, has_retraction, not_applicable, parameters, moments):
    head = get_head(name)
    assert head.name == name and head.has_retraction is has_retraction and head.not_applicable == not_applicable
    eng = Engine("numpy", get_policy("fp64"), StepSettings("qr", "adam", 0.1), head=head)
    eng.initialise(np.eye(6, 2), np.eye(2))
    assert isinstance(eng.model, head) and eng.head == name
    assert list(eng.master) == parameters and list(eng.opt) == moments
    # only PIT builds a retraction: the tables never retract
    assert hasattr(eng.model, "retract") is has_retraction
    # T's metrics are measured exactly when there is a T
    row = eng.interface()
    assert [math.isnan(row[k]) for k in PIT_ONLY] == [not has_retraction] * len(PIT_ONLY)


def test_head_names():
    assert HEADS == ("pit", "tied", "untied")
    with pytest.raises(PitcheckError, match="unknown head 'shared'; choose from pit, tied, untied"):
        get_head("shared")
    for head in HEADS:  # one Engine for every head; only PIT's builds a retraction
        eng = Engine("numpy", get_policy("fp64"), StepSettings("qr", "sgd", 0.1), "cpu", head=get_head(head))
        assert eng.head == head and hasattr(eng.model, "retract") == get_head(head).has_retraction


def _never(*args, **kw):
    raise AssertionError("a sweep ran: the input should have been refused first")


@pytest.mark.parametrize("reference", ["lm", "gaussian,lm", "adaptive+lm", "gaussian+lm"])
def test_heads_reference_of_the_lm_source_is_refused_before_running(tmp_path, reference, monkeypatch, capsys):
    """Its cells were labelled 'lm' and mixed into the real-training table."""
    import pitcheck.verbs.compare

    monkeypatch.setattr(pitcheck.verbs.compare, "compare", _never)
    assert cli.main(["heads", "--reference", reference, "--out", str(tmp_path / "h"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--reference" in err[0] and "lm" in err[0]
    assert not (tmp_path / "h").exists()


def test_heads_outputs_that_cannot_be_written_are_refused_before_running(tmp_path, monkeypatch, capsys):
    import pitcheck.verbs.compare

    monkeypatch.setattr(pitcheck.verbs.compare, "compare", _never)
    (tmp_path / "h" / "heads.csv").mkdir(parents=True)
    assert cli.main(["heads", "--reference", "none", "--out", str(tmp_path / "h"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "heads.csv is a directory" in err[0]
