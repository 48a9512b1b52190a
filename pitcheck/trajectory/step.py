"""The run's model and, on the torch backend, its float64 shadow, stepped in lockstep on one gradient
stream: the shadow takes exactly the steps the model takes, so their distance measures the precision.
The shadow is numpy float64 on the CPU, torch float64 on the model's device on CUDA (shadow_engine_placement)."""
from __future__ import annotations

import numpy as np

from ..model.engine import Engine, StateBreakdown
from ..infra.errors import PitcheckError
from .events import skips_step
from ..numerics.metrics import drift_bound
from ..numerics.reference import polar_memory, random_memory, spd_with_condition
from .config import RunConfig
from .plan import Plan
from .teacher import load_teacher, start_certificate, teacher_start


def make_engine(plan: Plan, backend: str, policy, device: str) -> Engine:
    """An engine of the plan's head, with the stateful gradient source its adversary names attached."""
    engine = Engine(backend, policy, plan.settings, device, head=plan.head, seed=plan.config.seed,
                    gradient_stream=plan.config.gradient_stream)
    if plan.source:
        engine.source = plan.source.build(plan.config, engine)
    return engine


def shadow_engine_placement(plan: Plan) -> tuple[str, str]:
    """Where a torch run's float64 shadow runs: (backend, device) for make_engine.

    With the model on a CUDA device, torch float64 on that same device: a numpy shadow there would put a
    float64 step on one CPU thread beside every GPU step (at 8192 x 128 fp32 qr Adam on an H200, 220 ms a
    run step against the model's 28 ms: host work, the shadow and the numpy gradient stream; how it splits
    between them was not measured). On the CPU, numpy float64 on the
    CPU, as every committed CPU result was produced (scripts/measurements/shadow_backend.py measured the choice there).
    Either way the shadow steps on the model's numpy float64 gradients; only its arithmetic's device moves.
    Tests monkeypatch this function to run a torch float64 shadow on the CPU.
    """
    device = plan.device
    if device.startswith("cuda"):
        return "torch", device
    return "numpy", "cpu"


def describe_shadow(backend: str, device: str) -> str:
    """The manifest's words for where the shadow ran, e.g. 'torch float64 on cuda'."""
    return f"{backend} float64 on {device}"


def initial_state(plan: Plan) -> tuple[np.ndarray, np.ndarray]:
    """Z0 and L0 (Cholesky factor of T0), seeded (starting_point without the teacher's table)."""
    return starting_point(plan)[:2]


def starting_point(plan: Plan) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Z0, L0 and the teacher's table (the run's rows of it; None without a teacher).

    Without a teacher: Z0 random orthonormal, T0 = I unless cond > 1. From a teacher: its conversion in the
    plan's teacher mode (a GGUF table's default keeps E = E0), or a table's polar factor with T0 as above."""
    config = plan.config
    rng = np.random.default_rng([config.seed, 2**32 - 1])  # a stream apart from the gradients'
    L0 = teacher = None
    if config.teacher:
        teacher = load_teacher(config.teacher)
        if plan.source:  # a pretrained model's full table: the rows of the run's tokens
            teacher = plan.source.teacher_rows(config, teacher)
        if plan.teacher_mode:
            Z0, L0 = teacher_start(config.teacher, teacher, plan.teacher_mode)
        else:  # a table's polar factor with the run's own T0 (--cond), or a baseline's start
            Z0 = polar_memory(teacher)
    else:
        Z0 = random_memory(config.vocab, config.dim, rng)
    if L0 is None and config.cond == 1.0:
        L0 = np.eye(config.dim)
    elif L0 is None:
        try:
            L0 = np.linalg.cholesky(spd_with_condition(config.dim, config.cond, rng))
        except np.linalg.LinAlgError:
            raise PitcheckError(f"--cond {config.cond:g}: T0 is not positive definite in float64; "
                                "choose a smaller condition number") from None
    return Z0, L0, teacher


def _advance_source(engine, skipped: bool) -> None:
    """Step (or, with the interface step skipped, drop) the body update of the engine's stateful source."""
    if engine.source:
        engine.source.discard() if skipped else engine.source.advance()


