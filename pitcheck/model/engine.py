"""One optimisation step of a model (a head: PIT or a baseline, heads.py) under a precision policy.

The engine holds the master copy the optimizer updates (in the policy's master format), the optimizer's
moments (factor format), the loss scale (amp.py) and an attached gradient source's state; the head
holds what the model stores and computes with. A step: gradients admitted (finite, fitting the gradient
format after loss scaling), turned by the head into its parameters' gradients (projected onto the
tangent space for Z), into directions by the optimizer (optim.py), and moved by the head (retraction
for Z), then committed unless the new state is non-finite.
A placement's quantisers (pitcheck.numerics.quantisers: delayed-scaling histories, seeded stochastic rounding) are
the engine's state too: snapshots, restores and checkpoints carry them.
The numpy backend is the float64 reference; the torch backend runs any policy on CPU or CUDA.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from .amp import LossScaler, magnitude_peaks, peak_fits, peak_vector
from .backend import ArrayBackend, resolve_device  # noqa: F401  (resolve_device: part of this module's API)
from ..infra.errors import PitcheckError
from .heads import PitHead, StateBreakdown  # noqa: F401  (StateBreakdown: raised by step)
from .optim import MOMENTS, OPTIMIZERS, get_optimizer  # noqa: F401  (OPTIMIZERS: the CLI's choices)
from ..numerics.policy import Policy
from ..numerics.quantisers import Quantisers
from .retractions import get_retraction


@dataclass(frozen=True)
class StepSettings:
    retraction: str
    optimizer: str
    lr: float
    reproject_every: int = 0  # 0: never
    reproject_threshold: float = 0.0  # 0: never; else re-project when ||Z^T Z - I||_F exceeds it

    def __post_init__(self):
        get_retraction(self.retraction)
        get_optimizer(self.optimizer)
        if not (np.isfinite(self.lr) and self.lr > 0):
            raise PitcheckError(f"--lr must be a positive finite number, got {self.lr}")
        if self.reproject_every < 0:
            raise PitcheckError(f"--reproject-every must be >= 0, got {self.reproject_every}")
        # NaN would pass a '< 0' test and silently disable the guard
        if not (np.isfinite(self.reproject_threshold) and self.reproject_threshold >= 0):
            raise PitcheckError(f"--reproject-threshold must be a finite number >= 0, got {self.reproject_threshold}")


class Engine:
    """A head's parameters under a policy: master copy, optimizer moments, loss scale, steps."""

    def __init__(self, backend: str, policy: Policy, settings: StepSettings, device: str = "auto",
                 head: type = PitHead, seed: int = 0, gradient_stream: str = "numpy"):
        """head: the head's class (heads.HEAD_TYPES; a run's plan resolves its name); `self.head` is its name.
        gradient_stream: where the stateless models draw (gradients.GRADIENT_STREAMS)."""
        self.gradient_stream = gradient_stream
        self.arrays = ArrayBackend(backend, policy, device)
        self.backend, self.device = backend, self.arrays.device
        self.ops, self.emulated = self.arrays.ops, self.arrays.emulated
        self.policy, self.settings, self.head = policy, settings, head.name
        # seed: the run's, the first key of stochastic rounding's noise
        self.quantisers = Quantisers(policy.placement, seed)
        self.model = head(self.arrays, policy, settings, self.quantisers)
        self.optimizer = get_optimizer(settings.optimizer)
        self.scaler = LossScaler(policy.loss_scaling)
        self.opt_step = 0
        # a gradient source with state of its own (pitcheck.sources.lm), attached by the run: its state is the engine's
        self.source = None

    @property
    def loss_scale(self) -> float:
        return self.scaler.scale

    @loss_scale.setter
    def loss_scale(self, value: float) -> None:
        self.scaler.scale = value

    # ---- state -------------------------------------------------------------------------------
    def initialise(self, Z0: np.ndarray, L0: np.ndarray) -> None:
        master, moment_shapes = self.model.initial(Z0, L0)
        p = self.policy
        self.master = {k: self.arrays.to(v, p.master) for k, v in master.items()}
        self.opt = {m + k: self.arrays.to(np.zeros_like(v), p.factor)
                    for k, v in moment_shapes.items() for m in MOMENTS}
        self.quantisers.hold_moments(tuple(self.opt))
        self.model.refresh(self.master)

    def stored(self, host=None) -> tuple[np.ndarray, np.ndarray]:
        """The head's two arrays as the model stores and computes with them, as float64 numpy (exact copies):
        Z and L for PIT, E and B = W^T for the baselines. host: ArrayBackend.host_copy for calls that give them later."""
        return self.model.stored(host)

    def degenerate(self) -> str | None:
        """Why the stored model cannot compute its maps, or None (the message of its StateBreakdown)."""
        problem = self.model.breakdown()
        return str(problem) if problem else None

    def snapshot(self) -> tuple:
        """The state between steps, by reference: a step replaces these arrays, it never writes into them."""
        source = self.source.snapshot() if self.source else None
        return (self.master, dict(self.opt), self.loss_scale, self.scaler.good_steps, self.opt_step,
                self.quantisers.snapshot(), source)

    def restore(self, snap: tuple) -> None:
        master, opt, self.loss_scale, self.scaler.good_steps, self.opt_step, quantisers, source = snap
        self.master, self.opt = master, dict(opt)
        self.quantisers.restore(quantisers)
        if self.source:
            self.source.restore(source)
        self.model.refresh(self.master)

    def state_bytes(self) -> int:
        """The bytes of the master parameters and the optimizer's moments, as held (a checkpoint's bulk)."""
        return sum(map(self.arrays.nbytes, (*self.master.values(), *self.opt.values())))

    def state_dict(self, host=None) -> dict:
        """The state as float64 numpy arrays and scalars (host: as stored()'s, for the large arrays)."""
        host = host or self.arrays.numpy
        d = {f"master_{k}": host(v) for k, v in self.master.items()}
        d.update({f"opt_{k}": host(v) for k, v in self.opt.items()})
        d["loss_scale"] = np.float64(self.loss_scale)
        d["good_steps"] = np.int64(self.scaler.good_steps)
        d["opt_step"] = np.int64(self.opt_step)
        d.update({f"quantiser_{k}": v for k, v in self.quantisers.state_dict().items()})
        if self.source:
            d.update({f"source_{k}": v for k, v in self.source.state_dict().items()})
        return d

    def load_state_dict(self, d: dict) -> None:
        p, to = self.policy, self.arrays.to
        # every value came from this policy's formats, so the casts back are exact
        self.master = {k[7:]: to(v, p.master) for k, v in d.items() if k.startswith("master_")}
        self.opt = {k[4:]: to(d[k], p.factor) for k in d if k.startswith("opt_") and k != "opt_step"}
        self.loss_scale = float(d["loss_scale"])
        self.scaler.good_steps = int(d["good_steps"])
        self.opt_step = int(d["opt_step"])
        self.quantisers.load_state_dict({k[10:]: v for k, v in d.items() if k.startswith("quantiser_")})
        if self.source:
            self.source.load_state_dict({k[7:]: v for k, v in d.items() if k.startswith("source_")})
        self.model.refresh(self.master)

    # ---- the maps and metrics ----------------------------------------------------------------
    def embed_all(self) -> np.ndarray:
        return self.model.embed_all()

    def interface(self) -> dict:
        """The interface metrics of what this model computes with (NaN where undefined, and 'unmeasured' why)."""
        return self.model.interface()

    def distance(self, other: "Engine") -> tuple[float, float]:
        """Relative distances from another engine's model (the float64 shadow's): of Z and T, or of E and B."""
        return self.model.distance(other.model)

    # ---- gradients ---------------------------------------------------------------------------
    def gradients(self, names, seed: int, step: int, params, probe=None) -> dict:
        """This step's gradients from the named models, evaluated at the stored model (the attached
        source's, if named, added to the stateless models')."""
        if self.source is None or self.source.name not in names:
            return self.model_gradients(names, seed, step, params, probe)
        rest = [n for n in names if n != self.source.name]
        return self.source.add_gradients(self, self.model_gradients(rest, seed, step, params, probe), step)

    def model_gradients(self, names, seed: int, step: int, params, probe=None) -> dict:
        """The stateless models' gradients (zero for none), evaluated at the stored model."""
        return self.model.model_gradients(names, seed, step, params, probe, stream=self.gradient_stream)

    def gradient_in_format(self, G, peak: float | None = None):
        """G (times the loss scale) in the gradient format, and whether it fits without overflow. peak: max |G|
        where the caller has it (_admit takes all of a step's peaks in one host sync)."""
        peak = magnitude_peaks([G])[0] if peak is None else peak
        fmt = self.policy.gradient
        return self.arrays.to(self.scaler.scaled(G), fmt), peak_fits(self.scaler.scaled_peak(peak), fmt)

    # ---- one step ----------------------------------------------------------------------------
    def step(self, grads: dict, step_index: int) -> list[dict]:
        """Apply one step's gradients; returns the events it caused (an empty list on a clean step)."""
        # a step whose arithmetic overflows is found non-finite and recorded as an event (a skipped step);
        # numpy's warnings on the way would print pitcheck's source lines beside it
        with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
            if self.backend == "numpy":  # a counter stream's CPU tensors, viewed as the arrays they hold
                grads = {k: np.asarray(g, dtype=np.float64) for k, g in grads.items()}
            return self._step(grads, step_index)

    def _step(self, grads: dict, step_index: int) -> list[dict]:
        # the step's forward pass: its FP8 logits GEMM moves the delayed recipes' histories (Z and L kept where
        # they are stored); a stateless recipe's casts leave nothing, so such a placement reads nothing here
        if self.model.has_retraction and self.quantisers.logits_stateful:
            self.quantisers.forward_logits(self.model.Z, self.model.L)
        admitted, events = self._admit(grads)
        if admitted is None:
            return events
        placed = self.policy.placement
        if placed and placed.gradients:  # in the placement's format, rounded stochastically where it says
            admitted = {k: self.arrays.to(g, self.policy.factor)
                        for k, g in self.quantisers.gradients(admitted, step_index).items()}
        point = {k: self.arrays.to(v, self.policy.factor) for k, v in self.master.items()}
        parameter_grads = self.model.parameter_gradients(point, admitted)
        directions = {k: self._direction(g, k) for k, g in parameter_grads.items()}
        self.opt_step += 1
        moved, move_events = self.model.move(point, directions, step_index)
        if moved is None:
            return move_events
        return events + move_events + self._commit(moved)

    def _admit(self, grads: dict) -> tuple[dict | None, list[dict]]:
        """Gradients in the factor dtype, unscaled; or None and the event when the step must be skipped."""
        p = self.policy
        checks = self.ops.checks
        if checks.deferring and not any(isinstance(g, np.ndarray) for g in grads.values()):
            # the peaks stay on the device, judged at the settle by the scaler's rule at this step's scale
            checks.keep(peak_vector(list(grads.values())),
                        functools.partial(self.scaler.admits, fmt=p.gradient, scale=self.loss_scale))
            cast = {k: (self.arrays.to(self.scaler.scaled(g), p.gradient), True) for k, g in grads.items()}
        else:
            peaks = magnitude_peaks(grads.values())  # finiteness and overflow from one vector of peaks
            if not all(map(math.isfinite, peaks)):
                return None, [{"event": "nonfinite_gradient", "action": "step skipped"}]
            cast = {k: self.gradient_in_format(g, peak) for (k, g), peak in zip(grads.items(), peaks)}
        if not all(ok for _, ok in cast.values()):
            event = {"event": "gradient_overflow", "format": p.gradient, "loss_scale": self.loss_scale}
            event["action"] = self.scaler.overflowed()
            return None, [event]
        return {k: self.scaler.unscale(self.arrays.to(g, p.factor)) for k, (g, _) in cast.items()}, []

    def _direction(self, g, name: str):
        """The optimizer's direction for the parameter whose gradient is named `name`; its moments kept."""
        moments = tuple(self.opt[m + name] for m in MOMENTS)
        direction, moments = self.optimizer(g, moments, self.opt_step + 1, self.ops)
        placed = self.policy.placement
        if placed and placed.moments:  # stored narrow, as the precision-aware optimizer keeps them
            moments = tuple(self.arrays.to(self.quantisers.moment(m + name, v), self.policy.factor)
                            for m, v in zip(MOMENTS, moments))
        self.opt.update({m + name: v for m, v in zip(MOMENTS, moments)})
        return direction

    def _commit(self, master: dict) -> list[dict]:
        """Store the new master values unless any is non-finite; count the clean step for loss scaling."""
        if not all(self.ops.isfinite_all(v) for v in master.values()):
            return [{"event": "nonfinite_state", "action": "step skipped"}]
        self.master = {k: self.arrays.to(v, self.policy.master) for k, v in master.items()}
        self.model.refresh(self.master)
        problem = self.model.breakdown()
        if problem:
            raise problem  # the caller restores its snapshot
        self.scaler.clean_step()
        return []
