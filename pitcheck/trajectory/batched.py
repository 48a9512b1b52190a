"""Runs stepped together: B trajectories of one shape, policy and retraction (differing in seed, adversary,
learning rate, cond, teacher) advanced as one stacked computation (pitcheck.model.batched_engine), each still its
own run directory, recorded, committed and resumable exactly as `run()` would.

Each run is a Trajectory built as usual (locked, resumed, checked); between records its model and shadow
live in two stacks, and at each recorded step every run's engines are given their state back and the
run records and commits itself. The gradients stay per run (each run's own seeded stream at its own
stored state). The numbers are the unbatched run's bit for bit (tests/trajectory/test_batched.py).

What runs unbatched, by its own `run()`: a run whose engines have no stacked form
(batched_engine.unstackable: baseline heads, Adam/momentum, placements, re-projection, stateful sources
such as lm, the approximate maps, CUDA: a CUDA run's torch float64 shadow has no stacked form
either), the adaptive adversary (its probe steps the run's own engine), and a run that resumed at another
step than the others or already ended. A step with an event (a skipped step, a gradient overflow that
halves the loss scale, a failed retraction) is handed back: the run takes that one step alone, from its
state before it, records what happened, and rejoins the stack; a breakdown ends the run there. A run that
fails ALONE_AFTER_FAILURES stack steps in a row (stuck: it skips every step) takes its steps alone from then
on, beside the stack, on gradients computed with the stack's.
"""
from __future__ import annotations

import signal
import threading
from dataclasses import dataclass, field

import numpy as np

from ..model.batched_engine import StackedPit, unstackable
from ..infra.errors import PitcheckError
from ..model.stacked_gradients import stacked_gradients
from ..infra.threads import thread_policy
from .config import recorded_steps
from .loop import RunInterrupted, Trajectory, interrupted_message


@dataclass
class Outcome:
    """What became of one run of a batch: its rows, or the PitcheckError (RunBreakdown included) it ended in;
    `batched_steps`: how many of its steps the stack computed."""
    rows: list = field(default_factory=list)
    error: PitcheckError | None = None
    batched_steps: int = 0


def why_alone(trajectory: Trajectory) -> str | None:
    """Why this run cannot join a batch (None: it can)."""
    if trajectory.broken or trajectory.step >= trajectory.config.steps:
        return "nothing left to step"
    if trajectory.pair.plan.adaptive:
        return "the adaptive adversary probes the run's own engine"
    engines = [trajectory.engine] + ([trajectory.shadow] if trajectory.shadow else [])
    return next((why for why in map(unstackable, engines) if why), None)


def stack_signature(trajectory: Trajectory) -> tuple:
    """What runs stepped as one stack must share besides their step: one policy, retraction and shape (the
    stack's arithmetic is its first engine's), the shadow's backend or none, and the recording schedule."""
    c = trajectory.config
    return (trajectory.step, c.backend, c.precision, c.retraction, c.vocab, c.dim, trajectory.engine.device,
            trajectory.pair.shadow_description, c.steps, c.records_per_decade)


def run_alone(trajectory: Trajectory, outcome: Outcome) -> None:
    try:
        outcome.rows = trajectory.run()
    except PitcheckError as exc:
        outcome.error = exc


def not_continued(trajectory: Trajectory) -> RunInterrupted:
    """What a run that an interruption stopped before it went on says: it stands at its last commit."""
    return RunInterrupted(f"interrupted before {trajectory.out} went on from step {trajectory.step}; its last "
                          "commit stands")


def run_in_turn(runs: list[tuple[Trajectory, Outcome]]) -> bool:
    """Run these one after another until one is interrupted (its signal stops all of them: the rest are left
    as they are and say so); True when one was."""
    for k, (trajectory, outcome) in enumerate(runs):
        run_alone(trajectory, outcome)
        if isinstance(outcome.error, RunInterrupted):
            for later, later_outcome in runs[k + 1:]:
                later_outcome.error = not_continued(later)
                later.close()
            return True
    return False


# a loss scale backing off from 2^16 fails a few stack steps in a row at the start of an fp16 run; a run
# that fails this many is stuck (it skips every step) and costs less stepped beside the stack
ALONE_AFTER_FAILURES = 32


