"""Whether the target's device still works in the worker's process.

A CUDA kernel's error (a device-side assert from an out-of-range index, an illegal address) is reported
asynchronously and is sticky: the call that launched the kernel returns, the error surfaces at a later
call, and from then on every CUDA call of the process raises it. Nothing run after it in that process can
be judged, so the worker checks the context after each probe (and after each of bad_input's cases); on a
loss it saves what it has and exits with LOST_STATUS, and the validator starts a fresh worker for the
rest (isolation.py).
"""
from __future__ import annotations

from .probes import describe_exception

# the worker's exit status when its device context was lost: what it saved stands, the rest is to run
LOST_STATUS = 4


class ContextLost(Exception):
    """The device context of this process was found lost after `where` (a check, or one of its cases)."""

    def __init__(self, reason: str, where: str):
        super().__init__(f"context lost after {where}: {reason}")
        self.reason, self.where = reason, where


def context_lost(device: str) -> str:
    """'' while `device`'s context works in this process, else the error that says it does not."""
    if device != "cuda":
        return ""
    import torch  # the worker's torch, already imported; deferred so that importing pitcheck needs none

    try:
        torch.cuda.synchronize()
    except Exception as exc:  # torch.AcceleratorError (a RuntimeError) and whatever a driver raises
        return describe_exception(exc)
    return ""


def check_context(device: str, where: str) -> None:
    """Raise ContextLost when `device`'s context was lost by what ran up to `where` (context_lost looked up
    on this module now: a stand-in set on it is the one asked)."""
    reason = context_lost(device)
    if reason:
        raise ContextLost(reason, where)
