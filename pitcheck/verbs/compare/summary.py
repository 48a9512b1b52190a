"""A sweep's summary: one row per group of cells that differ only in the seed (final error, growth
exponent, storage floor, drift and its bound, events), summary.csv and cost.csv, and reading them back."""
from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import numpy as np

from ...numerics.formats import FORMATS
from ...numerics.metrics import orthonormality_loss
from ...numerics.placement import stored_copy, z_format
from ...trajectory.events import EventKind
from ...trajectory.plan import policy_named
from ...infra.rundir import read_events, read_metrics
from ...numerics.stats import growth_fit
from .cells import Cell, cell_dir, cost_path
from .grid import Grid

# a row's key: what its cells share (they differ only in the seed); a grid with a shards axis adds
# SHARDS_COLUMN after dim (sharded_columns), one without keeps the columns, and bytes, it had before
KEY_COLUMNS = ["retraction", "precision", "adversary", "optimizer", "lr", "head", "vocab", "dim", "steps", "seeds"]
SHARDS_COLUMN = "shards"
# summary.csv: computed values only, so the same grid gives the same bytes whichever executor ran it
SUMMARY_COLUMNS = KEY_COLUMNS + [
    "final_orthonormality", "final_orthonormality_min", "final_orthonormality_max", "max_orthonormality",
    "growth_exponent", "growth_exponent_err", "final_pinv_drift", "drift_bound", "max_cond_T", "shadow_Z",
    "floor", "error_over_floor", "events", "failed_retractions", "breakdowns", "breakdowns_T", "breakdowns_own",
    "not_judged", "failed_retractions_judged",
]
# cost.csv: measured times, which no rerun repeats (median over seeds; min and max beside it)
COST_COLUMNS = KEY_COLUMNS + ["ms_per_step", "ms_per_step_min", "ms_per_step_max", "hosts"]
# a breakdown of T or of its factor L (L's diagonal at 0: T singular; L non-finite) comes from the gradients
# and the learning rate, not from the retraction, which only moves Z
T_PARTS = ("T", "L")
# the reasons of T breakdowns in run directories written before breakdown events named their part
T_BREAKDOWN = ("L's diagonal", "T = L L^T", "L has non-finite")
# cond(T) u, u the solves' own (Policy.solve_u), beyond which the precision no longer resolves T's solves
# (metrics' trisolve_resolved, the run's precision_cannot_resolve event): a Z that breaks down after that
# broke down because T blew up
RESOLVABLE_COND_U = 0.1
FLOOR_SAMPLES = 3
# breakdown_cause's answers: only CAUSE_OWN counts against the retraction
CAUSE_T, CAUSE_T_UNRESOLVED, CAUSE_EVERY, CAUSE_OWN = "T", "T unresolved", "every retraction", "own"


def sharded_columns(columns: list[str], grid: Grid) -> list[str]:
    """The columns of summary.csv or cost.csv for this grid: with a shards axis, `shards` after `dim`."""
    if "shards" not in grid.axes:
        return list(columns)
    at = columns.index("dim") + 1
    return columns[:at] + [SHARDS_COLUMN] + columns[at:]


def storage_floor(precision: str, vocab: int, dim: int) -> float:
    """||Q^T Q - I||_F of an exactly orthonormal V x D Q rounded to the format Z is stored in, and through
    the policy's placement of Z if it has one (median of
    FLOOR_SAMPLES seeded Q's): no retraction can keep Z closer to the manifold than this."""
    policy = policy_named(precision)
    values = []
    for seed in range(FLOOR_SAMPLES):
        rng = np.random.default_rng([seed, vocab, dim, 7])
        Q, R = np.linalg.qr(rng.standard_normal((vocab, dim)))
        Q = Q * np.where(np.diag(R) < 0, -1.0, 1.0)
        values.append(orthonormality_loss(stored_copy(Q, policy.storage, policy.placement)))
    return float(np.median(values))



def median(values) -> float:
    """The median of the finite values; NaN when there are none."""
    vals = [v for v in values if v is not None and math.isfinite(v)]
    return float(np.median(vals)) if vals else float("nan")


def growth_exponent(runs: list[list[dict]], steps: int) -> tuple[float, float]:
    """The growth exponent of ||Z^T Z - I||_F and its standard error, fitted over steps sqrt(N)..N: the
    second half of the run on the log-step axis the records are spaced on, past the start-up transient."""
    return growth_fit(runs, first_step=math.sqrt(steps))


