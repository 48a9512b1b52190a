"""The compare grids' `shards` axis: cells whose Z is row-sharded over gloo ranks (`pitcheck run --shards`)
beside one-process cells; a grid without the axis keeps its cell names, grid.json and summary.csv bytes."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from pitcheck.verbs import compare as sw
from pitcheck.infra.errors import PitcheckError
from pitcheck.verbs.compare.grid import Grid
from pitcheck.verbs.compare.summary import sharded_columns, summary_csv

SHARDED = """
steps = 8
records_per_decade = 4
[axes]
retraction = ["cholqr2"]
precision = ["fp32"]
shape = ["47x4"]
shards = [1, 2]
seed = [0]
[fixed]
device = "cpu"
"""
RESULTS = Path(__file__).resolve().parents[3] / "results"


def _grid(tmp_path, text):
    path = tmp_path / "grid.toml"
    path.write_text(text)
    return sw.load_grid(str(path))


@pytest.mark.parametrize("value, message", [
    ("[0]", "axis shards must hold integers >= 1"),
    ("['2']", "axis shards must hold integers >= 1"),
    ("[true]", "axis shards must hold integers >= 1"),
    ("[1.5]", "axis shards must hold integers >= 1"),
    ("[2, 2]", "repeats a value"),
    ("[48]", "--shards must be in \\[1, V = 47\\]"),
])
def test_bad_shards_axis_is_a_one_line_error(tmp_path, value, message):
    with pytest.raises(PitcheckError, match=message) as err:
        _grid(tmp_path, SHARDED.replace("shards = [1, 2]", f"shards = {value}"))
    assert "\n" not in str(err.value)


def test_shards_is_an_axis_not_a_fixed_option(tmp_path):
    with pytest.raises(PitcheckError, match="'shards' is an axis"):
        _grid(tmp_path, SHARDED + "shards = 2\n")


def test_cell_names_and_groups_gain_shards_only_above_one(tmp_path):
    grid = _grid(tmp_path, SHARDED)
    one, two = sw.cells(grid)
    assert "shards" not in one.name and "-47x4-shards2-" in two.name
    assert one.group[-1] == 1 and two.group[-1] == 2 and one.group[:-1] == two.group[:-1]
    # the same cell without the axis in the file: the very name it had before the axis existed
    plain = _grid(tmp_path, SHARDED.replace("shards = [1, 2]\n", ""))
    assert [c.name for c in sw.cells(plain)] == [one.name] and "shards" not in plain.to_json()["axes"]
    # a sharded fp64 cell runs on torch (the distributed retractions), not on the numpy reference
    fp64 = _grid(tmp_path, SHARDED.replace('["fp32"]', '["fp64"]'))
    assert [c.config.backend for c in sw.cells(fp64)] == ["numpy", "torch"]


def test_a_grid_with_shards_one_and_two_runs_and_reports_both(tmp_path):
    grid = _grid(tmp_path, SHARDED)
    out = tmp_path / "cmp"
    info = sw.compare(out, grid, workers=1, progress=False)
    assert info["computed"] == 2
    header = (out / "summary.csv").read_text().splitlines()[0].split(",")
    assert header == sharded_columns(sw.SUMMARY_COLUMNS, grid) and header[header.index("dim") + 1] == "shards"
    assert (out / "cost.csv").read_text().splitlines()[0].split(",") == sharded_columns(sw.COST_COLUMNS, grid)
    rows = sw.read_summary(out / "summary.csv")
    assert sorted(r["shards"] for r in rows) == [1, 2]
    by = {r["shards"]: r for r in rows}
    assert math.isfinite(by[1]["ms_per_step"]) and math.isnan(by[2]["ms_per_step"])  # not measured: shared cores
    for r in rows:  # both are the same orthonormal trajectory up to the sums' order
        assert r["final_orthonormality"] < 1e-5 and r["breakdowns"] == 0
    sharded_rows = sw.read_summary(out / "summary.csv")
    table = sw.table_lines(sharded_rows)
    assert table[0].split(" | ")[2] == "shards"
    assert {line.split(" | ")[2] for line in table[2:]} == {"1", "2"}
    report = (out / "report.md").read_text()
    assert "| shards |" in report and "shards 1/2" in report
    cell = next(d for d in (out / "cells").iterdir() if "shards2" in d.name)
    last = (cell / "metrics.csv").read_text().splitlines()
    assert last[0].endswith("shard_distance_Z,shard_distance_T,replica_spread") and last[-1].endswith(",0.0")


@pytest.mark.parametrize("study", ["compare", "frontier"])
def test_a_grid_without_the_axis_keeps_its_committed_summary_bytes(study):
    """The committed summaries, read back and written for their own grid (no shards axis), byte for byte."""
    committed = RESULTS / study / "summary.csv"
    g = json.loads((RESULTS / study / "grid.json").read_text())
    grid = Grid(axes=g["axes"], steps=g["steps"], records_per_decade=g["records_per_decade"], source=g["source"])
    assert sharded_columns(sw.SUMMARY_COLUMNS, grid) == sw.SUMMARY_COLUMNS
    rows = sw.read_summary(committed)
    assert all(r["shards"] == 1 for r in rows)
    assert summary_csv(rows, sharded_columns(sw.SUMMARY_COLUMNS, grid)) == committed.read_bytes()
    assert sw.table_lines(rows)[0].split(" | ")[2] != "shards"  # the axis does not vary: not shown


@pytest.mark.parametrize("value, message", [("0", "axis shards must hold integers >= 1"),
                                            ("1,x", "--shards must be a comma-separated list of integers")])
def test_compare_shards_option_is_checked_before_any_cell_runs(tmp_path, capsys, value, message):
    from pitcheck.cli import main

    path = tmp_path / "grid.toml"
    path.write_text(SHARDED.replace("shards = [1, 2]\n", ""))
    assert main(["compare", "--config", str(path), "--shards", value, "--out", str(tmp_path / "o"),
                 "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and not (tmp_path / "o").exists()
