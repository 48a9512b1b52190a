"""The cost of a whole run step, what a user of `pitcheck run` or `compare` waits for: this step's gradients,
the model's step and its float64 shadow's, plus the records (a metrics row and a checkpoint commit) amortised
over the recording schedule; and from it a grid's cells per second. `pitcheck bench` reports both.

A run is built as `pitcheck run` builds it (a Trajectory in a scratch directory), so every cost a run
pays is in the figure; only the loop's bookkeeping between steps (progress bar, signal checks) is not.
"""
from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass

from ...trajectory import RunConfig, Trajectory, recorded_steps
from ...trajectory.speculation import Speculation, speculates

# the schedule a run step is amortised over: the default grid's 10^4 steps, recorded as a run records them
AMORTISED_STEPS = 10_000


@dataclass
class RunTimer:
    """One run, built and never run: `step()` takes one whole step, `record()` records and commits one row."""
    config: RunConfig
    trajectory: Trajectory
    scratch: str

    @classmethod
    def build(cls, config: RunConfig) -> "RunTimer":
        scratch = tempfile.mkdtemp(prefix="pitcheck-runcost-")
        try:
            return cls(config, Trajectory(config, f"{scratch}/run", progress=False), scratch)
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            raise

    def __post_init__(self):
        t = self.trajectory
        if speculates(t.pair.plan, self.config.backend):  # as the loop steps it (on CUDA): checks deferred
            t.speculation = Speculation(t.pair)

    def step(self) -> None:
        """One step as the loop takes it; speculating, a settle (one read per engine) every SETTLE_EVERY calls."""
        self.trajectory.take_step()

    def record(self) -> None:
        self.trajectory.settled()  # a run records only steps that stand
        self.trajectory.record()

    def measure(self) -> None:
        """A record's metrics row alone."""
        self.trajectory.measure()

    def commit(self) -> None:
        """A record's commit alone, written through: the state copied off the device, serialised and written."""
        self.trajectory.checkpoint()

    def close(self) -> None:
        self.trajectory.store.close()
        shutil.rmtree(self.scratch, ignore_errors=True)


@dataclass
class StackTimer:
    """A batch of runs as `pitcheck compare` steps them together (trajectory.batched), built and never run:
    `step()` takes one step of every run of the stack, `record()` records and commits every run once."""
    stack: object  # trajectory.batched.StackedRuns
    trajectories: list
    scratch: str

    @classmethod
    def build(cls, configs: list[RunConfig]) -> "StackTimer":
        from ...trajectory.batched import Outcome, StackedRuns

        scratch = tempfile.mkdtemp(prefix="pitcheck-runcost-")
        trajectories = []
        try:
            trajectories = [Trajectory(c, f"{scratch}/run{k}", progress=False) for k, c in enumerate(configs)]
            return cls(StackedRuns(trajectories, [Outcome() for _ in trajectories]), trajectories, scratch)
        except BaseException:
            for t in trajectories:
                t.close()
            shutil.rmtree(scratch, ignore_errors=True)
            raise

    def step(self) -> None:
        self.stack.step()

    def record(self) -> None:
        self.stack.record()

    def close(self) -> None:
        for t in self.trajectories:
            t.close()
        shutil.rmtree(self.scratch, ignore_errors=True)


def records_per_step(steps: int = AMORTISED_STEPS, per_decade: int = RunConfig.records_per_decade) -> float:
    """Records a run of `steps` steps takes on the schedule, per step."""
    return len(recorded_steps(steps, per_decade)) / steps


def amortised_ms(step_ms: float, record_ms: float, steps: int = AMORTISED_STEPS,
                 per_decade: int = RunConfig.records_per_decade) -> float:
    """A whole run step: the step itself plus its share of the run's records."""
    return step_ms + records_per_step(steps, per_decade) * record_ms


def cell_seconds(step_ms: float, record_ms: float, steps: int, per_decade: int) -> float:
    """One cell's run: its steps and its records (the first, at step 0, included)."""
    return (steps * step_ms + len(recorded_steps(steps, per_decade)) * record_ms) / 1e3


def cost_class(config: RunConfig) -> tuple:
    """What sets a step's cost: everything but the seed."""
    return (config.backend, config.precision, config.retraction, config.adversary, config.optimizer,
            config.head, config.vocab, config.dim, config.shadow, config.device)


def cost_classes(configs) -> dict[tuple, list[RunConfig]]:
    """A grid's configs grouped by cost_class."""
    out: dict[tuple, list[RunConfig]] = {}
    for config in configs:
        out.setdefault(cost_class(config), []).append(config)
    return out
