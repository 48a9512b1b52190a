"""Statistics the verbs share: the growth exponent of a metric along a trajectory."""
from __future__ import annotations

import math

import numpy as np

MIN_GROWTH_POINTS = 3


def growth_fit(runs: list[list[dict]], first_step: float = 1.0, metric: str = "orthonormality") -> tuple[float, float]:
    """Slope of log(metric) against log(step) over the rows from `first_step` (at least 1) on with a
    positive, finite value, one intercept per run (seed), and the slope's standard error.

    A run with fewer than 2 such rows is left out; (NaN, NaN) with fewer than MIN_GROWTH_POINTS rows in all,
    or no spread in step. The standard error is NaN when no degree of freedom is left.
    """
    sxy = sxx = 0.0
    centred = []
    for rows in runs:
        pts = [(math.log(r["step"]), math.log(r[metric])) for r in rows
               if r["step"] >= max(first_step, 1) and math.isfinite(r[metric]) and r[metric] > 0]
        if len(pts) < 2:
            continue
        x, y = np.array(pts).T
        xc, yc = x - x.mean(), y - y.mean()
        sxy += float(xc @ yc)
        sxx += float(xc @ xc)
        centred.append((xc, yc))
    n = sum(len(xc) for xc, _ in centred)
    if n < MIN_GROWTH_POINTS or sxx <= 0:
        return float("nan"), float("nan")
    slope = sxy / sxx
    dof = n - len(centred) - 1
    rss = sum(float(((yc - slope * xc) ** 2).sum()) for xc, yc in centred)
    err = math.sqrt(rss / dof / sxx) if dof > 0 else float("nan")
    return slope, err
