"""What a stress run reports: a table, JSON, JUnit XML and plots of the broken budgets."""
from __future__ import annotations

import json
import math
from pathlib import Path

from ...infra.errors import PitcheckError
from ...infra.junit import ERROR, FAILURE, SKIPPED, Case, Outcome, Suite, junit_xml
from ...infra.plotting import draw_metric, pyplot, save_figure
from ...infra.rundir import read_metrics
from .budgets import GROWTH_KINDS
from .runner import ScenarioResult, plot_name
from .scenarios import Scenario
from .target import TARGET_RUN_KEYS


def _fmt(v) -> str:
    return "-" if v is None else (f"{v:.3e}" if isinstance(v, float) and math.isfinite(v) else str(v))


def rows_of(results: list[ScenarioResult]) -> list[dict]:
    """One row per check (and per breakdown or event requirement), for the table and the JSON."""
    out = []
    for r in results:
        s = r.scenario
        if r.skipped:
            out.append(dict(scenario=s.id, file=s.file, metric="-", kind="-", worst=None, step=None, budget=None,
                            headroom="-", status="skipped", source=s.source, message=r.skipped))
            continue
        if r.fatal:
            out.append(dict(scenario=s.id, file=s.file, metric="target", kind="target", worst=None, step=None,
                            budget=None, headroom="-", status="ERROR", source=s.source, message=r.fatal))
        for c in r.checks:
            label = {"max": c.check.metric, "floor": f"{c.check.metric} (floor)",
                     "growth": f"{c.check.metric} growth", "growth_floor": f"{c.check.metric} growth (floor)"}
            out.append(dict(scenario=s.id, file=s.file, metric=label[c.check.kind], kind=c.check.kind,
                            worst=c.value, step=c.step, budget=c.check.limit, headroom=c.headroom,
                            status=c.status, source=c.check.origin or s.source, message=c.message))
        for e in r.errors:
            out.append(dict(scenario=s.id, file=s.file, metric="events", kind="events", worst=None, step=None,
                            budget=None, headroom="-", status="BROKEN", source=s.source, message=e))
        for n in s.require_events + s.forbid_events:
            if not any(n in e for e in r.errors):
                out.append(dict(scenario=s.id, file=s.file, metric=f"event {n}", kind="events", worst=None,
                                step=None, budget=("required" if n in s.require_events else "forbidden"),
                                headroom="-", status="held", source=s.source, message=""))
    return out


def table(results: list[ScenarioResult]) -> str:
    """The results as a plain-text table, one row per check (see `rows_of`)."""
    head = ["scenario", "metric", "worst", "step", "budget", "headroom", "status", "source"]
    body = [[r["scenario"], r["metric"], _fmt(r["worst"]), _fmt(r["step"]),
             r["budget"] if isinstance(r["budget"], str) else _fmt(r["budget"]) if r["budget"] is None
             else f"{r['budget']:.3g}", r["headroom"], r["status"], r["source"]] for r in rows_of(results)]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
    lines = ["  ".join(str(x).ljust(w) for x, w in zip(line, widths)).rstrip() for line in [head, *body]]
    return "\n".join(lines)


def junit_bytes(results: list[ScenarioResult]) -> bytes:
    """JUnit XML: one testsuite per scenario file, one testcase per check (and per event requirement)."""
    by_file: dict[str, list[ScenarioResult]] = {}
    for r in results:
        by_file.setdefault(r.scenario.file, []).append(r)
    suites = []
    for file, rs in by_file.items():
        suite = Suite(rs[0].scenario.file_label, file=file, seconds=sum(r.seconds for r in rs))
        for r in rs:
            rows = rows_of([r])
            for x in rows:
                case = Case(f"{r.scenario.file_label}.{r.scenario.name}", x["metric"], r.seconds / max(1, len(rows)))
                if x["status"] == "skipped":
                    case.outcome = Outcome(SKIPPED, x["message"])
                elif x["status"] == "ERROR":  # the target could not be imported, built or run
                    case.outcome = Outcome(ERROR, x["message"])
                elif x["status"] in ("BROKEN", "INCONCLUSIVE"):
                    case.outcome = Outcome(FAILURE, x["message"],
                                           "BudgetBroken" if x["status"] == "BROKEN" else "Inconclusive",
                                           f"{x['message']}\nbudget from: {x['source']}"
                                           + (f"\nwhy: {r.scenario.why}" if r.scenario.why else ""))
                suite.cases.append(case)
        suites.append(suite)
    return junit_xml(suites, name="pitcheck stress")


