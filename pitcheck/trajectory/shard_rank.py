"""What one rank of a sharded run holds and does: its contiguous block of Z's rows (master, stored and
optimizer moments) and a replica of L, stepped by the distributed retractions of pitcheck.model.sharded.

The functions here run inside the ranks of a ShardedPool (they are called by name, so they live at module
level and keep the rank's state in `_RANK`). Every decision a rank takes (skip a step, raise a breakdown)
follows from all-reduced values or from an agreement collective, so the ranks never part ways.
The parent (trajectory/sharded.py) admits the gradients (finite, fitting the gradient format, loss
scaling) and hands each rank its rows of Z's gradient and its share of L's; L's gradient is all-reduced,
so the replicas of L stay bitwise equal.
"""
from __future__ import annotations

import numpy as np

_RANK: dict = {}


class RankModel:
    """This rank's block of Z (padding rows included) and its replica of L's raw parameter, with moments."""

    def __init__(self, policy, settings, layout, allreduce: str, Z_block: np.ndarray, raw: np.ndarray):
        import torch.distributed as dist

        from ..model.backend import ArrayBackend
        from ..model.optim import MOMENTS, get_optimizer
        from ..model.sharded import get_sharded_retraction

        self.rank = dist.get_rank()
        self.policy = policy
        self.arrays = ArrayBackend("torch", self.policy, "cpu")
        self.ops, self.settings, self.layout = self.arrays.ops, settings, layout
        self.allreduce = allreduce or None  # None: the tensors' own dtype
        self.retract = get_sharded_retraction(settings.retraction)
        self.optimizer, self.moments = get_optimizer(settings.optimizer), MOMENTS
        p = self.policy
        self.master = {"Z": self.arrays.to(Z_block, p.master), "raw": self.arrays.to(raw, p.master)}
        self.opt = {m + k: self.arrays.to(np.zeros_like(v), p.factor)
                    for k, v in (("Z", Z_block), ("L", raw)) for m in MOMENTS}
        self.opt_step = 0
        self.saved = None
        self.refresh()

    def refresh(self) -> None:
        p, to, ops = self.policy, self.arrays.to, self.ops
        raw = to(self.master["raw"], p.factor)
        self.Z = to(self.master["Z"], p.storage)
        self.L = to(ops.tril(raw, -1) + ops.diag(ops.softplus(ops.diag(raw))), p.storage)

    # ---- one step ------------------------------------------------------------------------------
    def step(self, GZ: np.ndarray, GL: np.ndarray) -> list[dict]:
        """One step on this rank's rows of Z's (admitted) gradient and its share of L's; the events."""
        from ..model.retractions import RetractionError
        from ..model.sharded import all_reduce_sum, tangent_projection
        from ..model.sharded.comm import all_true

        p, to, ops, s = self.policy, self.arrays.to, self.ops, self.settings
        Z, raw = to(self.master["Z"], p.factor), to(self.master["raw"], p.factor)
        gl = all_reduce_sum(to(GL, p.factor), dtype=self.allreduce)  # the replicated parameter's gradient
        gl = ops.tril(gl, -1) + ops.diag(ops.diag(gl) * ops.sigmoid(ops.diag(raw)))
        gz = tangent_projection(Z, to(GZ, p.factor), allreduce_dtype=self.allreduce)
        dirs = {k: self._direction(g, k) for k, g in (("Z", gz), ("L", gl))}
        self.opt_step += 1  # after the directions, as Engine.step counts (Adam's bias correction reads it)
        xi = tangent_projection(Z, -s.lr * dirs["Z"], allreduce_dtype=self.allreduce)
        if not all_true(ops.isfinite_all(xi)):
            return [{"event": "nonfinite_state", "action": "step skipped"}]
        try:  # the Gram (or TSQR's stack) is the same on every rank, so a failure is every rank's
            Z_new = self.retract(Z, xi, allreduce_dtype=self.allreduce)
        except RetractionError as exc:
            return [{"event": "retraction_failed", "message": str(exc), "action": "step skipped"}]
        moved = {"Z": Z_new, "raw": raw - s.lr * dirs["L"]}
        if not all_true(all(ops.isfinite_all(v) for v in moved.values())):
            return [{"event": "nonfinite_state", "action": "step skipped"}]
        self.master = {k: to(v, p.master) for k, v in moved.items()}
        self.refresh()
        return []

    def _direction(self, g, name: str):
        moments = tuple(self.opt[m + name] for m in self.moments)
        direction, moments = self.optimizer(g, moments, self.opt_step + 1, self.ops)
        self.opt.update({m + name: v for m, v in zip(self.moments, moments)})
        return direction

    def breakdown(self) -> str | None:
        """Why the stored model cannot compute (the same answer on every rank), or None."""
        from ..model.sharded.comm import all_true

        if not all_true(self.ops.isfinite_all(self.Z)):
            return f"Z has non-finite entries in {self.policy.storage} storage (on some rank)"
        if not self.ops.isfinite_all(self.L):  # L is replicated: every rank sees the same
            return f"L has non-finite entries in {self.policy.storage} storage"
        low = float(self.ops.diag(self.L).min())
        if not low > 0:
            return f"L's diagonal reached {low:g} in {self.policy.storage} storage: T = L L^T is singular"
        return None

    # ---- state ---------------------------------------------------------------------------------
    def state(self) -> tuple:
        """The state between steps, by reference (a step replaces these tensors, never writes into them)."""
        return dict(self.master), dict(self.opt), self.opt_step

    def set_state(self, state: tuple) -> None:
        master, opt, self.opt_step = state
        self.master, self.opt = dict(master), dict(opt)
        self.refresh()

    def arrays_out(self) -> dict:
        """This rank's master and moment blocks as float64 numpy (exact copies), for the checkpoint."""
        out = {f"master_{k}": self.arrays.numpy(v) for k, v in self.master.items()}
        out.update({f"opt_{k}": self.arrays.numpy(v) for k, v in self.opt.items()})
        return out

    def arrays_in(self, d: dict, opt_step: int) -> None:
        p, to = self.policy, self.arrays.to
        self.master = {k[7:]: to(v, p.master) for k, v in d.items() if k.startswith("master_")}
        self.opt = {k[4:]: to(v, p.factor) for k, v in d.items() if k.startswith("opt_")}
        self.opt_step = opt_step
        self.refresh()

    # ---- metrics on the shards -----------------------------------------------------------------
    def embedding_rows(self):
        """This rank's rows of E = Z T^{-1}, computed as the single-process torch head computes them."""
        p, to, ops = self.policy, self.arrays.to, self.ops
        L = to(self.L, p.factor)
        y = ops.solve_triangular(L, to(self.Z, p.factor).T, lower=True)
        return to(ops.solve_triangular(L.T, y, lower=False).T, p.storage)


