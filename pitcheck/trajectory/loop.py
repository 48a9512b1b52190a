"""The loop of a run: build it, step it, record it, stop it cleanly on SIGINT/SIGTERM."""
from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

from ..model.engine import StateBreakdown
from ..infra.errors import PitcheckError
from .events import EventKind, breakdown, raised_by, row_events, skipped_steps_by_event, skips_step
from ..infra.progress import Progress
from ..infra.rundir import CHECKPOINT, EVENTS, LOCK, METRIC_COLUMNS, EventLines, RunDir, read_events
from ..infra.threads import thread_policy
from .checkpoint import Resume, check_restart, checkpoint_step_of, commit, input_hashes, manifest
from .config import RunConfig, check_argument, recorded_steps
from .sharded import make_lockstep
from .speculation import Speculation, speculates

# A record writes the checkpoint (the whole state: Z, L, the optimizer's moments, the shadow's) only while
# checkpoints stay this share of the run's wall time, once the state is this large: at 32768 x 512 a
# checkpoint is hundreds of MB, and one at each of a run's dense early records would stall it. Smaller
# states are checkpointed at every record, as they cost milliseconds. A record without one keeps the last
# checkpoint; a resume goes on from it and recomputes the rows after it exactly (one seeded stream).
CHECKPOINT_SHARE = 0.05
LARGE_CHECKPOINT_BYTES = 64 * 2**20


class CheckpointCadence:
    """When a record writes the checkpoint: the last one's size and cost, and when the run's part of it ended.

    Its cost is the run's seconds in the commit call and, for a checkpoint the commit thread makes
    (checkpoint.commit's LaterBytes), the thread's seconds making its bytes: the device's copies, the
    archive and its digest."""

    def __init__(self):
        self.bytes, self.main_seconds, self.at, self.made = 0, 0.0, time.monotonic(), None

    def taken(self, started: float, state_bytes: int, made=None) -> None:
        self.at = time.monotonic()
        self.bytes, self.main_seconds, self.made = state_bytes, self.at - started, made

    @property
    def seconds(self) -> float | None:
        """The last checkpoint's cost; None while the commit thread is still making it."""
        thread = 0.0 if self.made is None else self.made.seconds
        return None if thread is None else self.main_seconds + thread

    def due(self, first: bool, last: bool) -> bool:
        """Always at the first and the last step and for a small state; for a large one once the last one is
        made and the time since it is at least its cost / CHECKPOINT_SHARE."""
        if first or last or self.bytes < LARGE_CHECKPOINT_BYTES:
            return True
        cost = self.seconds
        return cost is not None and (time.monotonic() - self.at) * CHECKPOINT_SHARE >= cost


class RunBreakdown(PitcheckError):
    """The run's state broke down; the run ended at its last good state, which is committed."""


class RunInterrupted(PitcheckError):
    """SIGINT or SIGTERM stopped the run between steps; its last step is committed (or nothing was written)."""


def interrupted_message(step: int, out) -> str:
    return (f"interrupted at step {step} of {out}, checkpoint saved; the same command with --resume continues it "
            "(pitcheck compare resumes by itself)")


def _remove_created(out: Path, created: list[Path], lock_existed: bool) -> None:
    """Undo what a refused run made: its lock file, and the directories it created (left when not empty).
    A directory that was there before keeps everything but a lock this run added."""
    try:
        if out in created or not lock_existed:
            (out / LOCK).unlink(missing_ok=True)
        for d in created:  # deepest first
            d.rmdir()
    except OSError:
        pass


def _breakdown_error(out: Path, event: dict) -> RunBreakdown:
    return RunBreakdown(f"{out} broke down at step {event['step']}: {event['reason']}; the last good "
                        f"state (step {event['step'] - 1}) is checkpointed, and the run cannot go past it")


