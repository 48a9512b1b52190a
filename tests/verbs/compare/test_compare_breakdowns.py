"""compare's verdict by a breakdown's cause: a retraction is unsafe for its own breakdowns (Z broke while T was
resolvable, and not under every retraction), never for T's; rows it cannot judge are listed, not recommended on;
the exit status says whether the study ran.

The cells are a real tiny sweep; the breakdowns and T's conditioning are written into copies of its cell
directories, as a run that broke down leaves them (the breakdown event last, its last good state recorded)."""
from __future__ import annotations

import csv
import io
import json
import shutil

import pytest

from pitcheck import cli
from pitcheck.verbs import compare as sw
from pitcheck.trajectory.events import breakdown
from pitcheck.numerics.policy import get_policy
from pitcheck.infra.rundir import events_bytes, read_events

RETRACTIONS = ["qr", "polar", "cholqr2"]
GRID = {"steps": 40, "records_per_decade": 10,
        "axes": {"retraction": RETRACTIONS, "precision": ["fp32"], "adversary": ["gaussian"], "shape": ["32x4"],
                 "seed": [0]}}
NOT_JUDGED = "T blew up whichever the retraction: not a judgement of the retraction"
U = get_policy("fp32").u


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    out = tmp_path_factory.mktemp("breakdowns") / "cmp"
    grid = sw.grid_from_dict(GRID, "test")
    sw.sweep(out, grid, workers=1, progress=False)
    return out, grid


@pytest.fixture
def study(swept, tmp_path):
    src, grid = swept
    out = tmp_path / "cmp"
    shutil.copytree(src, out)
    return out, grid


def _cell(out, grid, retraction):
    (cell,) = [c for c in sw.cells(grid) if c.config.retraction == retraction]
    return sw.cell_dir(out, cell)


def break_down(out, grid, retraction, part, cond_T=None):
    """End the cell's run with a breakdown of `part` after its last recorded step, as a run does; with
    cond_T, every recorded step before it had that conditioning."""
    d = _cell(out, grid, retraction)
    if cond_T is not None:
        set_cond_T(out, grid, retraction, cond_T)
    last = max(int(r["step"]) for r in csv.DictReader(io.StringIO((d / "metrics.csv").read_text())))
    events = read_events(d / "events.jsonl") + [{"step": last + 1, **breakdown(f"{part} broke", part)}]
    (d / "events.jsonl").write_bytes(events_bytes(events))


def set_cond_T(out, grid, retraction, cond_T):
    path = _cell(out, grid, retraction) / "metrics.csv"
    reader = csv.DictReader(io.StringIO(path.read_text()))
    rows = list(reader)
    for r in rows:
        r["cond_T"] = repr(float(cond_T))
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=reader.fieldnames, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    path.write_text(buf.getvalue())


def judged(out, grid):
    rows = sw.summarise(out, grid, sw.cells(grid))
    (v,) = sw.verdicts(rows)
    return {r["retraction"]: r for r in rows}, v


def test_a_breakdown_under_every_retraction_counts_against_none_and_its_rows_are_not_judged(study):
    out, grid = study
    for ret in RETRACTIONS:
        break_down(out, grid, ret, "Z")
    rows, v = judged(out, grid)
    assert all(r["breakdowns"] == 1 and r["breakdowns_own"] == 0 and r["not_judged"] == 1 for r in rows.values())
    assert v["unsafe"] == [] and v["best"] is None and v["safe"] == []
    assert [e["retraction"] for e in v["not_judged"]] == RETRACTIONS
    line = sw.verdict_lines(list(rows.values()))[2]
    assert "Z broke down" not in line and NOT_JUDGED in line and "qr (gaussian, 1 of 1 seeds)" in line


def test_a_retraction_that_breaks_down_alone_is_unsafe_and_the_others_are_judged(study):
    out, grid = study
    break_down(out, grid, "cholqr2", "Z")
    rows, v = judged(out, grid)
    assert rows["cholqr2"]["breakdowns_own"] == 1 and rows["cholqr2"]["not_judged"] == 0
    assert [(u["retraction"], u["why"]) for u in v["unsafe"]] == [("cholqr2", "Z broke down in 1 of 1 seeds")]
    assert v["not_judged"] == [] and v["best"]["retraction"] in ("qr", "polar")
    assert sw.verdict_lines(list(rows.values()))[2].endswith("| none |")  # nothing left unjudged


def test_one_retraction_alone_in_its_grid_is_judged_by_its_breakdown(study):
    """'Under every retraction' needs two or more: a grid of one cannot clear its own breakdown."""
    out, grid = study
    break_down(out, grid, "qr", "Z")
    one = sw.override(grid, retraction=["qr"])
    rows, v = judged(out, one)
    assert rows["qr"]["breakdowns_own"] == 1 and [u["retraction"] for u in v["unsafe"]] == ["qr"]


@pytest.mark.parametrize("part", ["T", "L"])
def test_a_breakdown_of_T_or_L_is_never_the_retraction_s(study, part):
    """The fp16-mixed finding: L non-finite was counted as "Z broke down" and made qr and polar unsafe."""
    out, grid = study
    break_down(out, grid, "qr", part)
    rows, v = judged(out, grid)
    assert rows["qr"]["breakdowns_T"] == 1 and rows["qr"]["breakdowns_own"] == 0 and rows["qr"]["not_judged"] == 1
    assert v["unsafe"] == [] and [e["retraction"] for e in v["not_judged"]] == ["qr"]
    assert v["best"]["retraction"] in ("polar", "cholqr2")  # recommended on the rows that judge


