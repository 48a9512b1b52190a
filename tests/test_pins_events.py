"""The run's threshold events, through the public run API: each level of a metric is reported once, at
the first recorded row whose value exceeds it, however many later rows stay above it."""
import numpy as np

from pitcheck.trajectory import THRESHOLDS, RunConfig, read_events, run


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


# ---- the rules themselves (pitcheck/events.py), exact values, no run --------------------------------------
import math  # noqa: E402

from pitcheck.events import raised_by, row_events  # noqa: E402

METRICS = ["orthonormality", "pinv_drift", "cond_T", "breakdown_margin", "trisolve_forward"]


def quiet(**over):
    """A row below every level, resolved and finite; `over` changes some values."""
    row = {"orthonormality": 1e-13, "pinv_drift": 1e-13, "cond_T": 1.0, "breakdown_margin": 0.5,
           "trisolve_forward": 1e-15, "trisolve_resolved": True}
    row.update(over)
    return row


def test_a_quiet_row_raises_nothing():
    raised = set()
    assert row_events(quiet(), raised, metrics=METRICS, u=2.0**-24) == [] and raised == set()


def test_a_jump_past_three_levels_is_one_event_at_the_highest_and_raises_all_three():
    raised = set()
    events = row_events(quiet(orthonormality=5e-5), raised, metrics=METRICS, u=2.0**-24)
    assert events == [{"event": "threshold_crossed", "metric": "orthonormality", "level": 1e-6, "value": 5e-5}]
    assert raised == {"orthonormality>1e-12", "orthonormality>1e-08", "orthonormality>1e-06"}
    # the same value again: nothing; a value exactly at a level is not above it
    assert row_events(quiet(orthonormality=5e-5), raised, metrics=METRICS, u=2.0**-24) == []
    assert row_events(quiet(orthonormality=1e-4), raised, metrics=METRICS, u=2.0**-24) == []
    later = row_events(quiet(orthonormality=2e-4), raised, metrics=METRICS, u=2.0**-24)
    assert [(e["metric"], e["level"]) for e in later] == [("orthonormality", 1e-4)]


def test_each_metric_its_own_event_in_threshold_order():
    raised = set()
    events = row_events(quiet(cond_T=150.0, breakdown_margin=2.0, pinv_drift=0.5), raised, metrics=METRICS, u=1e-3)
    assert [(e["metric"], e["level"]) for e in events] == [("pinv_drift", 1e-1), ("cond_T", 1e2),
                                                           ("breakdown_margin", 1.0)]


def test_unresolved_precision_once_with_its_bound_cond_times_u():
    raised = set()
    events = row_events(quiet(cond_T=50.0, trisolve_resolved=False), raised, metrics=METRICS, u=2.0**-8)
    assert events == [{"event": "precision_cannot_resolve", "metric": "trisolve_forward", "bound": 50.0 * 2.0**-8}]
    assert row_events(quiet(cond_T=50.0, trisolve_resolved=False), raised, metrics=METRICS, u=2.0**-8) == []
    # a baseline head's row has no solve at all: nothing to resolve
    assert row_events({k: v for k, v in quiet().items() if k != "trisolve_resolved"}, set(), metrics=METRICS,
                      u=1.0) == []


def test_a_lost_metric_is_said_once_with_the_rows_reason_and_not_applicable_ones_never():
    raised = set()
    row = quiet(trisolve_forward=math.nan, pinv_drift=math.nan, unmeasured=["E is not finite", "no solve"])
    events = row_events(row, raised, metrics=METRICS, not_applicable=("pinv_drift",), u=1.0)
    assert events == [{"event": "nonfinite_metric", "metrics": ["trisolve_forward"],
                       "reason": "E is not finite; no solve"}]
    assert row_events(row, raised, metrics=METRICS, not_applicable=("pinv_drift",), u=1.0) == []
    # no reason given: "not finite"
    events = row_events(quiet(cond_T=math.nan), set(), metrics=["cond_T"], u=1.0)
    assert events[-1] == {"event": "nonfinite_metric", "metrics": ["cond_T"], "reason": "not finite"}


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


def test_the_levels_are_the_documented_ones():
    from pitcheck.events import THRESHOLDS as LEVELS
    assert LEVELS == {"orthonormality": (1e-12, 1e-8, 1e-6, 1e-4, 1e-2, 1e-1),
                      "pinv_drift": (1e-12, 1e-8, 1e-6, 1e-4, 1e-2, 1e-1),
                      "cond_T": (1e2, 1e4, 1e8, 1e12), "breakdown_margin": (1.0,)}


def test_a_value_exactly_at_a_level_has_not_crossed_it_even_in_a_jump():
    raised = set()
    row_events(quiet(orthonormality=1e-4), raised, metrics=METRICS, u=1.0)
    assert "orthonormality>0.0001" not in raised
    later = row_events(quiet(orthonormality=2e-4), raised, metrics=METRICS, u=1.0)
    assert [(e["metric"], e["level"]) for e in later] == [("orthonormality", 1e-4)]


def test_raised_by_reads_events_from_the_file_and_ignores_the_other_kinds():
    import json
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
