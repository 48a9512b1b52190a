"""Loss scaling for gradient formats too narrow for raw gradients (torch.amp.GradScaler's dynamic rule).

The gradient is multiplied by the scale before it is cast to the gradient format and divided by it
again before the optimizer sees it. A step whose scaled gradient overflows is skipped and the scale
halved; after LOSS_SCALE_GROWTH_INTERVAL clean steps in a row it doubles.
"""
from __future__ import annotations

import numpy as np

from ..numerics.formats import FORMATS, overflow_threshold, round_to

# torch.amp.GradScaler's defaults
LOSS_SCALE_INIT, LOSS_SCALE_GROWTH_INTERVAL = 2.0**16, 2000


def all_finite(g) -> bool:
    """Whether every entry of a numpy array or a torch tensor (on any device) is finite."""
    if isinstance(g, np.ndarray):
        return bool(np.isfinite(g).all())
    import torch  # a tensor's: torch is imported already

    return bool(torch.isfinite(g).all())


def fits(scaled, fmt: str) -> bool:
    """Whether every entry of `scaled` (a numpy array, or a torch tensor on any device) is finite once cast to
    format fmt."""
    # an entry overflows exactly when the largest magnitude rounds to infinity in that format
    if isinstance(scaled, np.ndarray):
        peak = np.abs(scaled).max(initial=0.0)
    else:  # one scalar crosses to the host
        peak = float(scaled.abs().max()) if scaled.numel() else 0.0
    threshold = overflow_threshold(fmt)
    if threshold is None:
        return bool(np.isfinite(round_to(np.array([peak]), FORMATS[fmt])[0]))
    return bool(peak < threshold)


class LossScaler:
    """The loss scale and the count of clean steps since it last changed; the scale stays 1 when disabled."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.scale = LOSS_SCALE_INIT if enabled else 1.0
        self.good_steps = 0

    def scaled(self, G: np.ndarray) -> np.ndarray:
        return G * self.scale if self.enabled else G

    def unscale(self, g):
        return g / self.scale

    def overflowed(self) -> str:
        """Back off after an overflow; returns what happened to the step."""
        if not self.enabled:
            return "step skipped"
        self.scale /= 2.0
        self.good_steps = 0
        return "step skipped, loss scale halved"

    def clean_step(self) -> None:
        if self.enabled:
            self.good_steps += 1
            if self.good_steps >= LOSS_SCALE_GROWTH_INTERVAL:
                self.scale *= 2.0
                self.good_steps = 0
