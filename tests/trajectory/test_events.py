"""The run's events (pitcheck/trajectory/events.py): their kinds, which of them skip a step, the rules that turn a
recorded row into events (exact values, no run), and, through the public run API, that each level of a
metric is reported once, at the first recorded row above it."""
import json
import math

import numpy as np
import pytest

from pitcheck.trajectory.events import (SKIPS_STEP, THRESHOLDS, EventKind, breakdown, ends_run, malformed, raised_by,
                             row_events, skipped_steps_by_event, skips_step)
from pitcheck.infra.rundir import read_events
from pitcheck.trajectory import RunConfig, run

METRICS = ["orthonormality", "pinv_drift", "cond_T", "breakdown_margin", "trisolve_forward"]


def quiet(**over):
    """A row below every level, resolved and finite; `over` changes some values."""
    row = {"orthonormality": 1e-13, "pinv_drift": 1e-13, "cond_T": 1.0, "breakdown_margin": 0.5,
           "trisolve_forward": 1e-15, "trisolve_resolved": True}
    row.update(over)
    return row


# ---- kinds ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind, skips", [
    ("nonfinite_gradient", True), ("gradient_overflow", True), ("nonfinite_state", True),
    ("retraction_failed", True), ("reprojected", False), ("threshold_crossed", False),
    ("precision_cannot_resolve", False), ("nonfinite_metric", False), ("breakdown", False),
])
def test_which_kinds_skip_a_step(kind, skips):
    assert EventKind(kind).value == kind  # the kinds are the strings events.jsonl holds
    # as read back from events.jsonl: a new string, and whatever action text it carries does not matter
    event = json.loads(json.dumps({"event": kind, "action": "step skipped" if not skips else "", "step": 3}))
    assert skips_step(event) is skips and (kind in SKIPS_STEP) is skips


def test_the_engine_emits_only_known_kinds_and_every_skip_says_so():
    # the kinds the engine's step writes, with their actions (test_engine pins when they happen)
    emitted = [{"event": "nonfinite_gradient", "action": "step skipped"},
               {"event": "gradient_overflow", "format": "bf16", "loss_scale": 1.0, "action": "step skipped"},
               {"event": "gradient_overflow", "loss_scale": 2.0, "action": "step skipped, loss scale halved"},
               {"event": "nonfinite_state", "action": "step skipped"},
               {"event": "retraction_failed", "message": "x", "action": "step skipped"},
               {"event": "reprojected", "orthonormality": 1.0, "after": 0.0}]
    for e in emitted:
        assert skips_step(e) == ("step skipped" in e.get("action", ""))
    assert skipped_steps_by_event([{**e, "step": n} for n, e in enumerate(emitted)]) == {
        "nonfinite_gradient": 1, "gradient_overflow": 2, "nonfinite_state": 1, "retraction_failed": 1}


def test_a_breakdown_event_and_the_one_that_ends_a_run():
    e = breakdown("L lost its diagonal")
    assert e == {"event": "breakdown", "reason": "L lost its diagonal", "action": "run ended"}
    assert type(e["event"]) is str and json.dumps(e, sort_keys=True).startswith('{"action": "run ended", "event"')
    events = [{"event": "threshold_crossed", "step": 4}, {**e, "step": 8}]
    assert ends_run(events, 1, 7) and not ends_run(events, 1, 8) and not ends_run(events, 0, 3)
    assert not ends_run([{**e, "step": 8}, {"event": "reprojected", "step": 8}], 0, 7)  # not the last
    assert not ends_run([{"event": "reprojected", "step": 8}], 0, 7)  # the last, at the step, but no breakdown
    assert not ends_run([{**e, "step": 9}], 0, 7)  # a breakdown after the step that follows the checkpoint
    # steps and positions past the integers Python caches: compared by value, not identity
    assert ends_run([{**e, "step": 100001}], 0, 100000)
    long = [{"event": "threshold_crossed", "step": k} for k in range(299)] + [{**e, "step": 1000}]
    assert ends_run(long, 299, 999)


def test_a_breakdown_names_the_part_that_broke_and_the_sweep_counts_T_by_it():
    """The part (heads.StateBreakdown.part) is written when known; the sweep counts T breakdowns by it, and
    an event written before breakdowns had a part by its reason's wording."""
    from pitcheck.verbs.compare.summary import breaks_T

    t = breakdown("L's diagonal reached 0 at row 3", "T")
    assert list(t) == ["event", "reason", "part", "action"] and t["part"] == "T"
    assert breaks_T(t) and not breaks_T(breakdown("Z has non-finite entries", "Z"))
    assert not breaks_T(breakdown("L's diagonal reached 0", "Z"))  # the part decides, not the wording
    assert breaks_T({"event": "breakdown", "reason": "the float64 shadow: L's diagonal reached 0"})  # old events
    assert not breaks_T({"event": "breakdown", "reason": "Z has non-finite entries"})
    assert not breaks_T({"event": "threshold_crossed", "part": "T"})


