"""The quantisers of one model: a placement's recipes as a run holds them, with their state and their noise.

Two things make a placement more than a table of recipe names (pitcheck.numerics.placement):

  delayed scaling   a `tensor-delayed` recipe (TE's DelayedScaling) scales a tensor by the amax history of
                    the tensor's earlier casts. Each tensor role (the logits GEMM's activation and weight
                    operands, each of Adam's moment tensors) has its own recipe instance, held here. Its
                    history and scale are training state: snapshot, restore, the checkpoint and resume
                    carry them, so that a resumed run casts with the scale the uninterrupted one had.
  stochastic        a role rounded stochastically (`Placement.stochastic`) draws its noise from a numpy
  rounding          Generator seeded by SeedSequence([run seed, step, tensor index]): the same command gives
                    the same numbers, a resumed run redraws the same noise, and no generator state needs
                    saving. The tensor index is the position of the tensor's name in sorted order (no string
                    hash, which Python salts per process).

When a cast advances a history (the rule that keeps a measurement from changing the run):
  logits            once per step, at its start: the step's forward pass runs the logits GEMM on the stored
                    model (`forward_logits`). The gradient models do not differentiate through that GEMM, so
                    its cast values are dropped and only the histories move, as in TE: a delayed recipe's
                    history takes each operand's amax, and a stateless recipe is not cast at all.
                    Measuring the FP8 head (`logits_head`, for metrics.csv) casts with the current scale on
                    a copy of each recipe: it is the head the next step's forward would compute, and a row
                    recorded more or less often leaves the histories, and so the run, exactly as they were.
  moments           once per step and moment tensor, when the updated moment is stored.
Stateful recipes on Z's or L's copy are refused: those copies are recomputed from the master whenever the
state is restored, which would advance a history on every restore.
"""
from __future__ import annotations

import copy

import numpy as np

from ..infra.errors import PitcheckError
from .placement import Placement, quantised_head
from .scaling import TensorDelayed, get_recipe

LOGITS_ROLES = ("logits_activation", "logits_weight")
# a torch model's forwards whose activation amax (of T = L L^T, formed on the host as the emulation forms it) is
# still to be observed: their L's wait on the device and are read together, at most this many steps apart
PENDING_FORWARDS = 32


def stochastic_rng(seed: int, step: int, index: int) -> np.random.Generator:
    """The noise of one tensor's stochastic rounding at one step (no state: a function of its key)."""
    return np.random.default_rng(np.random.SeedSequence([seed, step, index]))


def _host_values(values: list) -> list[float]:
    """Floats and 0-d tensors as floats, the tensors read in one transfer."""
    tensors = [v for v in values if type(v).__module__.startswith("torch")]
    if not tensors:
        return [float(v) for v in values]
    import torch

    read = iter(torch.stack(tensors).tolist())
    return [next(read) if type(v).__module__.startswith("torch") else float(v) for v in values]


