"""`none`: the plain Euclidean step, the baseline every other map is measured against."""
from __future__ import annotations

from .registry import register


@register("none", "#7f7f7f", "x", table_order=12, sharded="retract_none")
def retract_none(Z, xi, ops=None):
    """Plain Euclidean step: nothing pulls Z back, so orthonormality drifts at second order."""
    return Z + xi
