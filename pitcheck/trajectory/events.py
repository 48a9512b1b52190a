"""The run's events: their kinds, which of them skip a step, and which recorded row raises which event, once.

An event is a dict written as one line of events.jsonl: its kind under "event" (an EventKind value), the
step it belongs to, and fields of its kind. The rules are pure functions over a row of metrics and the set
of keys already raised (`raised`), so they are tested, and mutation-tested, without a run; the trajectory
appends what they return to events.jsonl and rebuilds `raised` from that file on resume.
"""
from __future__ import annotations

import math
from enum import Enum


class EventKind(str, Enum):
    """The "event" of an events.jsonl line; the values are what the file holds."""
    # the engine's, for a step it did not take
    NONFINITE_GRADIENT = "nonfinite_gradient"
    GRADIENT_OVERFLOW = "gradient_overflow"
    NONFINITE_STATE = "nonfinite_state"
    RETRACTION_FAILED = "retraction_failed"
    # the engine's, for a step it took
    REPROJECTED = "reprojected"
    # the recorded rows'
    THRESHOLD_CROSSED = "threshold_crossed"
    PRECISION_CANNOT_RESOLVE = "precision_cannot_resolve"
    NONFINITE_METRIC = "nonfinite_metric"
    # the run's end at its last good state
    BREAKDOWN = "breakdown"


# the kinds of event that record a step the model did not take (its state, and the shadow's, unchanged);
# as plain strings, since an Enum member hashes by its name, not its value
SKIPS_STEP = frozenset(kind.value for kind in (EventKind.NONFINITE_GRADIENT, EventKind.GRADIENT_OVERFLOW,
                                               EventKind.NONFINITE_STATE, EventKind.RETRACTION_FAILED))


def skips_step(event: dict) -> bool:
    """Whether the event records a step the model did not take."""
    return event.get("event") in SKIPS_STEP


def skipped_steps_by_event(events: list[dict]) -> dict[str, int]:
    """How many steps were skipped, by the kind of event that skipped them."""
    counts: dict[str, int] = {}
    for e in events:
        if skips_step(e):
            counts[e["event"]] = counts.get(e["event"], 0) + 1
    return counts


def breakdown(reason: str, part: str | None = None) -> dict:
    """The event that ends a run at its last good state; `part`: what broke (heads.StateBreakdown.part:
    "T" for L's diagonal at 0, ...), written when known, so that readers need not parse the reason."""
    event = {"event": EventKind.BREAKDOWN.value, "reason": reason}
    if part is not None:
        event["part"] = part
    return {**event, "action": "run ended"}


def ends_run(events: list[dict], n: int, step: int) -> bool:
    """Whether events[n] is the breakdown that ended, at `step` + 1, a run checkpointed at `step`."""
    e = events[n]
    return e["event"] == EventKind.BREAKDOWN and e["step"] == step + 1 and n == len(events) - 1


def malformed(event: dict) -> str | None:
    """What an event read back from events.jsonl lacks that resuming relies on; None when it is whole."""
    kind = event["event"]
    if kind == EventKind.THRESHOLD_CROSSED and not (
            event.get("metric") in THRESHOLDS and isinstance(event.get("level"), (int, float))):
        return f"a threshold event for {event.get('metric')!r} at level {event.get('level')!r}"
    if kind == EventKind.NONFINITE_METRIC and not isinstance(event.get("metrics"), list):
        return "a nonfinite_metric event without its metrics"
    if kind == EventKind.BREAKDOWN and not isinstance(event.get("reason"), str):
        return "a breakdown event without its reason"
    return None

# first crossings of these levels are recorded as events
THRESHOLDS = {
    "orthonormality": (1e-12, 1e-8, 1e-6, 1e-4, 1e-2, 1e-1),
    "pinv_drift": (1e-12, 1e-8, 1e-6, 1e-4, 1e-2, 1e-1),
    "cond_T": (1e2, 1e4, 1e8, 1e12),
    "breakdown_margin": (1.0,),
}


def row_events(row: dict, raised: set[str], *, metrics: list[str], not_applicable=(), u: float) -> list[dict]:
    """The events a new row raises, each the first of its kind; `raised` is updated with their keys.

    - threshold_crossed: per metric, one event a record, for the highest level crossed for the first time
      (every level it is above counts as raised, so a jump past three levels is one event);
    - precision_cannot_resolve: the first row whose solve error the precision cannot resolve;
    - nonfinite_metric: the metrics (of `metrics`, less `not_applicable`) that could not be measured, the
      first time each is lost, with the reason the row gives."""
    events = []
    for metric, levels in THRESHOLDS.items():
        new = [lv for lv in levels if row[metric] > lv and f"{metric}>{lv:g}" not in raised]
        if new:
            raised.update(f"{metric}>{lv:g}" for lv in levels if row[metric] > lv)
            events.append({"event": EventKind.THRESHOLD_CROSSED.value, "metric": metric, "level": max(new), "value": row[metric]})
    # baseline heads have no solve: nothing to resolve
    if not row.get("trisolve_resolved", True) and "unresolved" not in raised:
        raised.add("unresolved")
        events.append({"event": EventKind.PRECISION_CANNOT_RESOLVE.value, "metric": "trisolve_forward", "bound": row["cond_T"] * u})
    # a metric that could not be measured is written as NaN, and said so the first time
    lost = [k for k in metrics if k not in not_applicable and not math.isfinite(row[k])
            and f"{k}:nonfinite" not in raised]
    if lost:
        raised.update(f"{k}:nonfinite" for k in lost)
        reason = "; ".join(row.get("unmeasured", [])) or "not finite"
        events.append({"event": EventKind.NONFINITE_METRIC.value, "metrics": lost, "reason": reason})
    return events


def raised_by(events: list[dict]) -> set[str]:
    """The keys `row_events` had raised when it wrote these events (a resumed run goes on from them)."""
    raised: set[str] = set()
    for e in events:
        if e["event"] == EventKind.THRESHOLD_CROSSED:
            raised.update(f"{e['metric']}>{lv:g}" for lv in THRESHOLDS[e["metric"]] if lv <= e["level"])
        elif e["event"] == EventKind.NONFINITE_METRIC:
            raised.update(f"{m}:nonfinite" for m in e["metrics"])
        elif e["event"] == EventKind.PRECISION_CANNOT_RESOLVE:
            raised.add("unresolved")
    return raised
