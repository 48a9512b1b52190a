"""A placement that would touch none of a run's tensors (Adam's moments placed narrow under an optimizer that
keeps none) is refused by runs and stress scenarios alike, as a sharded run refuses one: a run recorded as
fp8-adam whose numbers are fp32's would be a silent wrong label."""
from dataclasses import replace
from pathlib import Path

import pytest

from pitcheck import PitcheckError
from pitcheck.cli import stress as stress_cli
from pitcheck.trajectory import RunConfig, run
from tests.helpers import stress_args

SMALL = RunConfig(backend="torch", precision="fp8-adam", optimizer="sgd", vocab=32, dim=4, steps=4,
                  records_per_decade=4, device="cpu", shadow=False)

SCENARIO = """
[scenario.moments-under-sgd]
backend = "torch"
precision = "{precision}"
optimizer = "{optimizer}"
steps = 4
vocab = 32
dim = 4
device = "cpu"
shadow = false
[scenario.moments-under-sgd.budget]
orthonormality = 1.0
"""


@pytest.mark.parametrize("precision", ["fp8-adam", "fp8-adam-delayed"])
def test_a_moments_placement_under_sgd_is_refused_before_the_directory(tmp_path, precision):
    with pytest.raises(PitcheckError, match=f"--precision {precision} .*--optimizer sgd keeps none"):
        run(replace(SMALL, precision=precision), tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("optimizer", ["adam", "momentum"])
def test_a_moments_placement_under_an_optimizer_with_moments_is_accepted(optimizer):
    replace(SMALL, optimizer=optimizer).validate()


def test_a_stress_scenario_with_a_placement_that_never_applies_is_refused(tmp_path, capsys):
    f = tmp_path / "s.toml"
    f.write_text(SCENARIO.format(precision="fp8-adam", optimizer="sgd"), encoding="utf-8")
    assert stress_cli.main(stress_args([f], out=tmp_path / "o")) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "moments-under-sgd" in err and "never apply" in err, err
    assert not list(Path(tmp_path / "o").rglob("metrics.csv"))
