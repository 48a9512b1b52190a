"""B PIT engines of one policy, shape and retraction stepped as one stacked computation.

At 128 x 8 a step is dispatch-bound: a few hundred microseconds of Python and library calls around
microseconds of arithmetic. Stacking B cells' Z (B x V x D) and L's raw parameter (B x D x D) pays those
calls once per B cells. The arithmetic is Engine.step's and PitHead's (engine.py, heads.py) for the one
class of cells it serves, `unstackable(engine)` None: the PIT head, plain SGD, no placement, no
re-projection, no stateful source, a retraction with a stacked form (its record in model/retractions/). Each cell
keeps its own learning rate and, under fp16's loss scaling, its own loss scale and count of clean steps
(amp.LossScaler's rule, per cell); seeds, adversaries, cond and teachers only shape the gradients and the
initial state, which stay per cell.

Only the clean step is stacked: a cell whose step would raise an event or a breakdown in Engine.step
(non-finite or overflowing gradients, a non-finite step or state, a failed retraction, L's diagonal at
or below 0; a gradient that overflows its format after loss scaling) is reported in the `failed` mask, left
at its state before the step, and the caller hands it back to its own unbatched engine, which redoes the
step and records what happens (a halved loss scale, say); `put` takes its state back into the stack.
"""
from __future__ import annotations

import math

import numpy as np

from . import amp
from .amp import fits
from .retractions import STACKED_RETRACTIONS
from .retractions.stacked import StackedOps, tangent_projection
from ..numerics.formats import overflow_threshold


def unstackable(engine) -> str | None:
    """Why this engine's step has no stacked form (None: it has one)."""
    p, s = engine.policy, engine.settings
    reasons = [(engine.head != "pit", f"head {engine.head}"), (s.optimizer != "sgd", f"optimizer {s.optimizer}"),
               (p.loss_scaling and math.frexp(engine.loss_scale)[0] != 0.5,
                f"a loss scale that is not a power of two ({engine.loss_scale!r}: its unscale would round)"),
               (p.placement is not None, f"placement ({p.name})"),
               (bool(s.reproject_every or s.reproject_threshold), "re-projection"),
               (engine.source is not None, "a stateful gradient source"),
               (s.retraction not in STACKED_RETRACTIONS, f"retraction {s.retraction} (no stacked form)"),
               (engine.backend == "torch" and engine.device != "cpu", f"device {engine.device}")]
    return next((why for bad, why in reasons if bad), None)