class StackedRuns:
    """Runs at the same step, all stackable: stepped together until each ends or is handed back."""

    def __init__(self, runs: list[Trajectory], outcomes: list[Outcome]):
        self.runs, self.outcomes = list(runs), list(outcomes)
        self.model = StackedPit([t.engine for t in runs])
        self.shadow = StackedPit([t.shadow for t in runs]) if runs[0].shadow else None
        # each run's engines' optimizer step counts when it (re)joined the stack, and the stack's steps of it
        # since: a step of the stack adds one to each count
        self.opt_steps = [self._opt_steps(t) for t in runs]
        self.since = [0] * len(runs)
        self.failing = [0] * len(runs)  # each run's stack steps that failed in a row, up to this one
        self.raising = 0  # the stack's steps in a row that raised with no run to blame (every run handed back)
        self.names = [list(t.pair.plan.adversaries) for t in runs]
        # runs whose stack step failed ALONE_AFTER_FAILURES times in a row (a state that overflows every step,
        # say; a third of the default grid's cells at 10^4 steps): each takes its steps alone from then on,
        # beside the stack, rather than cost a failed stack step and a step alone each step. Its gradients
        # come with the stack's, from stacked_gradients (a lone call's bits, at a fraction of its cost)
        self.beside: list[tuple[Trajectory, Outcome]] = []

    @staticmethod
    def _opt_steps(run: Trajectory) -> tuple[int, int]:
        return run.engine.opt_step, run.shadow.opt_step if run.shadow else 0

    def give_back(self, k: int, previous: bool = False) -> None:
        """Run k's state (before the last step with `previous`) into its own engines."""
        run, since = self.runs[k], self.since[k] - (1 if previous else 0)
        for stack, engine, start in ((self.model, run.engine, self.opt_steps[k][0]),
                                     (self.shadow, run.shadow, self.opt_steps[k][1])):
            if stack is not None:
                stack.write_into(k, engine, previous)
                engine.opt_step = start + since

    def gradients(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """Every run's gradients at its stored state (PitHead.model_gradients' bits, each run's own streams):
        the stack's runs first, then those beside it."""
        beside = [t for t, _ in self.beside]
        stored = ([self.model.stored()] if self.runs else []) + [
            tuple(a[None] for a in t.engine.stored()) for t in beside]
        # the stack's own copies as they are when nothing steps beside it (a copy fewer each step)
        Z, L = stored[0] if len(stored) == 1 else (np.concatenate(parts) for parts in zip(*stored))
        cells = [(names, t.config.seed, t.config.adversary_params) for t, names in zip(self.runs, self.names)]
        cells += [(list(t.pair.plan.adversaries), t.config.seed, t.config.adversary_params) for t in beside]
        GZ, GL = stacked_gradients(cells, Z, L, step)
        return GZ, np.tril(GL)

    def current_step(self) -> int:
        return (self.runs or [t for t, _ in self.beside])[0].step

    def step(self) -> None:
        """One step of every run; a run whose step the stack cannot take takes it alone from before it."""
        step = self.current_step()
        GZ, GL = self.gradients(step)
        n = len(self.runs)
        if n:
            self._step_stack(step, GZ[:n], GL[:n])
        self._step_beside(GZ[n:], GL[n:])

    def _step_beside(self, GZ: np.ndarray, GL: np.ndarray) -> None:
        for (run, outcome), gz, gl in zip(list(self.beside), GZ, GL):
            try:
                run.take_step(({"Z": gz, "L": gl}, None))
            except PitcheckError as exc:  # RunBreakdown: its last good state is committed
                outcome.error = exc
                self.beside = [(t, o) for t, o in self.beside if t is not run]

    def _step_stack(self, step: int, GZ: np.ndarray, GL: np.ndarray) -> None:
        for stack in (self.model, self.shadow):
            if stack is not None:
                stack.hold()
        raised = False
        try:
            failed = self.model.step(GZ, GL)
            if self.shadow is not None:  # the shadow follows the model: a run the model failed is handed back
                failed |= self.shadow.step(GZ, GL, skip=failed)
        except Exception:  # a stacked factorisation that raised for the stack (numpy's SVD, say): all handed back
            failed, raised = np.ones(len(self.runs), dtype=bool), True
        if not raised:
            self.raising = 0
        for k, t in enumerate(self.runs):
            t.step = step + 1
            self.since[k] += 1
            self.outcomes[k].batched_steps += 0 if failed[k] else 1
            self.failing[k] = self.failing[k] + 1 if failed[k] else 0
        if failed.any():
            self._hand_back(failed, step, GZ, GL, raised)

    def _hand_back(self, failed: np.ndarray, step: int, GZ: np.ndarray, GL: np.ndarray, raised: bool) -> None:
        """Each failed run takes this step alone from its state before it (recording its event) and rejoins
        the stack; a run that ends in a breakdown there leaves it, and one whose stack step failed
        ALONE_AFTER_FAILURES times in a row goes on beside it. When the stack raised
        (`raised`: every run handed back), a run whose step alone had no event is not counted as failing:
        one stuck run must not send the others off alone. A stack that raised ALONE_AFTER_FAILURES times in
        a row with no run to blame (none had an event alone) sends them all: a failure of the stack's own."""
        if raised:
            self.raising += 1
        blamed = False
        ended = np.zeros(len(self.runs), dtype=bool)
        for k in np.flatnonzero(failed):
            run = self.runs[k]
            self.give_back(k, previous=True)
            run.step = step
            ended[k] = True
            events = len(run.events)
            try:  # on the gradients the stack drew for it: the run's own, drawn from the same state
                run.take_step(({"Z": GZ[k], "L": GL[k]}, None))
            except PitcheckError as exc:  # RunBreakdown: its last good state is committed
                self.outcomes[k].error = exc
                continue
            # it goes on beside the stack from the next step
            if self.failing[k] >= ALONE_AFTER_FAILURES or self.raising >= ALONE_AFTER_FAILURES:
                self.beside.append((run, self.outcomes[k]))
                continue
            if raised and len(run.events) == events:
                self.failing[k] = 0
            blamed |= raised and len(run.events) > events
            ended[k] = False
            self.opt_steps[k], self.since[k] = self._opt_steps(run), 0
            for stack, engine in ((self.model, run.engine), (self.shadow, run.shadow)):
                if stack is not None:
                    stack.put(k, engine)
        if blamed:
            self.raising = 0
        if ended.any():
            self._leave(~ended)

    def _leave(self, keep: np.ndarray) -> None:
        """Go on with the runs in `keep` only."""
        self.runs = [t for t, ok in zip(self.runs, keep) if ok]
        self.outcomes = [o for o, ok in zip(self.outcomes, keep) if ok]
        self.opt_steps = [s for s, ok in zip(self.opt_steps, keep) if ok]
        self.since = [s for s, ok in zip(self.since, keep) if ok]
        self.failing = [s for s, ok in zip(self.failing, keep) if ok]
        self.names = [n for n, ok in zip(self.names, keep) if ok]
        if self.runs:
            self.model.keep(keep)
            if self.shadow is not None:
                self.shadow.keep(keep)

    def record(self) -> None:
        for k, t in enumerate(self.runs):
            self.give_back(k)
            t.record()
        for t, _ in self.beside:
            t.record()

    def run(self) -> None:
        """Trajectory._run for the stack: records at the run's marks, SIGINT/SIGTERM taken between steps."""
        cfg = self.runs[0].config
        stop: list[int] = []
        previous = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                previous[sig] = signal.signal(sig, lambda signum, _: stop.append(signum))
        try:
            marks = [s for s in recorded_steps(cfg.steps, cfg.records_per_decade) if s > self.runs[0].step]
            for t in self.runs:
                if t.step == 0 and not t.rows:
                    t.record()
            while (self.runs or self.beside) and self.current_step() < cfg.steps:
                if stop:
                    self._interrupted()
                    return
                self.step()
                if (self.runs or self.beside) and marks and self.current_step() == marks[0]:
                    marks.pop(0)
                    self.record()
            every = self.runs + [t for t, _ in self.beside]  # at one step, recorded at the same marks
            if every and every[0].rows[-1]["step"] != every[0].step:
                self.record()
            for t, o in list(zip(self.runs, self.outcomes)) + self.beside:
                t.store.drain()
                o.rows = t.rows
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _interrupted(self) -> None:
        """Keep the work done: every run checkpoints this step (one that left the stack, its own), and says
        so as run() does."""
        for k in range(len(self.runs)):
            self.give_back(k)
        for t, o in list(zip(self.runs, self.outcomes)) + self.beside:
            t.checkpoint()
            o.error = RunInterrupted(interrupted_message(t.step, t.out))
        self.beside = []


def run_batch(trajectories: list[Trajectory], threads: int | None = None) -> list[Outcome]:
    """Run (or resume) these trajectories, those that can be stacked together (same stack_signature) as one
    stack; one Outcome each, in order. A run that cannot join (why_alone) or has no partner runs by itself first."""
    outcomes = [Outcome() for _ in trajectories]
    with thread_policy(threads):
        stacks: dict[tuple, list[int]] = {}
        for k, t in enumerate(trajectories):
            if why_alone(t) is None:
                stacks.setdefault(stack_signature(t), []).append(k)
        stacked = {k for ks in stacks.values() if len(ks) > 1 for k in ks}
        alone = [k for k in range(len(trajectories)) if k not in stacked]
        interrupted = run_in_turn([(trajectories[k], outcomes[k]) for k in alone])
        for ks in (ks for ks in stacks.values() if len(ks) > 1):
            try:
                if interrupted:
                    for k in ks:
                        outcomes[k].error = not_continued(trajectories[k])
                    continue
                StackedRuns([trajectories[k] for k in ks], [outcomes[k] for k in ks]).run()
                interrupted = any(isinstance(outcomes[k].error, RunInterrupted) for k in ks)
            finally:
                for k in ks:
                    trajectories[k].close()
    return outcomes