def breaks_T(event: dict) -> bool:
    """Whether a breakdown event is T's (L's diagonal at 0, or L non-finite): its `part`; a run directory
    written before breakdown events had one is told by the reason's wording."""
    if event["event"] != EventKind.BREAKDOWN:
        return False
    if "part" in event:
        return event["part"] in T_PARTS
    return any(t in event.get("reason", "") for t in T_BREAKDOWN)


def unresolved(rows: list[dict], u: float, before: float = math.inf) -> bool:
    """Whether cond(T) u passed RESOLVABLE_COND_U on a recorded step before `before` (NaN: not measured)."""
    conds = [r["cond_T"] for r in rows if r["step"] < before and not math.isnan(r["cond_T"])]
    return bool(conds) and max(conds) * u > RESOLVABLE_COND_U


def breakdown_cause(events: list[dict], rows: list[dict], u: float) -> str | None:
    """What ended a cell's run: None (no breakdown); "T" (T or L broke); "T unresolved" (Z, or no one part,
    broke after cond(T) u had passed RESOLVABLE_COND_U: the last good state is always recorded); "own"
    otherwise, which judge_cells() turns into "every retraction" where the same precision, gradients and
    seed broke down under every retraction of the grid."""
    ends = [e for e in events if e["event"] == EventKind.BREAKDOWN]
    if not ends:
        return None
    if breaks_T(ends[-1]):
        return CAUSE_T
    return CAUSE_T_UNRESOLVED if unresolved(rows, u, ends[-1]["step"]) else CAUSE_OWN


def judge_cells(all_cells: list[Cell], metrics: dict[str, list[dict]],
                events: dict[str, list[dict]]) -> dict[str, tuple[str | None, bool]]:
    """Cell name -> (breakdown_cause, whether the run is no judgement of its retraction).

    Across the retractions (two or more) of one precision, gradient model, shape and seed: an "own" breakdown
    that every one of them had is relabelled "every retraction"; and where T blew up under every one of them
    (T or L broke down, or cond(T) u passed RESOLVABLE_COND_U), none of those runs judges its retraction,
    even one that did not end. A run that ended in a breakdown not its own judges nothing either."""
    # the same u as the run's precision_cannot_resolve event: the solves'
    u = {c.name: policy_named(c.config.precision).solve_u for c in all_cells}
    cause = {c.name: breakdown_cause(events[c.name], metrics[c.name], u[c.name]) for c in all_cells}
    blew = {n: cause[n] in (CAUSE_T, CAUSE_T_UNRESOLVED) or unresolved(metrics[n], u[n]) for n in cause}
    contexts: dict[tuple, list[str]] = {}
    for c in all_cells:
        contexts.setdefault(c.group[1:] + (c.config.seed,), []).append(c.name)
    whichever = set()
    for names in contexts.values():
        if len(names) < 2:
            continue
        if all(cause[n] is not None for n in names):
            cause.update({n: CAUSE_EVERY for n in names if cause[n] == CAUSE_OWN})
        if all(blew[n] for n in names):
            whichever.update(names)
    return {n: (cause[n], cause[n] not in (None, CAUSE_OWN) or n in whichever) for n in cause}