def _holds_checkpoint_to_resume(store: RunDir, config: RunConfig, resume: bool, force: bool) -> bool:
    """Ready the open directory for the run: True where it holds a run to go on from its checkpoint; a run
    without one that the config may restart, or any run with force, is cleared."""
    if force:
        store.clear()
        return False
    if store.has_run():
        if not resume:
            raise PitcheckError(f"{store.path} already holds a run; pass --resume to continue it, --force to "
                                "replace it, or choose another --out")
        if store.has(CHECKPOINT):
            return True
        check_restart(store, config)
        store.clear()
        return False
    names = store.foreign_files()
    if names and resume:
        study = (store.path / "cells").is_dir() and (store.path / "grid.json").is_file()
        hint = (f": it is a compare study, which `pitcheck compare --out {store.path}` resumes (one of its cells: "
                f"`pitcheck run --resume --out {store.path}/cells/NAME` with that cell's options)" if study else
                ": give --out the directory of the run to continue")
        raise PitcheckError(f"{store.path} holds no pitcheck run to resume ({', '.join(names[:3])}"
                            f"{', ...' if len(names) > 3 else ''}){hint}")
    if names:
        raise PitcheckError(f"{store.path} is not empty ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''})"
                            " and holds no pitcheck run: choose a new or empty directory, or pass --force to "
                            "write the run beside those files")
    return False