# ---- the functions the parent calls on every rank (by name, through the pool) ------------------------
def rank_init(policy, settings, layout, allreduce, Z_full, raw) -> None:
    import torch.distributed as dist

    from ..model.sharded import scatter_rows

    _RANK["model"] = RankModel(policy, settings, layout, allreduce,
                               scatter_rows(Z_full, layout, dist.get_rank()), raw)


def rank_step(GZ_blocks, GL_shares) -> list[dict]:
    model = _RANK["model"]
    return model.step(GZ_blocks[model.rank], GL_shares[model.rank])


def rank_save() -> None:
    _RANK["saved"] = _RANK["model"].state()


def rank_restore() -> None:
    _RANK["model"].set_state(_RANK["saved"])


def rank_breakdown() -> str | None:
    return _RANK["model"].breakdown()


def rank_arrays() -> dict:
    return _RANK["model"].arrays_out()


def rank_load(blocks, opt_step: int) -> None:
    model = _RANK["model"]
    model.arrays_in(blocks[model.rank], opt_step)


def rank_stored_L() -> np.ndarray:
    return _RANK["model"].arrays.numpy(_RANK["model"].L)


def rank_measure(reference: dict) -> dict:
    """The interface metrics computed on the shards, and the distances from the reference runs.

    reference: for each of 'single' (the single-process run in the same precision) and 'shadow' (the
    float64 shadow, when there is one), every rank's rows of its stored Z and its L."""
    from .shard_metrics import measure_on_shards

    return measure_on_shards(_RANK["model"], reference)