def summarise(out: Path, grid: Grid, all_cells: list[Cell]) -> list[dict]:
    """One row per group of cells that differ only in the seed."""
    metrics = {c.name: read_metrics(cell_dir(out, c) / "metrics.csv") for c in all_cells}
    events = {c.name: read_events(cell_dir(out, c) / "events.jsonl") for c in all_cells}
    judged = judge_cells(all_cells, metrics, events)
    groups: dict[tuple, list[Cell]] = {}
    for c in all_cells:
        groups.setdefault(c.group, []).append(c)
    floors: dict[tuple, float] = {}
    rows = []
    for group, members in groups.items():
        retraction, precision, adversary, optimizer, lr, head, vocab, dim, shards = group
        runs = [metrics[c.name] for c in members]
        evs = [e for c in members for e in events[c.name]]
        counted = sum(1 for e in evs if e["event"] not in ("threshold_crossed", "breakdown"))
        failed = {c.name: sum(1 for e in events[c.name] if e["event"] == EventKind.RETRACTION_FAILED) for c in members}
        cause = [judged[c.name][0] for c in members]
        costs, hosts = [], set()
        for c in members:
            try:
                cost = json.loads(cost_path(out, c).read_text())
                costs.append(float(cost["ms_per_step"]))
                hosts.add(str(cost.get("host", "")))
            except (OSError, ValueError, KeyError, TypeError):
                pass
        finals = [r[-1]["orthonormality"] for r in runs]
        policy = policy_named(precision)
        key = (z_format(policy.storage, policy.placement)[0], vocab, dim)
        if key not in floors:
            floors[key] = storage_floor(precision, vocab, dim)
        slope, err = growth_exponent(runs, grid.steps)
        factor_u = FORMATS[policy.factor].u
        bounds = [r[-1]["cond_T"] * (r[-1]["orthonormality"] + factor_u) for r in runs]
        row = {
            "retraction": retraction, "precision": precision, "adversary": adversary, "optimizer": optimizer,
            "lr": lr, "head": head, "vocab": vocab, "dim": dim, "shards": shards, "steps": grid.steps,
            "seeds": len(members),
            "final_orthonormality": median(finals),
            "final_orthonormality_min": min(finals), "final_orthonormality_max": max(finals),
            "max_orthonormality": max(x["orthonormality"] for r in runs for x in r),
            "growth_exponent": slope, "growth_exponent_err": err,
            "final_pinv_drift": median(r[-1]["pinv_drift"] for r in runs),
            "drift_bound": median(bounds),
            "max_cond_T": max(x["cond_T"] for r in runs for x in r),
            "shadow_Z": median(r[-1]["shadow_Z"] for r in runs),
            "ms_per_step": median(costs),
            "ms_per_step_min": min(costs, default=float("nan")), "ms_per_step_max": max(costs, default=float("nan")),
            "hosts": " ".join(sorted(h for h in hosts if h)),
            "floor": floors[key],
            "events": counted, "failed_retractions": sum(failed.values()),
            "failed_retractions_judged": sum(n for name, n in failed.items() if not judged[name][1]),
            "breakdowns": sum(x is not None for x in cause),
            "breakdowns_T": cause.count(CAUSE_T), "breakdowns_own": cause.count(CAUSE_OWN),
            "not_judged": sum(judged[c.name][1] for c in members),
        }
        row["error_over_floor"] = row["final_orthonormality"] / row["floor"]
        rows.append(row)
    return rows



def _cell_text(value) -> str:
    if isinstance(value, float):
        return "" if not math.isfinite(value) else repr(value)
    return str(value)


def summary_csv(rows: list[dict], columns: list[str] = SUMMARY_COLUMNS) -> bytes:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(columns)
    for row in rows:
        w.writerow([_cell_text(row[k]) for k in columns])
    return buf.getvalue().encode()


def _read_rows(path: Path) -> list[dict]:
    rows = []
    for raw in csv.DictReader(io.StringIO(path.read_text())):
        row = {}
        for k, v in raw.items():
            if k in ("retraction", "precision", "adversary", "optimizer", "head", "hosts"):
                row[k] = v
            elif k in ("vocab", "dim", "shards", "steps", "seeds", "events", "failed_retractions", "breakdowns",
                       "breakdowns_T", "breakdowns_own", "not_judged", "failed_retractions_judged"):
                row[k] = int(v)
            else:
                row[k] = float(v) if v else float("nan")
        row.setdefault(SHARDS_COLUMN, 1)  # a summary without the column: every cell ran in one process
        if "breakdowns" in row:
            # a summary written before breakdowns had causes: every one not T's counted against the retraction,
            # as it was judged then
            row.setdefault("breakdowns_own", row["breakdowns"] - row.get("breakdowns_T", 0))
            row.setdefault("not_judged", row.get("breakdowns_T", 0))
        if "failed_retractions" in row:
            row.setdefault("failed_retractions_judged", row["failed_retractions"])
        rows.append(row)
    return rows


def read_summary(path: Path | str) -> list[dict]:
    """summary.csv's rows, each joined with its cost.csv row (same key) when that file is beside it."""
    path = Path(path)
    rows = _read_rows(path)
    cost_file = path.with_name("cost.csv")
    if cost_file.is_file():
        key = KEY_COLUMNS + [SHARDS_COLUMN]
        costs = {tuple(r[k] for k in key): r for r in _read_rows(cost_file)}
        for row in rows:
            row.update(costs.get(tuple(row[k] for k in key), {}))
    return rows


