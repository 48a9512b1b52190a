"""A sharded run (`--shards N`, N > 1): the model's Z row-sharded over N gloo ranks (Megatron's contiguous
layout, pitcheck.model.sharded.layout), L replicated with its gradient all-reduced, stepped by the distributed
retractions; beside it, in the parent, the single-process engine in the same precision (the reference
the shard distances are measured from, and the source of the gradient stream) and the float64 shadow.

The gradient stream is the single-process run's: evaluated at the reference's stored model, admitted
once (finite, fitting the gradient format, loss scaling), then Z's gradient scattered by rows and L's
split into per-rank shares (rank r's share weighted by its real rows / V, as a vocabulary-parallel
backward produces partial sums) that the ranks all-reduce. So sharded and single-process runs see the
same gradients at every step and differ only by the sharded arithmetic.

The pool's ranks live as long as the run; `close()` ends them (a killed parent's ranks end when their
pipe closes).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..infra.errors import PitcheckError
from .events import skips_step
from ..model.heads import StateBreakdown
from ..model.amp import LossScaler, fits
from .shard_rank import (rank_arrays, rank_breakdown, rank_init, rank_load, rank_measure, rank_restore, rank_save,
                         rank_stored_L, rank_step)
from .shard_metrics import SHARD_UNMEASURED
from .step import Lockstep

# every collective a step makes (a few D x D all-reduces) is quick; a rank silent this long is hung
RANK_TIMEOUT_S = 120.0


class ShardedEngine:
    """The sharded model as the run loop sees it: N ranks each holding a block of Z and a replica of L."""

    def __init__(self, plan, Z0: np.ndarray, L0: np.ndarray, raw0: np.ndarray):
        from ..model.sharded import ShardedPool, shard_layout

        sharding = plan.sharding
        self.config, self.policy = plan.config, plan.policy
        self.layout = shard_layout(plan.config.vocab, sharding.shards, sharding.pad_multiple or None)
        self.scaler = LossScaler(plan.policy.loss_scaling)
        self.pool = ShardedPool(sharding.shards, timeout=RANK_TIMEOUT_S)
        try:
            self.pool.run(rank_init, plan.policy, plan.settings, self.layout, sharding.allreduce_dtype, Z0, raw0)
        except BaseException:
            self.close()
            raise
        self.opt_step = 0

    def close(self) -> None:
        self.pool.close()

    def _on_ranks(self, fn, *args) -> list:
        return self.pool.run(fn, *args)

    # ---- gradients -----------------------------------------------------------------------------
    def admit(self, grads: dict, arrays) -> tuple[dict | None, list[dict]]:
        """The gradients in the factor format, unscaled, as float64 numpy; or None and the skip event.
        arrays: the reference engine's ArrayBackend (same policy), which does the casts."""
        p = self.policy
        if not all(np.isfinite(g).all() for g in grads.values()):
            return None, [{"event": "nonfinite_gradient", "action": "step skipped"}]
        scaled = {k: self.scaler.scaled(g) for k, g in grads.items()}
        if not all(fits(g, p.gradient) for g in scaled.values()):
            event = {"event": "gradient_overflow", "format": p.gradient, "loss_scale": self.scaler.scale}
            event["action"] = self.scaler.overflowed()
            return None, [event]
        return {k: arrays.numpy(self.scaler.unscale(arrays.to(arrays.to(g, p.gradient), p.factor)))
                for k, g in scaled.items()}, []

    def _shares(self, grads: dict) -> tuple[list, list]:
        from ..model.sharded import scatter_rows

        n, V = self.layout.world_size, self.layout.vocab_size
        blocks = [scatter_rows(grads["Z"], self.layout, r) for r in range(n)]
        shares = [grads["L"] * (self.layout.real_rows(r) / V) for r in range(n)]
        return blocks, shares

    def step(self, grads: dict, arrays) -> list[dict]:
        admitted, events = self.admit(grads, arrays)
        if admitted is None:
            return events
        self.opt_step += 1
        events = self._on_ranks(rank_step, *self._shares(admitted))[0]
        if events:
            return events
        problem = self._on_ranks(rank_breakdown)[0]
        if problem:
            part = "Z" if problem.startswith("Z ") else "L" if problem.startswith("L ") else "T"
            raise StateBreakdown(f"the sharded model: {problem}", part)
        self.scaler.clean_step()
        return []

    # ---- state ---------------------------------------------------------------------------------
    def save(self) -> None:
        self._saved_host = (self.scaler.scale, self.scaler.good_steps, self.opt_step)
        self._on_ranks(rank_save)

    def restore(self) -> None:
        self.scaler.scale, self.scaler.good_steps, self.opt_step = self._saved_host
        self._on_ranks(rank_restore)

    def state_dict(self) -> dict:
        """Every rank's blocks stacked in rank order (padding rows included: the checkpoint restores the
        ranks exactly), the replicated arrays from rank 0, the loss scale and the step count."""
        parts = self._on_ranks(rank_arrays)
        d = {}
        for key in parts[0]:
            d[key] = np.concatenate([p[key] for p in parts], 0) if key.endswith("Z") else parts[0][key]
        d["loss_scale"] = np.float64(self.scaler.scale)
        d["good_steps"] = np.int64(self.scaler.good_steps)
        d["opt_step"] = np.int64(self.opt_step)
        return d

    def load_state_dict(self, d: dict) -> None:
        blocks = []
        for r in range(self.layout.world_size):
            start, stop = self.layout.slice(r)
            blocks.append({k: (v[start:stop] if k.endswith("Z") else v) for k, v in d.items()
                           if k.startswith(("master_", "opt_")) and k != "opt_step"})
        self.scaler.scale, self.scaler.good_steps = float(d["loss_scale"]), int(d["good_steps"])
        self.opt_step = int(d["opt_step"])
        self._on_ranks(rank_load, blocks, self.opt_step)

    def stored_L(self) -> np.ndarray:
        return self._on_ranks(rank_stored_L)[0]

    def degenerate(self) -> str | None:
        return self._on_ranks(rank_breakdown)[0]

    def measure(self, reference: dict) -> dict:
        return self._on_ranks(rank_measure, reference)[0]


