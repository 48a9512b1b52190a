"""Optimizers, registered by name, one signature: `f(g, moments, t, ops) -> (direction, moments)`.

Each turns a parameter's gradient into the direction the step moves against (the step is -lr times
it), given its moments (m, v) and the 1-based step count t, and returns the moments to keep. They see
plain arrays only, never the manifold: the head projects the gradient onto the tangent space before and
retracts after (geoopt's split), so one optimizer serves Z on the Stiefel manifold and the tables alike.
"""
from __future__ import annotations

from typing import Callable

from ..infra.errors import PitcheckError

MOMENTUM, BETA1, BETA2, ADAM_EPS = 0.9, 0.9, 0.999, 1e-8
# the state each parameter keeps, (m, v), whichever optimizer runs: the checkpoint's layout
MOMENTS = ("m", "v")


def sgd(g, moments, t, ops):
    return g, moments


def momentum(g, moments, t, ops):
    m, v = moments
    m = MOMENTUM * m + g
    return m, (m, v)


def adam(g, moments, t, ops):
    m, v = moments
    m = BETA1 * m + (1 - BETA1) * g
    v = BETA2 * v + (1 - BETA2) * g * g
    m_hat = m / (1 - BETA1**t)
    v_hat = v / (1 - BETA2**t)
    return m_hat / (ops.sqrt(v_hat) + ADAM_EPS), (m, v)


OPTIMIZER_FUNCTIONS: dict[str, Callable] = {"sgd": sgd, "momentum": momentum, "adam": adam}
OPTIMIZERS = tuple(OPTIMIZER_FUNCTIONS)


def get_optimizer(name: str) -> Callable:
    if name not in OPTIMIZER_FUNCTIONS:
        raise PitcheckError(f"unknown optimizer {name!r}; choose from {', '.join(OPTIMIZERS)}")
    return OPTIMIZER_FUNCTIONS[name]