class Trajectory:
    """A run: build it from a config and an output directory, then call `run()`.

    Building it locks the directory (until `run()` returns) and, to resume, loads and checks it.
    """

    def __init__(self, config: RunConfig, out: Path | str, resume: bool = False, progress: bool | None = None,
                 force: bool = False, threads: int | None = None):
        if resume and force:
            raise PitcheckError("--resume continues a run and --force starts it over: give one of them")
        plan = config.validate(here=True)
        self.config = config
        self.store = RunDir(out)
        self.out = self.store.path
        self.progress_enabled = progress
        self.threads = threads  # None: the process's thread policy (pitcheck.infra.threads)
        self.rows, self.events = [], []  # the metrics rows and the events so far
        self.event_lines = EventLines()  # events.jsonl's lines so far (each commit encodes the new events only)
        self.crossed: set[str] = set()
        self.step, self.resumed_from = 0, None
        self.broken: dict | None = None  # the breakdown event a resumed run had already ended in
        self.cadence = CheckpointCadence()
        self.speculation: Speculation | None = None  # the loop's, where the run defers its checks
        if resume and not self.out.exists():
            raise PitcheckError(f"nothing to resume: {self.out} does not exist (without --resume a run starts there)")
        # everything that needs no directory is built and checked first: a run refused there creates nothing
        self.pair = make_lockstep(config, plan)
        self.engine, self.shadow, self.policy = self.pair.engine, self.pair.shadow, self.pair.policy
        self.inputs = input_hashes(self.pair.plan)
        created = [p for p in (self.out, *self.out.parents) if not p.exists()]
        lock_existed = (self.out / LOCK).exists()
        try:
            self.store.open()
            self._prepare(resume, force)
        except BaseException:
            self.store.close()
            self.pair.close()
            _remove_created(self.out, created, lock_existed)
            raise

    def _prepare(self, resume: bool, force: bool) -> None:
        if _holds_checkpoint_to_resume(self.store, self.config, resume, force):
            self._resume()
        # built once, before the first commit: it imports torch, which takes seconds
        self.manifest_data = manifest(self.config, self.pair, self.resumed_from, self.inputs)
        if self.engine.source:
            # its losses are columns of metrics.csv, beside the interface metrics of their step
            self.manifest_data[self.engine.source.name] = self.engine.source.describe()
        self.not_applicable = self.pair.not_applicable

    def _resume(self) -> None:
        resumed = Resume(self.store, self.config, self.pair, self.inputs).load()
        self.step, self.rows, self.events, self.broken = resumed.step, resumed.rows, resumed.events, resumed.broken
        self.crossed = raised_by(self.events)
        self.resumed_from = self.step

    # ---- recording ---------------------------------------------------------------------------
    def _commit(self, later: bool = False, with_checkpoint: bool = True) -> None:
        """later (a recorded step's): written by the commit thread; others wait for it (RunDir.commit).
        with_checkpoint False: the rows and events only, the last checkpoint kept."""
        started = time.monotonic()
        made = commit(self.store, self.step, self.pair, self.rows, self.events, self.manifest_data, later=later,
                      event_lines=self.event_lines, with_checkpoint=with_checkpoint)
        if with_checkpoint:
            self.cadence.taken(started, self.pair.state_bytes(), made)

    def _event(self, step: int, event: dict) -> None:
        self.events.append({"step": step, **event})

    def measure(self) -> None:
        """Measure the current state into its metrics row, committing nothing (a record's first half)."""
        row = self.pair.measure(self.step)
        self.rows = [r for r in self.rows if r["step"] < self.step] + [row]
        for event in row_events(row, self.crossed, metrics=METRIC_COLUMNS[1:], not_applicable=self.not_applicable,
                                u=self.policy.solve_u):
            self._event(self.step, event)

    def record(self) -> None:
        """Measure the current state and commit it: what the loop (and a batch of runs stepped together,
        trajectory/batched.py) does at each recorded step."""
        self.measure()
        self._commit(later=True, with_checkpoint=self.cadence.due(
            first=checkpoint_step_of(self.store.record) is None, last=self.step >= self.config.steps))

    def checkpoint(self) -> None:
        """Commit the current state (rows unchanged): what the loop does when interrupted."""
        self._commit()

    def close(self) -> None:
        """Release the directory's lock and the model, as run() does when it returns."""
        self.store.close()
        self.pair.close()

    def take_step(self, gradients: tuple[dict, dict | None] | None = None) -> None:
        """One step as the loop takes it (events included, no record); RunBreakdown where the loop would end.
        gradients: this step's (model's, shadow's or None), where the caller drew them already from this
        stored state (a batch of runs: the stream is a function of seed, step and state, so the same arrays)."""
        plan = self.pair.plan
        probe = (lambda GZ, GL: self.pair.probe(self.step, GZ, GL)) if plan.adaptive else None
        self._advance(list(plan.adversaries), probe, gradients)

    def _advance(self, names: list[str], probe, gradients=None) -> None:
        grads, shadow_grads = gradients or self.pair.gradients(names, self.step, probe)
        if self.speculation and self.speculation.takes(self.step):
            self.step = self.speculation.step(grads, shadow_grads, self.step)
            return
        try:
            self._step(grads, shadow_grads)
        except StateBreakdown as exc:
            raise self._end_in_breakdown(str(exc), exc.part) from None
        self.step += 1

    def _step(self, grads: dict, shadow_grads: dict | None) -> None:
        """One step of model and shadow; a last step that, like every one before it, was skipped is a breakdown."""
        events = self.pair.step(grads, shadow_grads, self.step)
        if (any(map(skips_step, events)) and self.step + 1 == self.config.steps
                and steps_skipped(self.events) == self.step):
            # the run's numbers would be its start's
            self.pair.undo()
            kinds = skipped_steps_by_event(self.events + [{**e, "step": self.step + 1} for e in events])
            raise StateBreakdown(f"none of the {self.config.steps} steps was applied ("
                                 + ", ".join(f"{n} {name}" for name, n in sorted(kinds.items())) + ")")
        for e in events:
            self._event(self.step + 1, e)

    def settled(self) -> bool:
        """Whether the steps taken stand (their deferred checks held); if not, the run is back at its last settled step."""
        if self.speculation is None:
            return True
        at, self.step = self.step, self.speculation.settle(self.step)
        return self.step == at

    def _end_in_breakdown(self, reason: str, part: str | None = None) -> RunBreakdown:
        """Commit the last good state, its row and the breakdown event together."""
        if not self.rows or self.rows[-1]["step"] != self.step:
            self.measure()
        self._event(self.step + 1, breakdown(reason, part))
        self._commit()
        return _breakdown_error(self.out, self.events[-1])

    # ---- the loop ----------------------------------------------------------------------------
    def run(self) -> list[dict]:
        try:
            # torch and every BLAS at the thread policy's count (one unless --threads or threads= chose
            # more): their pools spin against each other on shared cores, and one thread was measured
            # fastest for a run step (scripts/measurements/thread_ratio.py)
            with thread_policy(self.threads):
                return self._run()
        finally:
            self.store.close()
            self.pair.close()

    def _run(self) -> list[dict]:
        cfg = self.config
        if self.broken:
            raise _breakdown_error(self.out, self.broken)
        # SIGINT and SIGTERM are taken between steps, never inside one: a half-applied step (optimizer
        # state moved, Z not yet stored, shadow behind) would be inconsistent. A commit would survive
        # them (a cut commit leaves the previous one), but a deferred signal also saves the steps since.
        stop: list[int] = []
        previous = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                previous[sig] = signal.signal(sig, lambda signum, _: stop.append(signum))
        marks = [s for s in recorded_steps(cfg.steps, cfg.records_per_decade) if s > self.step]
        progress = Progress(cfg.steps, f"{cfg.backend}/{cfg.precision}/{cfg.retraction}", self.progress_enabled)
        names, plan = list(self.pair.plan.adversaries), self.pair.plan
        probe = (lambda GZ, GL: self.pair.probe(self.step, GZ, GL)) if plan.adaptive else None
        self.speculation = Speculation(self.pair) if speculates(plan, cfg.backend) else None
        try:
            if self.step == 0 and not self.rows:
                self.record()
            # the last step ends the loop only once its deferred checks held (else the run went back)
            while self.step < cfg.steps or not self.settled():
                if stop:
                    raise KeyboardInterrupt
                self._advance(names, probe)
                if marks and self.step == marks[0] and self.settled():
                    marks.pop(0)
                    self.record()
                progress.update(min(self.step, cfg.steps - 1))  # the whole bar once the last step stands
            if not self.rows or self.rows[-1]["step"] != self.step:
                self.record()
            self.store.drain()
        except KeyboardInterrupt:
            if not self.rows:  # interrupted before the first record: nothing to keep
                raise RunInterrupted(f"interrupted before the first step of {self.out}; nothing was written") from None
            # keep the work done: checkpoint this step once it stands, retaking first any deferred steps that did
            # not (a breakdown among them ends the run, as it would have); metrics rows stay the recorded steps'
            at = self.step
            while self.step < at or not self.settled():
                self._advance(names, probe)
            self._commit()
            raise RunInterrupted(interrupted_message(self.step, self.out)) from None
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        progress.update(cfg.steps)
        return self.rows


