"""Plots of run directories, and compare's refusal of unknown names."""
import pytest

from pitcheck import PitcheckError, cli
from pitcheck.report import plot_runs


def test_compare_and_plot_reject_bad_input(tmp_path, capsys):
    with pytest.raises(PitcheckError, match="not a run directory"):
        plot_runs([tmp_path], tmp_path / "x.png", ["pinv_drift"])
    assert cli.main(["compare", "--retractions", "qr,nope", "--out", str(tmp_path / "c")]) == 2
    assert "unknown retraction 'nope'" in capsys.readouterr().err


def test_plot_runs_draws_any_metric(tmp_path):
    cli.main(["run", "--vocab", "40", "--dim", "4", "--steps", "5", "--out", str(tmp_path / "r")])
    png = plot_runs([tmp_path / "r"], tmp_path / "p.png", ["orthonormality", "cond_T"])
    assert png.stat().st_size > 5_000
    with pytest.raises(PitcheckError, match="unknown metric"):
        plot_runs([tmp_path / "r"], tmp_path / "q.png", ["speed"])
