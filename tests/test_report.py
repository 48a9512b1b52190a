"""The comparison grid, its table and plots."""
import json

import pytest

from pitcheck import PitcheckError, cli
from pitcheck.report import compare, plot_runs
from pitcheck.trajectory import RunConfig


def test_compare_writes_table_plot_and_resumes(tmp_path):
    base = RunConfig(vocab=64, dim=4, steps=10, device="cpu")
    summary = compare(tmp_path, base, ["fp64", "fp32"], ["qr", "cayley"], progress=False)
    assert [(s["precision"], s["retraction"]) for s in summary] == [
        ("fp64", "qr"), ("fp64", "cayley"), ("fp32", "qr"), ("fp32", "cayley")]
    report = (tmp_path / "report.md").read_text()
    assert report.count("\n| fp") == 4 and "| fp32 | cayley |" in report
    assert (tmp_path / "compare.png").stat().st_size > 10_000
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    # a second call finds every run finished and gives the same numbers
    assert compare(tmp_path, base, ["fp64", "fp32"], ["qr", "cayley"], progress=False) == summary


def test_compare_and_plot_reject_bad_input(tmp_path, capsys):
    with pytest.raises(PitcheckError, match="unknown precision"):
        compare(tmp_path, RunConfig(), ["fp12"], ["qr"])
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