@pytest.mark.parametrize("event, problem", [
    ({"event": "threshold_crossed", "metric": "cond_T", "level": 100.0}, None),
    ({"event": "threshold_crossed", "metric": "loss", "level": 1.0}, "a threshold event for 'loss' at level 1.0"),
    ({"event": "threshold_crossed", "metric": "cond_T", "level": "high"},
     "a threshold event for 'cond_T' at level 'high'"),
    ({"event": "nonfinite_metric", "metrics": ["cond_T"]}, None),
    ({"event": "nonfinite_metric", "metrics": "cond_T"}, "a nonfinite_metric event without its metrics"),
    ({"event": "breakdown", "reason": "x"}, None),
    ({"event": "breakdown"}, "a breakdown event without its reason"),
    ({"event": "nonfinite_state"}, None),
])
def test_what_resuming_refuses_in_an_event(event, problem):
    assert malformed(event) == problem


# ---- the rules -----------------------------------------------------------------------------------------
def test_the_levels_are_the_documented_ones():
    assert THRESHOLDS == {"orthonormality": (1e-12, 1e-8, 1e-6, 1e-4, 1e-2, 1e-1),
                          "pinv_drift": (1e-12, 1e-8, 1e-6, 1e-4, 1e-2, 1e-1),
                          "cond_T": (1e2, 1e4, 1e8, 1e12), "breakdown_margin": (1.0,)}


@pytest.mark.parametrize("row, u, events, raised", [
    (quiet(), 2.0**-24, [], set()),
    # a jump past three levels is one event at the highest, and raises all three
    (quiet(orthonormality=5e-5), 2.0**-24,
     [{"event": "threshold_crossed", "metric": "orthonormality", "level": 1e-6, "value": 5e-5}],
     {"orthonormality>1e-12", "orthonormality>1e-08", "orthonormality>1e-06"}),
    # a value exactly at a level is not above it
    (quiet(orthonormality=1e-4), 1.0,
     [{"event": "threshold_crossed", "metric": "orthonormality", "level": 1e-6, "value": 1e-4}],
     {"orthonormality>1e-12", "orthonormality>1e-08", "orthonormality>1e-06"}),
    # each metric its own event, in the thresholds' order
    (quiet(cond_T=150.0, breakdown_margin=2.0, pinv_drift=0.5), 1e-3,
     [{"event": "threshold_crossed", "metric": "pinv_drift", "level": 1e-1, "value": 0.5},
      {"event": "threshold_crossed", "metric": "cond_T", "level": 1e2, "value": 150.0},
      {"event": "threshold_crossed", "metric": "breakdown_margin", "level": 1.0, "value": 2.0}],
     {f"pinv_drift>{lv:g}" for lv in THRESHOLDS["pinv_drift"]} | {"cond_T>100", "breakdown_margin>1"}),
    # unresolved: once, with its bound cond(T) u
    (quiet(cond_T=50.0, trisolve_resolved=False), 2.0**-8,
     [{"event": "precision_cannot_resolve", "metric": "trisolve_forward", "bound": 50.0 * 2.0**-8}], {"unresolved"}),
    # a baseline head's row has no solve at all: nothing to resolve
    ({k: v for k, v in quiet().items() if k != "trisolve_resolved"}, 1.0, [], set()),
    # a lost metric, with the row's reasons; without any, "not finite"
    (quiet(trisolve_forward=math.nan, unmeasured=["E is not finite", "no solve"]), 1.0,
     [{"event": "nonfinite_metric", "metrics": ["trisolve_forward"], "reason": "E is not finite; no solve"}],
     {"trisolve_forward:nonfinite"}),
    (quiet(cond_T=math.nan), 1.0,
     [{"event": "nonfinite_metric", "metrics": ["cond_T"], "reason": "not finite"}], {"cond_T:nonfinite"}),
])
def test_the_events_a_row_raises_once(row, u, events, raised):
    seen = set()
    got = row_events(row, seen, metrics=METRICS, u=u)
    assert got == events and seen == raised
    assert all(type(e["event"]) is str for e in got)  # written to events.jsonl as today's strings
    assert row_events(row, seen, metrics=METRICS, u=u) == []  # the same row again: nothing new


def test_a_higher_level_later_is_its_own_event():
    raised = set()
    row_events(quiet(orthonormality=5e-5), raised, metrics=METRICS, u=1.0)
    later = row_events(quiet(orthonormality=2e-4), raised, metrics=METRICS, u=1.0)
    assert [(e["metric"], e["level"]) for e in later] == [("orthonormality", 1e-4)]