class ShardedLockstep(Lockstep):
    """Lockstep with the sharded model as the run's model: `engine` stays the single-process engine in the
    same precision (the gradient stream's source and the shard distances' reference), `sharded` is the
    model whose metrics the run records, and the float64 shadow follows the sharded model's steps."""

    def __init__(self, config):
        # the ranks compute on the CPU (gloo), and so does their reference, whatever --device auto finds
        super().__init__(replace(config, device="cpu"))
        Z0, L0 = self.engine.stored()
        raw0 = self.engine.state_dict()["master_raw"]
        self.sharded = ShardedEngine(self.plan, Z0, L0, raw0)
        try:
            problem = self.sharded.degenerate()
            if problem:
                raise PitcheckError(f"the initial state does not fit {config.precision}: {problem}; lower --cond")
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        self.sharded.close()

    @property
    def not_applicable(self) -> set[str]:
        return super().not_applicable | set(SHARD_UNMEASURED)

    def step(self, grads: dict, shadow_grads: dict | None, step: int) -> list[dict]:
        """One step of the sharded model, the single-process reference and the shadow: the reference and the
        shadow take the steps the sharded model takes (a step it skipped, they skip)."""
        self._before = (self.engine.snapshot(), self.shadow.snapshot() if self.shadow else None)
        self.sharded.save()
        try:
            events = self.sharded.step(grads, self.engine.arrays)
            if not any(map(skips_step, events)):
                self.engine.step(grads, step)
                if self.shadow:
                    try:
                        self.shadow.step(grads, step)
                    except StateBreakdown as exc:
                        raise StateBreakdown(f"the float64 shadow: {exc}", exc.part) from None
        except StateBreakdown:
            self.undo()
            raise
        return events

    def undo(self) -> None:
        super().undo()
        self.sharded.restore()

    def measure(self, step: int) -> dict:
        reference = {"single": self.engine.stored(), "shadow": self.shadow.stored() if self.shadow else None}
        row = {"step": step, **self.sharded.measure(reference)}
        row["loss_scale"] = self.sharded.scaler.scale
        return row

    def arrays(self, step: int, later: bool = False) -> dict:
        """The checkpoint: the single-process run's arrays as Lockstep saves them, and the sharded model's
        (gathered from the ranks now)."""
        arrays = super().arrays(step, later)
        arrays.update({f"sharded_{k}": v for k, v in self.sharded.state_dict().items()})
        return arrays

    def load(self, arrays: dict) -> None:
        super().load(arrays)
        self.sharded.load_state_dict({k[8:]: v for k, v in arrays.items() if k.startswith("sharded_")})


def make_lockstep(config, plan=None) -> Lockstep:
    """The run's model and references: a ShardedLockstep for --shards N > 1, else the single-process Lockstep.
    plan: the config's, where the caller resolved it already."""
    return ShardedLockstep(config) if config.shards > 1 else Lockstep(config, plan)