class Lockstep:
    """The model (`engine`) and its float64 shadow (`shadow`, None without one), built at their initial state."""

    def __init__(self, config: RunConfig, plan: Plan | None = None):
        self.config, self.plan = config, plan or config.resolve()
        self.policy = self.plan.policy
        self.engine = make_engine(self.plan, config.backend, self.policy, self.plan.device)
        self.shadow = None
        if config.backend == "torch" and config.shadow:
            backend, device = shadow_engine_placement(self.plan)
            self.shadow = make_engine(self.plan, backend, self.plan.reference_policy, device)
        # the initial state is also the template a checkpoint must match
        Z0, L0, teacher = starting_point(self.plan)
        # the manifest's record of a teacher's start: which conversion it is, and how exactly it holds
        self.start_certificate = (start_certificate(config.teacher, teacher, Z0, L0, self.plan.teacher_mode)
                                  if teacher is not None and self.plan.teacher_mode else None)
        self.engine.initialise(Z0, L0)
        problem = self.engine.degenerate()
        if problem:
            raise PitcheckError(f"the initial state does not fit {config.precision}: {problem}; lower --cond")
        if self.shadow:
            self.shadow.initialise(Z0, L0)
        self._before = None

    @property
    def shadow_description(self) -> str | None:
        """Where the shadow runs, in words for the manifest ('numpy float64 on cpu'); None without one."""
        return describe_shadow(self.shadow.backend, self.shadow.device) if self.shadow else None

    @property
    def not_applicable(self) -> set[str]:
        """The metric columns that are NaN by design: no shadow, no T for the baselines, no second table when tied."""
        out = set()
        if not self.shadow:
            out |= {"shadow_Z", "shadow_T"}
        out |= self.plan.head.not_applicable
        return out

    def gradients(self, names: list[str], step: int, probe) -> tuple[dict, dict | None]:
        """This step's gradients for the model and, where a stateful source gives the shadow its own (its
        body on the same batch), for the shadow; the stateless models' part is the model's for both."""
        cfg, source = self.config, self.engine.source
        if source is None:
            return self.engine.gradients(names, cfg.seed, step, cfg.adversary_params, probe), None
        rest = [n for n in names if n != source.name]
        base = self.engine.model_gradients(rest, cfg.seed, step, cfg.adversary_params, probe)
        grads = source.add_gradients(self.engine, base, step)
        shadow = self.shadow.source.add_gradients(self.shadow, base, step) if self.shadow else None
        return grads, shadow

    def probe(self, step: int, GZ, GL) -> float:
        """Trial step for the adaptive adversary: the drift bound after it, state left untouched."""
        saved = self.engine.state_dict()
        try:
            self.engine.step({"Z": GZ, "L": np.tril(GL)}, step)
            bound = drift_bound(*self.engine.stored(), self.policy.u)
        except (StateBreakdown, PitcheckError):
            bound = float("inf")  # a step that would break the model is as bad as a step gets
        self.engine.load_state_dict(saved)
        return bound

    def step(self, grads: dict, shadow_grads: dict | None, step: int) -> list[dict]:
        """One step of the model and, unless the model skipped it, of its shadow: both or neither. Returns the
        model's events; on StateBreakdown both are back where they were.

        shadow_grads: the shadow's own gradients where a stateful source gives each its own (else grads).
        """
        self._before = (self.engine.snapshot(), self.shadow.snapshot() if self.shadow else None)
        try:
            events = self.engine.step(grads, step)
            skipped = any(map(skips_step, events))
            _advance_source(self.engine, skipped)
            # the shadow follows what the model did, so a step the model skipped the shadow skips too
            if self.shadow and not skipped:
                try:
                    shadow_events = self.shadow.step(grads if shadow_grads is None else shadow_grads, step)
                    _advance_source(self.shadow, any(map(skips_step, shadow_events)))
                except StateBreakdown as exc:
                    raise StateBreakdown(f"the float64 shadow: {exc}", exc.part) from None
            elif self.shadow:
                _advance_source(self.shadow, True)
        except StateBreakdown:
            self.undo()
            raise
        return events

    def close(self) -> None:
        """Nothing to end in one process (a sharded run ends its ranks here)."""

    def undo(self) -> None:
        """Put both back where they were before the last step."""
        before, shadow_before = self._before
        self.engine.restore(before)
        if self.shadow:
            self.shadow.restore(shadow_before)

    def measure(self, step: int) -> dict:
        """The row of metrics (and the source's losses) of the current state."""
        row = {"step": step, **self.engine.interface()}
        row["shadow_Z"], row["shadow_T"] = self.engine.distance(self.shadow) if self.shadow else (np.nan, np.nan)
        row["loss_scale"] = self.engine.loss_scale
        if self.engine.source:
            row.update(self.engine.source.losses(self.engine))
            if self.shadow:
                row.update(self.shadow.source.shadow_losses(self.shadow))
        return row

    def state_bytes(self) -> int:
        """The bytes a checkpoint's arrays hold (the engines' states, as arrays() gives them)."""
        return sum(engine.state_bytes() for engine in (self.engine, self.shadow) if engine)

    def arrays(self, step: int, later: bool = False) -> dict:
        """The checkpoint's arrays: the step, the stored Z and L, the engines' states. later: the large arrays
        as calls that give them (ArrayBackend.host_copy; a CUDA device's copies start now), for a commit
        thread to make the checkpoint's bytes while the run steps on."""
        host = self.engine.arrays.host_copy if later else None
        Z, L = self.engine.stored(host)
        arrays = {"step": np.int64(step), "Z": Z, "L": L}
        arrays.update({f"engine_{k}": v for k, v in self.engine.state_dict(host).items()})
        if self.shadow:
            shadow_host = self.shadow.arrays.host_copy if later else None
            arrays.update({f"shadow_{k}": v for k, v in self.shadow.state_dict(shadow_host).items()})
        return arrays

    def load(self, arrays: dict) -> None:
        """The engines' states from a checkpoint's arrays."""
        self.engine.load_state_dict({k[7:]: v for k, v in arrays.items() if k.startswith("engine_")})
        if self.shadow:
            self.shadow.load_state_dict({k[7:]: v for k, v in arrays.items() if k.startswith("shadow_")})
