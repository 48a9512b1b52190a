"""The heads a run trains, registered by name: PIT and the paper's two baselines, on the same engine.

pit: memory Z (V x D, on the Stiefel manifold) and T = L L^T; embedding E = Z T^{-1}, head W = T Z^T.
Z moves by a retraction of a step projected onto the tangent space; L moves through its raw parameter:
strict lower triangle as is, diagonal through softplus so it stays positive.
tied: one V x D table E, head W = E^T (Press & Wolf). untied: E and a separate head table B = W^T.
The tables are unconstrained (no retraction, no T): the baselines show how far W E = I drifts when
nothing ties the two maps as pseudo-inverses. Both start from the PIT memory Z0, so W E = I at step 0.
Their gradients come from the same models, evaluated with T = I; an untied head's B is driven by an
independent draw of the same adversary (stream 1), as a separate table sees different gradients.

A head owns its parameters (the master arrays the optimizer moves), its maps, the move on its
parameters' space and the metrics that apply to it; the engine (engine.py) owns the formats, the
optimizer state and loss scaling. A head class's `has_retraction` tells PIT from the baselines.
"""
from __future__ import annotations

import numpy as np

from ..numerics.arrays import linalg_errors
from .backend import ArrayBackend
from ..infra.errors import PitcheckError
from .gradients import counter_gradient, gradient
from ..numerics.metrics import (cholesky_conditioning, head_metrics, interface_metrics, measure_guarded, orthonormality_loss,
                      orthonormality_ratio, sample_ids, trisolve_errors)
from ..numerics import device_metrics
from ..numerics.formats import FORMATS
from ..numerics.placement import through
from ..numerics.policy import Policy
from ..numerics.quantisers import Quantisers
from ..numerics.reference import embedding_matrix, softplus_inverse
from .retractions import RetractionError, get_retraction, reproject, tangent_projection

CONDITIONING = ("cond_L", "cond_T", "min_diag_L", "breakdown_margin")
TRISOLVE = ("trisolve_forward", "trisolve_forward_ratio", "trisolve_backward", "trisolve_backward_ratio")
HEAD = ("pinv_drift", "penrose", "penrose_1", "penrose_2", "penrose_3", "penrose_4", "pinv_error")
# the metrics of T and its solves, which a head without T never has
PIT_ONLY = ("cond_T", "min_diag_L", "breakdown_margin", "trisolve_forward", "trisolve_forward_ratio",
            "trisolve_backward", "trisolve_backward_ratio")


def _same_torch_device(a, b) -> bool:
    return not isinstance(a, np.ndarray) and not isinstance(b, np.ndarray) and a.device == b.device


class StateBreakdown(Exception):
    """The stored model can no longer compute (non-finite entries, L singular): the run cannot go on.

    `part` names what broke: "Z" or "L" (non-finite entries), "T" (L's diagonal at or below 0: T = L L^T
    singular), a table's name ("E", "B") for the baselines; None when no one part did (no step applied).
    """

    def __init__(self, message: str, part: str | None = None):
        super().__init__(message)
        self.part = part


