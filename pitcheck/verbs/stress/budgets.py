"""Judging a scenario's checks against the metric rows of its run.

Growth exponents are least-squares slopes of log(metric) against log(step) (stats.growth_fit) over the
recorded steps from step 1 (step 0 is the float64 start rounded to the storage format, below any
retraction's level), from at least MIN_GROWTH_POINTS of them: fewer make a growth check INCONCLUSIVE,
which fails like a broken one.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ...numerics.stats import MIN_GROWTH_POINTS, growth_fit
from .scenarios import Check

GROWTH_KINDS = ("growth", "growth_floor")


@dataclass
class BudgetResult:
    """One check judged against one run."""
    check: Check
    value: float  # the worst value, the fitted exponent, or the last value
    step: int | None  # where the worst (or last) value was recorded; None for exponents
    held: bool
    message: str = ""
    inconclusive: bool = False  # the run did not record enough to judge (never held)

    @property
    def status(self) -> str:
        return "held" if self.held else "INCONCLUSIVE" if self.inconclusive else "BROKEN"

    @property
    def headroom(self) -> str:
        c, v = self.check, self.value
        if not math.isfinite(v):
            return "-"
        if c.kind in GROWTH_KINDS:
            d = c.limit - v if c.kind == "growth" else v - c.limit
            return f"{d:+.2f}"
        if c.kind == "max":
            return f"{c.limit / v:.3g}x" if v > 0 else "inf"
        return f"{v / c.limit:.3g}x" if c.limit > 0 else "inf"


def growth_exponent(rows: list[dict], metric: str) -> float:
    """The fitted exponent p of metric ~ step^p over one run's rows from step 1 with a positive, finite
    value; NaN with fewer than MIN_GROWTH_POINTS such rows."""
    slope, _ = growth_fit([rows], first_step=1, metric=metric)
    return slope


def check_budget(check: Check, rows: list[dict]) -> BudgetResult:
    """One check against a run's metric rows. A NaN (a damaged state) breaks a ceiling."""
    if not rows:
        return BudgetResult(check, float("nan"), None, False, "no recorded rows")
    m = check.metric
    if check.kind == "max":
        nan = [r for r in rows if math.isnan(r[m])]
        if nan:
            return BudgetResult(check, float("nan"), nan[0]["step"], False,
                                f"{m} is NaN at step {nan[0]['step']} (a non-finite state)")
        worst = max(rows, key=lambda r: r[m])
        held = worst[m] <= check.limit
        msg = "" if held else f"{m} reached {worst[m]:.3e} at step {worst['step']}, over its budget {check.limit:.3g}"
        return BudgetResult(check, worst[m], worst["step"], held, msg)
    if check.kind == "floor":
        last = rows[-1]
        held = last[m] >= check.limit  # NaN fails
        msg = "" if held else f"{m} ended at {last[m]:.3e} (step {last['step']}), below its floor {check.limit:.3g}"
        return BudgetResult(check, last[m], last["step"], held, msg)
    p = growth_exponent(rows, m)
    if math.isnan(p):
        return BudgetResult(check, p, None, False, f"{m}: inconclusive: fewer than {MIN_GROWTH_POINTS} positive, "
                            "finite recorded values from step 1, so its growth cannot be measured", inconclusive=True)
    held = p <= check.limit if check.kind == "growth" else p >= check.limit
    what = "ceiling" if check.kind == "growth" else "floor"
    msg = "" if held else f"{m} grows like step^{p:.2f}, against a growth exponent {what} of {check.limit:g}"
    return BudgetResult(check, p, None, held, msg)
