"""Baseline heads for the paper's comparison, on the same engine: standard tying and untied tables.

tied: one V x D table E, head W = E^T (Press & Wolf). untied: E and a separate head table B = W^T.
Both tables are unconstrained (no retraction, no T): the baselines show how far W E = I drifts when
nothing ties the two maps as pseudo-inverses. Both start from the PIT memory Z0, so W E = I at step 0.
Gradients come from the same models, evaluated with T = I; an untied head's B is driven by an
independent draw of the same adversary (stream 1), as a separate table sees different gradients.
"""
from __future__ import annotations

import numpy as np

from .engine import HEAD, Engine
from .gradients import gradient
from .metrics import head_metrics, measure_guarded, orthonormality_loss, orthonormality_ratio

HEADS = ("pit", "tied", "untied")
PIT_ONLY = ("cond_T", "min_diag_L", "breakdown_margin", "trisolve_forward", "trisolve_forward_ratio",
            "trisolve_backward", "trisolve_backward_ratio")


class TableEngine(Engine):
    def __init__(self, backend, policy, settings, device="auto", head="tied"):
        super().__init__(backend, policy, settings, device)
        self.head = head
        self.names = ("E",) if head == "tied" else ("E", "B")

    def initialise(self, Z0: np.ndarray, L0: np.ndarray) -> None:
        self._set_master({k: Z0 for k in self.names}, {k: Z0 for k in self.names})

    def _refresh_stored(self):
        self.tables = {k: self._to(v, self.policy.storage) for k, v in self.master.items()}

    def stored(self) -> tuple[np.ndarray, np.ndarray]:
        """E and B = W^T as stored (the same table twice when tied)."""
        E = self._numpy(self.tables["E"])
        return E, (self._numpy(self.tables["B"]) if "B" in self.tables else E)

    def degenerate(self) -> str | None:
        for name, table in self.tables.items():
            if not self.ops.isfinite_all(table):
                return f"table {name} has non-finite entries in {self.policy.storage} storage"
        return None

    def embed_all(self) -> np.ndarray:
        return self.stored()[0]

    def model_gradients(self, names, seed: int, step: int, params, probe=None) -> dict:
        E, B = self.stored()
        eye = np.eye(E.shape[1])
        out = {"E": gradient(names, E, eye, seed, step, params)[0]}
        if "B" in self.names:
            out["B"] = gradient(names, B, eye, seed, step, params, stream=1)[0]
        return out

    def step(self, grads: dict, step_index: int) -> list[dict]:
        admitted, events = self._admit(grads)
        if admitted is None:
            return events
        directions = {k: self._optimizer_direction(g, k) for k, g in admitted.items()}
        self.opt_step += 1
        lr, factor = self.settings.lr, self.policy.factor
        return self._commit({k: self._to(self.master[k], factor) - lr * directions[k] for k in self.names})

    def interface(self) -> dict:
        E, B = self.stored()
        out = measure_guarded([
            (("orthonormality", "orthonormality_ratio"),
             lambda: {"orthonormality": orthonormality_loss(E), "orthonormality_ratio": orthonormality_ratio(E, self.policy.u)}),
            (HEAD, lambda: head_metrics(E, B)),
        ])
        out.update({k: float("nan") for k in PIT_ONLY})
        return out

    def distance(self, other: "TableEngine") -> tuple[float, float]:
        """Relative distance of E, and of B (NaN when tied), from the float64 shadow's."""
        (E, B), (Er, Br) = self.stored(), other.stored()
        dist_B = float(np.linalg.norm(B - Br) / np.linalg.norm(Br)) if "B" in self.names else float("nan")
        return float(np.linalg.norm(E - Er) / np.linalg.norm(Er)), dist_B
