"""Baseline heads: standard tying and untied tables drift off W E = I where PIT does not."""
import math

import numpy as np
import pytest

from pitcheck import PitcheckError, cli
from pitcheck.trajectory import RunConfig, read_metrics, run

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