class PitHead:
    """Z and the raw parameter of L; stored Z and L as the model computes with them."""

    name = "pit"
    has_retraction = True
    not_applicable: frozenset = frozenset()  # metrics.csv columns that are NaN by design

    def __init__(self, arrays: ArrayBackend, policy: Policy, settings, quantisers=None):
        self.arrays, self.ops, self.policy, self.settings = arrays, arrays.ops, policy, settings
        self.retract = get_retraction(settings.retraction)
        # the engine's pitcheck.numerics.quantisers (the logits GEMM's recipes with their state); fresh ones if none
        self.quantisers = quantisers if quantisers is not None else Quantisers(policy.placement)

    # ---- parameters ----------------------------------------------------------------------------
    def initial(self, Z0: np.ndarray, L0: np.ndarray) -> tuple[dict, dict]:
        """The master parameters at (Z0, L0), and the arrays each gradient's optimizer moments are shaped like."""
        raw = np.tril(L0, -1) + np.diag(softplus_inverse(np.diag(L0)))
        return {"Z": Z0, "raw": raw}, {"Z": Z0, "L": L0}

    def refresh(self, master: dict) -> None:
        """The stored arrays from the master ones."""
        p, to, ops = self.policy, self.arrays.to, self.ops
        raw = to(master["raw"], p.factor)
        self.Z = to(master["Z"], p.storage)
        self.L = to(ops.tril(raw, -1) + ops.diag(ops.softplus(ops.diag(raw))), p.storage)
        placed = p.placement
        if placed and placed.z_copy:  # the copy the model computes with; the master keeps full precision
            self.Z = to(through(self.Z, placed.z_copy), p.storage)
        if placed and placed.l_copy:
            self.L = to(through(self.L, placed.l_copy), p.storage)

    def stored(self, host=None) -> tuple[np.ndarray, np.ndarray]:
        """host: how a stored array reaches the host (default ArrayBackend.numpy: now; host_copy: later)."""
        host = host or self.arrays.numpy
        return host(self.Z), host(self.L)

    def breakdown(self) -> StateBreakdown | None:
        """Why the stored model cannot compute its maps, or None: checked before any solve uses L."""
        p = self.policy
        if not self.ops.isfinite_all(self.Z):
            return StateBreakdown(f"Z has non-finite entries in {p.storage} storage", "Z")
        if not self.ops.isfinite_all(self.L):
            return StateBreakdown(f"L has non-finite entries in {p.storage} storage", "L")
        diag = self.ops.diag(self.L)
        if not self.ops.all_true(diag > 0):
            low = float(diag.min())
            return StateBreakdown(f"L's diagonal reached {low:g} in {p.storage} storage: T = L L^T is singular "
                                  "and the embedding's triangular solves would divide by zero", "T")
        return None

    # ---- the maps ------------------------------------------------------------------------------
    def embed_all(self) -> np.ndarray:
        """E = Z T^{-1} as this policy computes it: solves upcast to the factor dtype, result stored."""
        if self.arrays.name == "numpy":
            return embedding_matrix(self.Z, self.L)
        return self.arrays.numpy(self._embedded())

    def _embedded(self):
        """embed_all's E where the model lives (a torch backend's tensor)."""
        p, to = self.policy, self.arrays.to
        L = to(self.L, p.factor)
        y = self.ops.solve_triangular(L, to(self.Z, p.factor).T, lower=True)
        E = self.ops.solve_triangular(L.T, y, lower=False).T
        return to(E, p.storage)

    def model_gradients(self, names, seed: int, step: int, params, probe=None, stream: str = "numpy") -> dict:
        if stream == "counter":  # drawn where the model is: only the shapes are read
            GZ, GL = self.arrays.drawn(counter_gradient(names, (self.Z.shape, self.L.shape), seed, step,
                                                        self.arrays.draw_device))
            return {"Z": GZ, "L": self.arrays.ops.tril(GL)}
        Z, L = self.stored()
        GZ, GL = gradient(names, Z, L, seed, step, params, probe)
        return {"Z": GZ, "L": np.tril(GL)}

    # ---- one step ------------------------------------------------------------------------------
    def parameter_gradients(self, point: dict, grads: dict) -> dict:
        """Z's gradient projected onto the tangent space at Z; L's carried to the raw diagonal through softplus."""
        ops, gl = self.ops, grads["L"]
        gl = ops.tril(gl, -1) + ops.diag(ops.diag(gl) * ops.sigmoid(ops.diag(point["raw"])))
        return {"Z": tangent_projection(point["Z"], grads["Z"], ops), "L": gl}

    def move(self, point: dict, directions: dict, step_index: int) -> tuple[dict | None, list[dict]]:
        """The new master parameters (None when the step must be skipped) and the events on the way."""
        s, ops, Z = self.settings, self.ops, point["Z"]
        xi = tangent_projection(Z, -s.lr * directions["Z"], ops)
        if not ops.isfinite_all(xi):
            # a step that overflowed in the policy's matmuls: the retraction's QR/SVD must not see it
            return None, [{"event": "nonfinite_state", "action": "step skipped"}]
        try:
            # a diverging map (cayley-iter's truncation) may overflow: the commit finds the state non-finite
            # and records the skipped step, so numpy's warnings on the way would be noise
            with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
                Z_new = self.retract(Z, xi, ops)
        except (RetractionError, *linalg_errors()) as exc:  # pitcheck's own checks, or the library giving up
            message = str(exc) if isinstance(exc, RetractionError) else (  # torch's class is _LinAlgError
                f"{s.retraction}: {type(exc).__name__.lstrip('_')}: {(str(exc).splitlines() or [''])[0]}")
            return None, [{"event": "retraction_failed", "message": message, "action": "step skipped"}]
        events = []
        if s.reproject_every and (step_index + 1) % s.reproject_every == 0:
            Z_new = reproject(Z_new, ops)
        elif s.reproject_threshold:
            eye = ops.eye(Z_new.shape[1], like=Z_new)
            gram_err = ops.norm(ops.matmul(Z_new.T, Z_new) - eye)
            if gram_err > s.reproject_threshold:
                Z_new = reproject(Z_new, ops)
                # 'after' above the threshold means the guard asks for less than this precision can give
                after = ops.norm(ops.matmul(Z_new.T, Z_new) - eye)
                events.append({"event": "reprojected", "orthonormality": gram_err, "after": after})
        return {"Z": Z_new, "raw": point["raw"] - s.lr * directions["L"]}, events

    # ---- metrics -------------------------------------------------------------------------------
    def interface(self) -> dict:
        """The interface metrics of what this model computes with.

        When some metric is undefined (the computed embedding overflowed, say), the others are still
        measured; the undefined ones are NaN and the row's 'unmeasured' says why. A torch backend's model is
        measured where it lives (pitcheck.numerics.device_metrics: D x D matrices and scalars reach the host),
        an FP8 logits head too (its cast of Z on the device); a state some metric is undefined for is measured
        on the host.
        """
        u, factor_u, solve_u = self.policy.u, FORMATS[self.policy.factor].u, self.policy.solve_u
        placed = self.policy.placement
        if self.arrays.name == "torch":
            try:
                # the FP8 logits GEMM's head, when the policy puts one there (pitcheck.numerics.placement)
                B = (device_metrics.memory_refused(self.quantisers.logits_head)(self.Z, self.arrays.numpy(self.L))
                     if placed and placed.logits else None)
                return device_metrics.interface_metrics(self.Z, self.L, self._embedded(), u, factor_u, B=B,
                                                        solve_u=solve_u)
            except PitcheckError:
                pass  # the host form measures each part it can and says why the others are NaN
        Z, L = self.stored()
        E = self.embed_all()
        # the FP8 logits GEMM's head, when the policy puts one there (pitcheck.numerics.placement)
        B = self.quantisers.logits_head(Z, L) if placed and placed.logits else Z @ (L @ L.T)
        try:
            return interface_metrics(Z, L, E, u, factor_u, B=B, solve_u=solve_u)
        except PitcheckError:
            pass
        ids = sample_ids(Z.shape[0], 256)
        conditioning = measure_guarded([(CONDITIONING, lambda: cholesky_conditioning(L, factor_u))])
        cond_T = conditioning["cond_T"] if np.isfinite(conditioning["cond_T"]) else None
        return measure_guarded([
            (("orthonormality", "orthonormality_ratio"),
             lambda: {"orthonormality": orthonormality_loss(Z), "orthonormality_ratio": orthonormality_ratio(Z, u)}),
            (CONDITIONING, lambda: conditioning),
            (TRISOLVE, lambda: trisolve_errors(Z, L, E[ids], ids, solve_u, cond_T)),
            (HEAD, lambda: head_metrics(E, B)),
        ], conditioning.get("unmeasured", []))

    def distance(self, other: "PitHead") -> tuple[float, float]:
        """Relative distances of Z and of T from another head's (the float64 shadow's): Z's where both live
        when they share a torch device, T's on the host (D x D)."""
        L, Lr = self.arrays.numpy(self.L), other.arrays.numpy(other.L)
        Tr = Lr @ Lr.T
        dist_T = float(np.linalg.norm(L @ L.T - Tr) / np.linalg.norm(Tr))
        if _same_torch_device(self.Z, other.Z):
            return device_metrics.relative_distance(self.Z, other.Z), dist_T
        Z, Zr = self.arrays.numpy(self.Z), other.arrays.numpy(other.Z)
        return float(np.linalg.norm(Z - Zr) / np.linalg.norm(Zr)), dist_T


