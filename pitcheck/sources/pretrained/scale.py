"""The logit scale of keep-embedding-scaled: the s > 0 that minimises the mean cross-entropy of s z on given
logits z (N x V) and targets (N), a 1-D minimisation.

The loss f(s) = mean_i [logsumexp(s z_i) - s z_i[t_i]] is convex in s (a log-sum-exp of functions linear
in s), so its derivative f'(s) = mean_i (E_{softmax(s z_i)}[z_i] - z_i[t_i]) increases with s and the
minimiser is its one zero, found by bisection in log s: deterministic, no starting guess, and f'(s*) is
the certificate of optimality.
"""
from __future__ import annotations

import math

import numpy as np

from ...infra.errors import PitcheckError


def _softmax_mean(z: np.ndarray, s: float) -> np.ndarray:
    a = s * z
    a -= a.max(axis=1, keepdims=True)
    p = np.exp(a)
    p /= p.sum(axis=1, keepdims=True)
    return (p * z).sum(axis=1)


def scaled_loss(z: np.ndarray, targets: np.ndarray, s: float) -> float:
    """mean_i [logsumexp(s z_i) - s z_i[t_i]] (nats/token), in float64."""
    a = s * np.asarray(z, dtype=np.float64)
    top = a.max(axis=1)
    lse = top + np.log(np.exp(a - top[:, None]).sum(axis=1))
    return float(np.mean(lse - a[np.arange(len(targets)), targets]))


def loss_slope(z: np.ndarray, targets: np.ndarray, s: float) -> float:
    """f'(s) = mean_i (E_{softmax(s z_i)}[z_i] - z_i[t_i])."""
    z = np.asarray(z, dtype=np.float64)
    return float(np.mean(_softmax_mean(z, s) - z[np.arange(len(targets)), targets]))


def fit_logit_scale(z: np.ndarray, targets: np.ndarray, lo: float = 1e-3, hi: float = 1e4,
                    rtol: float = 1e-9) -> dict:
    """The minimiser s of `scaled_loss` on [lo, hi] (bisection of its slope in log s to relative rtol):
    {"scale", "loss", "loss_at_1", "slope"}; a one-line PitcheckError where the minimiser is not inside."""
    z = np.asarray(z, dtype=np.float64)
    targets = np.asarray(targets)
    if z.ndim != 2 or targets.shape != (z.shape[0],) or not z.shape[0]:
        raise PitcheckError(f"logits must be N x V with N targets, got {z.shape} and {targets.shape}")
    if not np.isfinite(z).all():
        raise PitcheckError("the logits to fit a scale on have non-finite entries")
    if loss_slope(z, targets, lo) >= 0:
        raise PitcheckError(f"the held-out loss rises from s = {lo:g} on: the logits carry no information to scale")
    if loss_slope(z, targets, hi) <= 0:
        raise PitcheckError(f"the held-out loss still falls at s = {hi:g}: no minimiser below it")
    a, b = math.log(lo), math.log(hi)
    while b - a > rtol:
        mid = 0.5 * (a + b)
        if loss_slope(z, targets, math.exp(mid)) < 0:
            a = mid
        else:
            b = mid
    s = math.exp(0.5 * (a + b))
    return {"scale": s, "loss": scaled_loss(z, targets, s), "loss_at_1": scaled_loss(z, targets, 1.0),
            "slope": loss_slope(z, targets, s)}