class StackedPit:
    """The master Z and raw L of B engines as two stacks, stepped together; `write_into` gives one cell's
    state back to its engine (for a record, a checkpoint or an unbatched step)."""

    def __init__(self, engines: list):
        first = engines[0]
        self.arrays, self.policy, self.backend = first.arrays, first.policy, first.backend
        self.ops = StackedOps(first.ops)
        self.retract = STACKED_RETRACTIONS[first.settings.retraction]
        self.torch = self.ops.torch
        self.master = {k: self._stack([e.master[k] for e in engines]) for k in first.master}
        lrs = np.array([e.settings.lr for e in engines], dtype=np.float64)[:, None, None]
        # Engine.step multiplies by the Python float lr: the factor dtype's rounding of it, as here
        self.lr = self._to(lrs, self.policy.factor)
        # the loss scale and clean-step count of each cell (1.0 and 0 without loss scaling)
        self.scales = np.array([e.loss_scale for e in engines], dtype=np.float64)
        self.good_steps = np.array([e.scaler.good_steps for e in engines], dtype=np.int64)
        self.previous = self.master
        self.previous_scaling = (self.scales, self.good_steps)
        self.threshold = overflow_threshold(self.policy.gradient)
        self._refresh()

    def __len__(self) -> int:
        return self.master["Z"].shape[0]

    def _stack(self, xs):
        return self.torch.stack(xs) if self.torch else np.stack(xs)

    def _to(self, x, fmt):
        return self.arrays.to(x, fmt)

    def _refresh(self) -> None:
        """PitHead.refresh for the stack: the stored Z and L from the master arrays."""
        p, ops = self.policy, self.ops
        raw = self._to(self.master["raw"], p.factor)
        self.Z = self._to(self.master["Z"], p.storage)
        self.L = self._to(ops.tril(raw, -1) + ops.diag_embed(ops.on_diagonals(ops.base.softplus, raw)), p.storage)

    def stored(self) -> tuple[np.ndarray, np.ndarray]:
        """The stored Z and L of every cell as float64 numpy stacks (PitHead.stored, exact copies)."""
        if self.torch:
            return (self.Z.detach().to("cpu", self.torch.float64).numpy(),
                    self.L.detach().to("cpu", self.torch.float64).numpy())
        return np.asarray(self.Z, dtype=np.float64), np.asarray(self.L, dtype=np.float64)

    def _admitted(self, GZ: np.ndarray, GL: np.ndarray, skip: np.ndarray | None) -> tuple[dict, np.ndarray]:
        """Engine._admit for the stack: the gradients in the factor dtype, and the cells that must skip
        (`skip` among them)."""
        p = self.policy
        bad = ~(np.isfinite(GZ).reshape(len(GZ), -1).all(1) & np.isfinite(GL).reshape(len(GL), -1).all(1))
        if skip is not None:
            bad |= skip
        if p.loss_scaling:  # LossScaler.scaled: G times the cell's scale, in float64 (one rounding, as there)
            GZ, GL = GZ * self.scales[:, None, None], GL * self.scales[:, None, None]
        if self.threshold is not None:
            peak = np.maximum(np.abs(GZ).reshape(len(GZ), -1).max(1), np.abs(GL).reshape(len(GL), -1).max(1))
            bad |= ~(peak < self.threshold)
        else:
            bad |= ~np.array([fits(gz, p.gradient) and fits(gl, p.gradient) for gz, gl in zip(GZ, GL)])
        if bad.any():  # their step is the unbatched engine's; zeros keep the stack's arithmetic quiet
            GZ, GL = GZ.copy(), GL.copy()
            GZ[bad], GL[bad] = 0.0, 0.0
        grads = {k: self._to(self._to(g, p.gradient), p.factor) for k, g in (("Z", GZ), ("L", GL))}
        if p.loss_scaling:
            grads = {k: self._unscale(g) for k, g in grads.items()}
        return grads, bad

    def _unscale(self, g):
        """LossScaler.unscale per cell. Its g / scale divides a factor-dtype array by a Python float that
        the library rounds to the array's compute type (float32 for the 16-bit types, else the dtype);
        here each cell's scale in that type. Scales are powers of two (unstackable checks), so both round
        the same exact quotient once."""
        if not self.torch:
            return g / self.scales[:, None, None]
        t = self.torch
        compute = t.float32 if g.dtype in (t.float16, t.bfloat16) else g.dtype
        scale = t.from_numpy(self.scales).to(device=g.device, dtype=compute)[:, None, None]
        return (g / scale).to(g.dtype)

    def step(self, GZ: np.ndarray, GL: np.ndarray, skip: np.ndarray | None = None) -> np.ndarray:
        """One step of every cell on its gradients (B x V x D and B x D x D float64, L's lower triangle);
        returns the cells that failed (their state is `previous`, the step's the unbatched engine's).
        `skip`: cells handed back whatever their gradients (a shadow skips the cells its model failed: their
        gradients may be ones the model's format refused, which would only break the shadow's factorisations)."""
        # a cell whose map overflows is in the failed mask (its own engine records the event): numpy's
        # warnings on the way would be noise
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            return self._step(GZ, GL, skip)

    def _step(self, GZ: np.ndarray, GL: np.ndarray, skip: np.ndarray | None) -> np.ndarray:
        p, ops = self.policy, self.ops
        self.hold()  # also what an exception below leaves: the state before the step
        grads, failed = self._admitted(GZ, GL, skip)
        point = {k: self._to(v, p.factor) for k, v in self.master.items()}
        Z, raw = point["Z"], point["raw"]
        gl = grads["L"]
        gl = ops.tril(gl, -1) + ops.diag_embed(ops.diagonal(gl) * ops.on_diagonals(ops.base.sigmoid, raw))
        gz = tangent_projection(Z, grads["Z"], ops)  # SGD: the direction is the gradient
        xi = tangent_projection(Z, -self.lr * gz, ops)
        xi_bad = ~ops.finite(xi)
        if xi_bad.any():  # the retraction's factorisations must not see them (Engine skips the step)
            xi = xi * self._mask(~xi_bad, xi)
        Z_new, retraction_failed = self.retract(Z, xi, ops)
        moved = {"Z": Z_new, "raw": raw - self.lr * gl}
        new = {k: self._to(v, p.master) for k, v in moved.items()}
        failed = failed | xi_bad | retraction_failed | ~ops.finite(new["Z"]) | ~ops.finite(new["raw"])
        self.master = new
        self._refresh()
        if p.loss_scaling:  # LossScaler.clean_step for every cell (a failed cell's is its `previous` again)
            good = self.good_steps + 1
            grow = good >= amp.LOSS_SCALE_GROWTH_INTERVAL
            self.scales = np.where(grow, self.scales * 2.0, self.scales)
            self.good_steps = np.where(grow, 0, good)
        return failed | self._broken()

    def hold(self) -> None:
        """Make the current state `previous`: what a step that raises, or is never taken, leaves."""
        self.previous = self.master
        self.previous_scaling = (self.scales, self.good_steps)

    def _mask(self, keep: np.ndarray, like):
        m = keep.astype(np.float64)[:, None, None]
        return self._to(m, self.policy.factor) if self.torch else m

    def _broken(self) -> np.ndarray:
        """PitHead.breakdown per cell: Z or L non-finite, or L's diagonal not above 0."""
        ops = self.ops
        diag = ops.diagonal(self.L)
        positive = (diag > 0).all(-1)
        positive = positive.cpu().numpy() if self.torch else positive
        return ~(ops.finite(self.Z) & ops.finite(self.L) & positive)

    def keep(self, cells: np.ndarray) -> None:
        """Go on with these cells only (a bool mask over the stack): the others were handed back."""
        index = np.flatnonzero(cells)
        pick = (lambda x: x[self.torch.from_numpy(index)]) if self.torch else (lambda x: x[index])
        self.master = {k: pick(v) for k, v in self.master.items()}
        self.previous = {k: pick(v) for k, v in self.previous.items()}
        self.lr = pick(self.lr)
        self.scales, self.good_steps = self.scales[index], self.good_steps[index]
        self.previous_scaling = tuple(x[index] for x in self.previous_scaling)
        self._refresh()

    def write_into(self, cell: int, engine, previous: bool = False) -> None:
        """Cell `cell`'s master arrays (before the last step with `previous`) into its own engine."""
        source = self.previous if previous else self.master
        copy = (lambda x: x.clone()) if self.torch else (lambda x: x.copy())
        engine.master = {k: copy(v[cell]) for k, v in source.items()}
        engine.model.refresh(engine.master)
        scales, good_steps = self.previous_scaling if previous else (self.scales, self.good_steps)
        engine.loss_scale, engine.scaler.good_steps = float(scales[cell]), int(good_steps[cell])

    def put(self, cell: int, engine) -> None:
        """Cell `cell` of the stack from its engine's state (after it took a step alone), the others untouched.
        New arrays, as a step makes them: `previous` (the other failed cells' state before the step, still to
        be given back) keeps the old ones."""
        def replaced(stack, value):
            out = stack.copy() if isinstance(stack, np.ndarray) else stack.clone()
            out[cell] = value
            return out

        self.master = {k: replaced(v, engine.master[k]) for k, v in self.master.items()}
        self.scales = replaced(self.scales, engine.loss_scale)
        self.good_steps = replaced(self.good_steps, engine.scaler.good_steps)
        self._refresh()