class TableHead:
    """The baselines' unconstrained tables: E alone (tied) or E and B = W^T (untied). No retraction, no T."""

    has_retraction = False

    def __init__(self, arrays: ArrayBackend, policy: Policy, settings, quantisers=None):
        self.arrays, self.ops, self.policy, self.settings = arrays, arrays.ops, policy, settings

    def initial(self, Z0: np.ndarray, L0: np.ndarray) -> tuple[dict, dict]:
        return {k: Z0 for k in self.tables}, {k: Z0 for k in self.tables}

    def refresh(self, master: dict) -> None:
        self.stored_tables = {k: self.arrays.to(v, self.policy.storage) for k, v in master.items()}

    def stored(self, host=None) -> tuple[np.ndarray, np.ndarray]:
        """E and B = W^T as stored (the same table twice when tied); host as PitHead.stored's."""
        host = host or self.arrays.numpy
        E = host(self.stored_tables["E"])
        return E, (host(self.stored_tables["B"]) if "B" in self.stored_tables else E)

    def breakdown(self) -> StateBreakdown | None:
        for name, table in self.stored_tables.items():
            if not self.ops.isfinite_all(table):
                return StateBreakdown(f"table {name} has non-finite entries in {self.policy.storage} storage", name)
        return None

    def embed_all(self) -> np.ndarray:
        return self.stored()[0]

    def model_gradients(self, names, seed: int, step: int, params, probe=None, stream: str = "numpy") -> dict:
        if stream == "counter":  # each table's G_Z part of its own stream (no G_L: a table has no T)
            shape = self.stored_tables["E"].shape
            return {k: self.arrays.drawn(counter_gradient(names, (shape, (0, 0)), seed, step,
                                                          self.arrays.draw_device, stream=i))[0]
                    for i, k in enumerate(self.tables)}
        E, B = self.stored()
        eye = np.eye(E.shape[1])
        out = {"E": gradient(names, E, eye, seed, step, params)[0]}
        if "B" in self.tables:
            out["B"] = gradient(names, B, eye, seed, step, params, stream=1)[0]
        return out

    def parameter_gradients(self, point: dict, grads: dict) -> dict:
        return grads

    def move(self, point: dict, directions: dict, step_index: int) -> tuple[dict, list[dict]]:
        lr = self.settings.lr
        return {k: point[k] - lr * directions[k] for k in self.tables}, []

    def interface(self) -> dict:
        """Table metrics, where the tables live for a torch backend (as PitHead.interface)."""
        out = self._interface_on_device() if self.arrays.name == "torch" else None
        if out is None:
            out = self._interface_on_host()
        out.update({k: float("nan") for k in PIT_ONLY})
        return out

    def _interface_on_device(self) -> dict | None:
        E = self.stored_tables["E"]
        try:
            out = device_metrics.orthonormality(E, self.policy.u)
            out.update(device_metrics.head_metrics(E, self.stored_tables.get("B", E)))
        except PitcheckError:
            return None
        out["unmeasured"] = []
        return out

    def _interface_on_host(self) -> dict:
        E, B = self.stored()
        return measure_guarded([
            (("orthonormality", "orthonormality_ratio"),
             lambda: {"orthonormality": orthonormality_loss(E), "orthonormality_ratio": orthonormality_ratio(E, self.policy.u)}),
            (HEAD, lambda: head_metrics(E, B)),
        ])

    def distance(self, other: "TableHead") -> tuple[float, float]:
        """Relative distance of E, and of B (NaN when tied), from the float64 shadow's (where both live when
        they share a torch device)."""
        def relative(name: str) -> float:
            A, A_ref = self.stored_tables[name], other.stored_tables[name]
            if _same_torch_device(A, A_ref):
                return device_metrics.relative_distance(A, A_ref)
            A, A_ref = self.arrays.numpy(A), other.arrays.numpy(A_ref)
            return float(np.linalg.norm(A - A_ref) / np.linalg.norm(A_ref))

        return relative("E"), relative("B") if "B" in self.tables else float("nan")


class TiedHead(TableHead):
    name = "tied"
    tables = ("E",)
    # no T, and one table: the shadow has no second distance to measure
    not_applicable = frozenset(PIT_ONLY) | {"shadow_T"}


class UntiedHead(TableHead):
    name = "untied"
    tables = ("E", "B")
    not_applicable = frozenset(PIT_ONLY)


HEAD_TYPES: dict[str, type] = {h.name: h for h in (PitHead, TiedHead, UntiedHead)}
HEADS = tuple(HEAD_TYPES)


def get_head(name: str) -> type:
    """The head registered under name (its class: has_retraction, not_applicable, and what an engine builds)."""
    if name not in HEAD_TYPES:
        raise PitcheckError(f"unknown head {name!r}; choose from {', '.join(HEADS)}")
    return HEAD_TYPES[name]