def test_a_metric_that_does_not_apply_is_never_said_lost():
    row = quiet(trisolve_forward=math.nan, pinv_drift=math.nan)
    events = row_events(row, set(), metrics=METRICS, not_applicable=("pinv_drift",), u=1.0)
    assert [e["metrics"] for e in events if e["event"] == "nonfinite_metric"] == [["trisolve_forward"]]


def test_raised_by_rebuilds_what_the_rules_raised():
    raised = set()
    events = []
    for row in (quiet(orthonormality=5e-5, cond_T=2e4), quiet(trisolve_resolved=False, cond_T=2e4),
                quiet(trisolve_forward=math.nan), quiet(orthonormality=0.05)):
        events += row_events(row, raised, metrics=METRICS, u=1e-3)
    assert raised_by(events) == raised
    assert {"orthonormality>0.01", "cond_T>10000", "unresolved", "trisolve_forward:nonfinite"} <= raised
    assert "orthonormality>0.1" not in raised and "cond_T>1e+08" not in raised
    assert raised_by([]) == set()


def test_raised_by_reads_events_from_the_file_and_ignores_the_other_kinds():
    others = [{"event": "breakdown", "reason": "L"}, {"event": "gradient_overflow"},
              {"event": "nonfinite_gradient"}, {"event": "nonfinite_state"}, {"event": "reprojected"},
              {"event": "retraction_failed", "reason": "x"}]
    raised = set()
    mine = row_events(quiet(orthonormality=5e-7, trisolve_resolved=False, trisolve_forward=math.nan), raised,
                      metrics=METRICS, u=1.0)
    # as read back from events.jsonl: new string objects, not the literals the rules wrote
    events = json.loads(json.dumps(others[:3] + mine + others[3:]))
    assert raised_by(events) == raised == {"orthonormality>1e-12", "orthonormality>1e-08", "unresolved",
                                           "trisolve_forward:nonfinite"}
    assert raised_by(json.loads(json.dumps(others))) == set()


# ---- through a run -------------------------------------------------------------------------------------
def test_a_threshold_event_is_recorded_at_the_first_crossing_only(tmp_path):
    # no retraction: orthonormality drifts up through its levels; cond(T0) = 200 is above 1e2 from the start
    cfg = RunConfig(vocab=40, dim=4, steps=25, retraction="none", adversary="gaussian", lr=0.05, cond=200.0, seed=1)
    rows = run(cfg, tmp_path)
    events = [e for e in read_events(tmp_path / "events.jsonl") if e["event"] == "threshold_crossed"]
    checked = 0
    for metric, levels in THRESHOLDS.items():
        mine = [e for e in events if e["metric"] == metric]
        for lv in levels:
            above = [r["step"] for r in rows if np.isfinite(r[metric]) and r[metric] > lv]
            # events that report this level (or a higher one, which implies it)
            reporting = [e for e in mine if e["level"] >= lv]
            if not above:
                assert not reporting, (metric, lv, reporting)
                continue
            first = above[0]
            assert reporting and reporting[0]["step"] == first, (metric, lv, first, reporting)
            # once crossed, never reported again at this level
            assert all(e["level"] > lv for e in reporting[1:]), (metric, lv, reporting)
            checked += len(above) > 1
    # the test means something only if some level stayed crossed over several records
    assert checked >= 3, [(m, [r[m] for r in rows]) for m in ("cond_T", "orthonormality")]
    levels_seen = [(e["metric"], e["level"]) for e in events]
    assert len(levels_seen) == len(set(levels_seen))


def test_the_solves_are_judged_resolvable_in_their_own_precision_not_the_logits_gemms(tmp_path):
    """An fp8-logits run's solves are fp32's: at cond(T) = 4 they are resolved (trisolve_forward near cond(T) u
    of fp32), where cond(T) times E4M3's u (0.25) raised precision_cannot_resolve from the first row. A bf16
    run at cond(T) = 50 (50 x 2^-8 > 0.1) still raises it."""
    def unresolved_events(precision, cond, out):
        cfg = RunConfig(vocab=64, dim=8, steps=3, backend="torch", precision=precision, retraction="qr",
                        adversary="gaussian", lr=0.01, cond=cond, seed=0)
        rows = run(cfg, out)
        return rows, [e for e in read_events(out / "events.jsonl") if e["event"] == "precision_cannot_resolve"]

    rows, events = unresolved_events("fp8-logits", 4.0, tmp_path / "fp8")
    assert not events and rows[0]["cond_T"] > 3.0
    assert 1e-3 < rows[0]["trisolve_forward_ratio"] < 30  # in fp32's u: a ratio that can fail
    _, events = unresolved_events("bf16", 50.0, tmp_path / "bf16")
    assert [e["bound"] for e in events] == [pytest.approx(50.0 * 2.0**-8, rel=0.05)]