@pytest.mark.parametrize("cond_u, own", [(0.5, False), (0.02, True)])
def test_Z_breaking_after_T_passed_what_the_precision_resolves_is_not_the_retraction_s(study, cond_u, own):
    out, grid = study
    break_down(out, grid, "polar", "Z", cond_T=cond_u / U)
    rows, v = judged(out, grid)
    assert rows["polar"]["breakdowns_own"] == int(own) and rows["polar"]["not_judged"] == int(not own)
    assert [u["retraction"] for u in v["unsafe"]] == (["polar"] if own else [])


@pytest.mark.parametrize("resolvable_in_one", [False, True])
def test_T_blowing_up_under_every_retraction_judges_none_even_where_no_run_ended(study, resolvable_in_one):
    out, grid = study
    break_down(out, grid, "qr", "L", cond_T=1e30)
    break_down(out, grid, "polar", "T", cond_T=1e30)
    set_cond_T(out, grid, "cholqr2", 10.0 if resolvable_in_one else 1e30)
    rows, v = judged(out, grid)
    assert rows["cholqr2"]["breakdowns"] == 0 and rows["cholqr2"]["not_judged"] == int(not resolvable_in_one)
    if resolvable_in_one:
        assert v["best"]["retraction"] == "cholqr2"
    else:
        assert v["best"] is None and [e["retraction"] for e in v["not_judged"]] == RETRACTIONS


def test_compare_exits_0_when_cells_broke_down_and_its_report_says_what_it_could_not_judge(study, capsys):
    out, grid = study
    break_down(out, grid, "qr", "L")
    break_down(out, grid, "cholqr2", "Z")
    path = out.parent / "grid.toml"
    path.write_text('steps = 40\nrecords_per_decade = 10\n[axes]\nretraction = ["qr", "polar", "cholqr2"]\n'
                    'precision = ["fp32"]\nadversary = ["gaussian"]\nshape = ["32x4"]\nseed = [0]\n')
    assert cli.main(["compare", "--config", str(path), "--out", str(out), "--no-progress"]) == 0
    captured = capsys.readouterr()
    assert "2 of 3 runs broke down, kept as results: 1 counted against their retraction, 1 not" in captured.out
    report = (out / "report.md").read_text()
    line = next(x for x in report.splitlines() if x.startswith("| fp32 |"))  # the verdict's, before the table's
    assert "cholqr2 (Z broke down in 1 of 1 seeds)" in line and f"qr (gaussian, 1 of 1 seeds): {NOT_JUDGED}" in line
    assert "**polar**" in line
    assert "| 1 (0; 1) | 0 |" in report and "| 1 (1; 0) | 1 |" in report  # cholqr2's and qr's table rows


def test_compare_of_a_study_whose_models_break_down_at_once_runs_to_its_report(tmp_path, capsys):
    """A cell whose model breaks down inside its cost timing too (a huge lr) is a result, not a crash."""
    out = tmp_path / "cmp"
    assert cli.main(["compare", "--retractions", "qr,polar", "--precisions", "fp64", "--adversary", "gaussian",
                     "--lr", "1e6", "--vocab", "16", "--dim", "4", "--steps", "5", "--seeds", "0", "--workers", "1",
                     "--out", str(out), "--no-progress"]) == 0
    assert "2 of 2 runs broke down, kept as results: 0 counted against" in capsys.readouterr().out
    costs = [json.loads(p.read_text()) for p in sorted((out / "costs").iterdir())]
    assert len(costs) == 2 and all(c["ms_per_step"] != c["ms_per_step"] for c in costs)  # NaN: no step timed
    assert NOT_JUDGED in (out / "report.md").read_text()


def test_a_summary_written_before_breakdowns_had_causes_reads_as_it_was_judged(tmp_path):
    """Without breakdowns_own and not_judged: a T breakdown is not the retraction's, any other is."""
    row = {k: 0 for k in sw.SUMMARY_COLUMNS}
    row.update(retraction="qr", precision="fp32", adversary="gaussian", optimizer="sgd", head="pit", breakdowns=3,
               breakdowns_T=1)
    old = [k for k in sw.SUMMARY_COLUMNS if k not in ("breakdowns_own", "not_judged")]
    from pitcheck.verbs.compare.summary import summary_csv

    (tmp_path / "summary.csv").write_bytes(summary_csv([row], old))
    (r,) = sw.read_summary(tmp_path / "summary.csv")
    assert (r["breakdowns_own"], r["not_judged"]) == (2, 1)
    assert sw.own_breakdowns(r) == 2 and not sw.judgeable(r)


@pytest.mark.parametrize("blown", [True, False])
def test_steps_a_retraction_failed_count_against_it_unless_T_blew_up_whichever_the_retraction(study, blown):
    """The fp16-mixed finding: polar-gram and polar-ns failed steps from the step where T blew up under every
    retraction; those follow from T. The same failures where T stayed resolvable are the retraction's."""
    out, grid = study
    for ret in RETRACTIONS:
        set_cond_T(out, grid, ret, 1e30 if blown else 10.0)
    d = _cell(out, grid, "cholqr2")
    failed = [{"step": 30 + k, "event": "retraction_failed", "action": "step skipped"} for k in range(3)]
    (d / "events.jsonl").write_bytes(events_bytes(read_events(d / "events.jsonl") + failed))
    rows, v = judged(out, grid)
    assert rows["cholqr2"]["failed_retractions"] == 3
    assert rows["cholqr2"]["failed_retractions_judged"] == (0 if blown else 3)
    assert [u["retraction"] for u in v["unsafe"]] == ([] if blown else ["cholqr2"])