class Quantisers:
    """The recipe instances of one model's placement, one per tensor role, and the run's seed."""

    def __init__(self, placement: Placement | None, seed: int = 0):
        self.placement, self.seed = placement, seed
        self.recipes = {}
        self.pending = []  # the stored L of each forward not yet observed by a delayed activation recipe
        if placement is None:
            return
        for role, name in (("z_copy", placement.z_copy), ("l_copy", placement.l_copy)):
            if name and isinstance(get_recipe(name, **placement.options), TensorDelayed):
                raise PitcheckError(f"placement {placement.name}: a stateful recipe ({name}) on {role} is not "
                                    "supported (the copy is recomputed on every restore)")
        if placement.logits:
            for role, name in zip(LOGITS_ROLES, placement.logits):
                self.recipes[role] = get_recipe(name, **placement.options)
        if placement.gradients:
            self.gradient_recipe = get_recipe(placement.gradients, **placement.options)

    def hold_moments(self, keys: tuple[str, ...]) -> None:
        """One recipe instance per moment tensor (keys as the engine's optimizer state names them)."""
        if self.placement is not None and self.placement.moments:
            for key in keys:
                self.recipes[key] = get_recipe(self.placement.moments, **self.placement.options)

    # ---- the casts ---------------------------------------------------------------------------------
    @property
    def logits_stateful(self) -> bool:
        """Whether a logits operand's recipe has a history, which a step's forward logits GEMM moves."""
        return any(isinstance(self.recipes.get(role), TensorDelayed) for role in LOGITS_ROLES)

    def forward_logits(self, Z, L) -> None:
        """The step's forward logits GEMM on the stored Z and L (where they live): of each operand's cast only a
        delayed recipe's history keeps anything, the operand's amax, so nothing else is cast. A torch Z's amax
        stays where Z is (a 0-d tensor); a torch L waits there too, pending, until a record, a checkpoint or
        PENDING_FORWARDS steps read the pending L's in one transfer and observe their T's in step order."""
        activation, weight = (self.recipes.get(role) for role in LOGITS_ROLES)
        on_device = type(L).__module__.startswith("torch")
        if isinstance(activation, TensorDelayed):
            if on_device:
                self.pending.append(L.detach())  # held, not copied: a step replaces L and never writes into it
                if len(self.pending) >= PENDING_FORWARDS:
                    self._observe_pending()
            else:
                self._observe_activation(np.asarray(L, dtype=np.float64))
        if isinstance(weight, TensorDelayed):
            weight.observe(abs(Z).amax() if on_device else float(abs(Z).max()))

    def _observe_activation(self, L: np.ndarray) -> None:
        T = L @ L.T
        self.recipes["logits_activation"].observe(float(np.max(np.abs(T), initial=0.0)))

    def _observe_pending(self) -> None:
        """The pending forwards' activation amaxes, oldest first, from one read of their L's."""
        if not self.pending:
            return
        import torch

        host = torch.stack(self.pending).to("cpu", torch.float64).numpy()
        self.pending = []
        for L in host:
            self._observe_activation(L.copy())  # a fresh array, as a single read hands it over

    def logits_head(self, Z: np.ndarray, L: np.ndarray) -> np.ndarray:
        """B = W^T of the FP8 logits GEMM at the current scales, measured on copies of the recipes."""
        self._observe_pending()
        operands = tuple(copy.deepcopy(self.recipes[r]) for r in LOGITS_ROLES)
        return quantised_head(Z, L, self.placement, operands)

    def moment(self, key: str, x):
        """A moment tensor as stored: through its own recipe instance (its history advances)."""
        return self.recipes[key].fake_quant(x, axis=-1)

    def gradients(self, grads: dict, step: int) -> dict:
        """The step's gradients through the placement's gradient recipe (x's kind, float64); each tensor
        rounded stochastically from its own seeded stream where the placement says so."""
        if self.placement is None or not self.placement.gradients:
            return grads
        stochastic = "gradients" in self.placement.stochastic
        out = {}
        for index, name in enumerate(sorted(grads)):
            rng = stochastic_rng(self.seed, step, index) if stochastic else None
            out[name] = self.gradient_recipe.fake_quant(grads[name], axis=-1,
                                                        rounding="stochastic" if stochastic else "nearest", rng=rng)
        return out

    # ---- state -------------------------------------------------------------------------------------
    def stateful(self) -> dict:
        """The roles whose recipe has state, by role."""
        return {role: r for role, r in self.recipes.items() if isinstance(r, TensorDelayed)}

    def snapshot(self) -> dict:
        """The histories and scales, and the pending forwards, copied (a cast replaces a history list, but a
        snapshot must not alias; a device's entries are tensors, which nothing changes in place)."""
        return {"recipes": {role: (r.scale, list(r.history)) for role, r in self.stateful().items()},
                "pending": list(self.pending)}

    def restore(self, snap: dict) -> None:
        for role, (scale, history) in snap["recipes"].items():
            self.recipes[role].scale, self.recipes[role].history = scale, list(history)
        self.pending = list(snap["pending"])

    def state_dict(self) -> dict:
        """Fixed-shape arrays per stateful role (a checkpoint's shapes must not depend on the step): the
        scale, the history padded with zeros to its length, and how many entries are filled."""
        self._observe_pending()
        d = {}
        for role, r in self.stateful().items():
            history = np.zeros(r.history_len)
            history[: len(r.history)] = _host_values(r.history)  # a device's entries read here, at a commit
            d[f"{role}_scale"] = np.float64(float(r.scale))
            d[f"{role}_history"] = history
            d[f"{role}_filled"] = np.int64(len(r.history))
        return d

    def load_state_dict(self, d: dict) -> None:
        for role, r in self.stateful().items():
            filled = int(d[f"{role}_filled"])
            if not 0 <= filled <= r.history_len:
                raise PitcheckError(f"the amax history of {role} has {filled} entries, outside [0, {r.history_len}]")
            r.scale = float(d[f"{role}_scale"])
            r.history = [float(a) for a in d[f"{role}_history"][:filled]]
        self.pending = []
