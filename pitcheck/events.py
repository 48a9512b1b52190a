"""The run's event rules: which recorded row raises which event, once.

Pure functions over a row of metrics and the set of keys already raised (`raised`), so the rules are
tested, and mutation-tested, without a run; the trajectory appends what they return to events.jsonl and
rebuilds `raised` from that file on resume.
"""
from __future__ import annotations

import math

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
            events.append({"event": "threshold_crossed", "metric": metric, "level": max(new), "value": row[metric]})
    # baseline heads have no solve: nothing to resolve
    if not row.get("trisolve_resolved", True) and "unresolved" not in raised:
        raised.add("unresolved")
        events.append({"event": "precision_cannot_resolve", "metric": "trisolve_forward", "bound": row["cond_T"] * u})
    # a metric that could not be measured is written as NaN, and said so the first time
    lost = [k for k in metrics if k not in not_applicable and not math.isfinite(row[k])
            and f"{k}:nonfinite" not in raised]
    if lost:
        raised.update(f"{k}:nonfinite" for k in lost)
        reason = "; ".join(row.get("unmeasured", [])) or "not finite"
        events.append({"event": "nonfinite_metric", "metrics": lost, "reason": reason})
    return events


def raised_by(events: list[dict]) -> set[str]:
    """The keys `row_events` had raised when it wrote these events (a resumed run goes on from them)."""
    raised: set[str] = set()
    for e in events:
        if e["event"] == "threshold_crossed":
            raised.update(f"{e['metric']}>{lv:g}" for lv in THRESHOLDS[e["metric"]] if lv <= e["level"])
        elif e["event"] == "nonfinite_metric":
            raised.update(f"{m}:nonfinite" for m in e["metrics"])
        elif e["event"] == "precision_cannot_resolve":
            raised.add("unresolved")
    return raised
