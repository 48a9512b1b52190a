"""Steps taken on a GPU without a host read each: their checks deferred, settled together, retaken on a failure.

A step's admission and commit ask the device seven questions (are the gradients finite and do they fit
their format, is the tangent step finite, the new state, the stored Z and L, is L's diagonal positive),
and each answer read on the host stalls the GPU until its queue drains. A speculating run asks none of them
while it steps: its engines keep the answers on the device (pitcheck.numerics.deferred_checks) and take
every step as if each held. At least every SETTLE_EVERY steps, before a record, before the run ends and
before an interrupted run is checkpointed, one read per engine judges all of them. When all held, the
steps stand and their state is the new settled one. When one failed (a skipped step, a breakdown), or a
step raised or returned an event (where an answer was read after all, or the state was already wrong), both
engines go back to the last settled state and the loop retakes the steps from there through the failing
one with every check answered at once, recording its events at their step; speculation resumes after it.
(A step with an event whose earlier steps all held is retaken alone, from the state before it.)
A step is a function of the state before it and of (seed, step), so the retaken steps are the steps a run
that never deferred takes, bit for bit, and so are its files.
"""
from __future__ import annotations

from ..infra.errors import PitcheckError
from ..model.heads import StateBreakdown

# Steps between settles at most: one host read per engine per this many steps; a failure retakes at most
# this many steps with every check answered at once
SETTLE_EVERY = 32


def speculates(plan, backend: str) -> bool:
    """Whether a run defers its checks: a torch run on CUDA whose steps read nothing else from the device.

    Not on the CPU, where an answer costs microseconds and no queue stalls (tests force it there); not with a
    stateful source (its body steps on the host), the adaptive adversary (a trial step's drift bound read
    before each real one), a re-projection threshold (a norm read at each step) or shards (their ranks'
    checks cross pipes)."""
    if backend != "torch" or not plan.device.startswith("cuda"):
        return False
    return not (plan.source or plan.adaptive or plan.settings.reproject_threshold or plan.sharding.sharded)


class Speculation:
    """A run's deferred steps since the last settled state, over its lockstep's torch engines."""

    def __init__(self, pair):
        self.pair = pair
        self.engines = [e for e in (pair.engine, pair.shadow) if e is not None]
        self.checks = [e.ops.checks for e in self.engines if e.backend == "torch"]
        self.settled: tuple | None = None  # (step, the engines' snapshots) of the last settled state
        self.retake_until = 0  # the steps below this are taken with every check answered at once
        self.retakes = 0  # how many times the run went back (a figure for tests and benchmarks)

    def takes(self, step: int) -> bool:
        """Whether the step at `step` is taken deferred; the first of a stretch keeps the state it starts from."""
        if step < self.retake_until:
            return False
        if self.settled is None:
            self.settled = (step, [e.snapshot() for e in self.engines])
        return True

    def step(self, grads: dict, shadow_grads: dict | None, step: int) -> int:
        """Take a step deferred; returns the step the run is at after it (step + 1, or where it went back to)."""
        self._defer(True, step)
        try:
            events = self.pair.step(grads, shadow_grads, step)
        except (StateBreakdown, PitcheckError, ArithmeticError, RuntimeError, ValueError):
            events = None  # the state it started from may already be wrong: retaken, the retake decides
        finally:
            self._defer(False, step)
        if events != []:
            return self._retake(step)
        if step + 1 - self.settled[0] >= SETTLE_EVERY:
            return self.settle(step + 1)
        return step + 1

    def settle(self, step: int) -> int:
        """Judge the deferred checks of the steps up to `step`; the step the run is at after it."""
        if self.settled is None:
            return step
        failed = [f for f in (c.settle() for c in self.checks) if f is not None]
        if failed:
            return self._go_back(through=min(failed))
        self.settled = None
        return step

    def _retake(self, step: int) -> int:
        """A step that raised or returned an event: where a deferred check before it failed, back to the
        settled state; else only this step is retaken, from the state before it (the lockstep's undo)."""
        failed = [f for f in (c.settle() for c in self.checks) if f is not None and f < step]
        if failed:
            return self._go_back(through=min(failed))
        self.pair.undo()
        self.settled, self.retake_until = None, step + 1
        self.retakes += 1
        return step

    def _go_back(self, through: int) -> int:
        """Both engines back at the settled state; the steps from there through `through` retaken at once."""
        start, snapshots = self.settled
        for engine, snap in zip(self.engines, snapshots):
            engine.restore(snap)
        for checks in self.checks:
            checks.discard()
        self.settled, self.retake_until = None, through + 1
        self.retakes += 1
        return start

    def _defer(self, on: bool, step: int) -> None:
        for checks in self.checks:
            checks.deferring, checks.step = on, step
