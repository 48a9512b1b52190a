"""Loss scaling for gradient formats too narrow for raw gradients (torch.amp.GradScaler's dynamic rule).

The gradient is multiplied by the scale before it is cast to the gradient format and divided by it
again before the optimizer sees it. A step whose scaled gradient overflows is skipped and the scale
halved; after LOSS_SCALE_GROWTH_INTERVAL clean steps in a row it doubles.
"""
from __future__ import annotations

import math

import numpy as np

from ..numerics.formats import FORMATS, overflow_threshold, round_to

# torch.amp.GradScaler's defaults
LOSS_SCALE_INIT, LOSS_SCALE_GROWTH_INTERVAL = 2.0**16, 2000


def magnitude_peaks(arrays) -> list[float]:
    """max |g| of each numpy array or torch tensor (0 for an empty one; NaN or inf where g has a non-finite
    entry, as max propagates NaN): a device's tensors cross to the host as one small vector, one sync."""
    arrays = list(arrays)
    if all(isinstance(g, np.ndarray) for g in arrays):
        return [float(np.abs(g).max(initial=0.0)) for g in arrays]
    import torch  # a tensor's: torch is imported already

    read = iter(peak_vector([g for g in arrays if not isinstance(g, np.ndarray)]).tolist())
    return [float(np.abs(g).max(initial=0.0)) if isinstance(g, np.ndarray) else next(read) for g in arrays]


def peak_vector(tensors):
    """max |g| of each tensor as one float64 vector on their device (0 for an empty one), not yet read."""
    import torch  # a tensor's: torch is imported already

    peaks = [g.abs().amax() if g.numel() else torch.zeros((), dtype=g.dtype, device=g.device) for g in tensors]
    return torch.stack([p.to(torch.float64) for p in peaks])


def peak_fits(peak: float, fmt: str) -> bool:
    """Whether an array whose largest magnitude is `peak` is finite once cast to format fmt: an entry overflows
    exactly when the largest magnitude rounds to infinity in that format."""
    threshold = overflow_threshold(fmt)
    if threshold is None:
        return bool(np.isfinite(round_to(np.array([peak]), FORMATS[fmt])[0]))
    return bool(peak < threshold)


def fits(scaled, fmt: str) -> bool:
    """Whether every entry of `scaled` (a numpy array, or a torch tensor on any device) is finite once cast to
    format fmt."""
    return peak_fits(magnitude_peaks([scaled])[0], fmt)


class LossScaler:
    """The loss scale and the count of clean steps since it last changed; the scale stays 1 when disabled."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.scale = LOSS_SCALE_INIT if enabled else 1.0
        self.good_steps = 0

    def scaled(self, G: np.ndarray) -> np.ndarray:
        return G * self.scale if self.enabled else G

    def scaled_peak(self, peak: float, scale: float | None = None) -> float:
        """max |G * scale| from max |G|: the product's rounding is monotone, so it is the same double.
        scale: the scale the gradient was multiplied by (default the present one)."""
        if not self.enabled:
            return peak
        return peak * (self.scale if scale is None else scale)

    def admits(self, peaks: list[float], fmt: str, scale: float | None = None) -> bool:
        """Whether gradients of these peaks, multiplied by `scale` (default the present one), are all finite
        and fit format fmt: the two tests a step's admission makes."""
        return all(map(math.isfinite, peaks)) and all(peak_fits(self.scaled_peak(x, scale), fmt) for x in peaks)

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