def steps_skipped(events: list[dict]) -> int:
    """How many steps these events skipped."""
    return len({e["step"] for e in events if skips_step(e)})


def skipped_steps(out: Path | str) -> dict[str, int]:
    """skipped_steps_by_event of the run in `out`."""
    return skipped_steps_by_event(read_events(Path(out) / EVENTS))


# the skips of a step whose numbers were not finite (a failed retraction is another failure); a run that
# skipped more than half its steps so is reported as a breakdown is: its last numbers are mostly its start's
NONFINITE_SKIPS = (EventKind.NONFINITE_GRADIENT.value, EventKind.GRADIENT_OVERFLOW.value,
                   EventKind.NONFINITE_STATE.value)


def mostly_skipped(skipped: dict[str, int], steps: int) -> str | None:
    """Why a run whose steps were mostly skipped on non-finite values is no trajectory (None: it is one)."""
    kinds = {k: n for k, n in skipped.items() if k in NONFINITE_SKIPS}
    if steps < 1 or 2 * sum(kinds.values()) <= steps:
        return None
    return (f"{sum(kinds.values())} of {steps} steps were skipped on non-finite values ("
            + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
            + "): most of the run was never applied, so its numbers are not a trajectory's")


def run(config: RunConfig, out: Path | str, resume: bool = False, progress: bool | None = None,
        force: bool = False, threads: int | None = None) -> list[dict]:
    """Run (or resume) a trajectory; returns the metric rows, also written to out/metrics.csv.

    Raises PitcheckError for bad input or a directory it must not touch, and RunBreakdown (a
    PitcheckError) when the state breaks down; either way the directory holds its last commit, whole.
    threads: torch and BLAS threads of the run (None: the process's thread policy, pitcheck.infra.threads).
    """
    check_argument("run: config", config, (RunConfig,), "a pitcheck.RunConfig")
    check_argument("run: out", out, (str, os.PathLike), "a directory path (str or pathlib.Path)")
    for name, value in (("resume", resume), ("force", force)):
        check_argument(f"run: {name}", value, (bool,), "True or False")
    check_argument("run: progress", progress, (bool, type(None)), "True, False or None")
    check_argument("run: threads", threads, (int, type(None)), "an int >= 1 or None")
    with thread_policy(threads):  # the manifest, built with the Trajectory, records the count
        return Trajectory(config, out, resume=resume, progress=progress, force=force, threads=threads).run()