def _config_json(s) -> dict:
    """The run's options; for a target scenario only those that mean something for the user's module (its
    dtype, not the precision, retraction or head of pitcheck's own model, which it does not run)."""
    config = s.config.to_json()
    if not s.target:
        return config
    return {"dtype": s.dtype, **{k: config[k] for k in TARGET_RUN_KEYS if k in config}}


def to_json(results: list[ScenarioResult]) -> dict:
    """The results as the JSON document `--json` writes (non-finite values as null)."""
    def clean(v):
        return None if isinstance(v, float) and not math.isfinite(v) else v

    return {"held": all(r.held for r in results),
            "exit_status": 2 if any(r.fatal for r in results) else 0 if all(r.held for r in results) else 1,
            "scenarios": [{"scenario": r.scenario.name, "id": r.scenario.id, "file": r.scenario.file,
                           "source": r.scenario.source,
                           "why": r.scenario.why, "skipped": r.skipped or None, "seconds": round(r.seconds, 3),
                           "held": r.held if not r.skipped else None, "errors": r.errors,
                           "target": r.scenario.target or None, "fatal": r.fatal or None,
                           "initial_state": r.scenario.initial_state,
                           "config": _config_json(r.scenario),
                           "checks": [{"metric": c.check.metric, "kind": c.check.kind, "limit": c.check.limit,
                                       "source": c.check.origin or r.scenario.source,
                                       "value": clean(c.value), "step": c.step, "held": c.held,
                                       "status": c.status, "message": c.message} for c in r.checks]}
                          for r in results]}


def plot_broken(result: ScenarioResult) -> list[Path]:
    """A PNG per broken metric: its trajectory against its budget, beside the run (<run dir>-<metric>.png)."""
    broken = [c for c in result.checks if not c.held and c.check.kind in ("max", "floor", *GROWTH_KINDS)]
    if not broken:
        return []
    try:
        rows = read_metrics(Path(result.run_dir) / "metrics.csv")
    except (OSError, PitcheckError):
        return []
    plt = pyplot()
    paths = []
    for metric in dict.fromkeys(c.check.metric for c in broken):
        fig, ax = plt.subplots(figsize=(6, 4))
        draw_metric(ax, rows, metric, metric)
        for c in (c for c in broken if c.check.metric == metric):
            if c.check.kind in ("max", "floor"):
                ax.axhline(c.check.limit, color="red", ls="--", label=f"{c.check.kind} {c.check.limit:.3g}")
                continue
            # a line of the budget's slope through the first positive value from step 1
            first = next((r for r in rows if r["step"] >= 1 and r[metric] > 0), None)
            if first:
                steps = [r["step"] for r in rows if r["step"] >= 1]
                ax.loglog(steps, [first[metric] * (s / first["step"]) ** c.check.limit for s in steps], "m:",
                          label=f"growth {'ceiling' if c.check.kind == 'growth' else 'floor'} step^{c.check.limit:g}")
        ax.set_title(f"{result.scenario.name}: {metric} (BROKEN)", fontsize=9)
        ax.set_xlabel("step (0 drawn at 1)")
        ax.legend(fontsize=8)
        paths.append(save_figure(plt, fig, plot_name(result.run_dir, metric)))
    return paths


def json_bytes(results: list[ScenarioResult]) -> bytes:
    return (json.dumps(to_json(results), indent=2) + "\n").encode()


def describe(scenario: Scenario) -> str:
    """One line for `--list`: the id, the budgets' source, the checks and the event requirements."""
    s = scenario
    checks = ", ".join(f"{c.metric} {'<=' if c.kind in ('max', 'growth') else '>='} {c.limit:g}"
                       + (" (exponent)" if c.kind in GROWTH_KINDS else "") for c in s.checks)
    events = [f"event {n} required" for n in s.require_events] + [f"no {n}" for n in s.forbid_events]
    return (f"{s.id}  [{s.source}]  {', '.join(x for x in [checks, *events] if x)}"
            + ("  (initial state only)" if s.initial_state else "")
            + ("  (needs CUDA)" if s.requires == "cuda" else ""))
