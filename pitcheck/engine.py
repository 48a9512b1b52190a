"""One optimisation step of a PIT model under a precision policy, for the numpy and torch backends.

The engine holds the master copy the optimizer updates, the stored copy the model computes with, and
the optimizer state. Z moves by a retraction of a projected (Riemannian) step; L moves through its
raw parameter: strict lower triangle as is, diagonal through softplus so it stays positive.
The numpy backend is the float64 reference; the torch backend runs any policy on CPU or CUDA.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .arrays import NumpyOps, TorchOps
from .errors import PitcheckError
from .formats import FORMATS, overflow_threshold, round_to
from .gradients import gradient
from .metrics import (cholesky_conditioning, head_metrics, interface_metrics, measure_guarded, orthonormality_loss,
                      orthonormality_ratio, sample_ids, trisolve_errors)
from .policy import Policy
from .reference import embedding_matrix, softplus_inverse
from .retractions import RetractionError, get_retraction, reproject, tangent_projection

OPTIMIZERS = ("sgd", "momentum", "adam")
CONDITIONING = ("cond_L", "cond_T", "min_diag_L", "breakdown_margin")
TRISOLVE = ("trisolve_forward", "trisolve_forward_ratio", "trisolve_backward", "trisolve_backward_ratio")
HEAD = ("pinv_drift", "penrose", "penrose_1", "penrose_2", "penrose_3", "penrose_4", "pinv_error")
MOMENTUM, BETA1, BETA2, ADAM_EPS = 0.9, 0.9, 0.999, 1e-8
# torch.amp.GradScaler's defaults
LOSS_SCALE_INIT, LOSS_SCALE_GROWTH_INTERVAL = 2.0**16, 2000


@dataclass(frozen=True)
class StepSettings:
    retraction: str
    optimizer: str
    lr: float
    reproject_every: int = 0  # 0: never
    reproject_threshold: float = 0.0  # 0: never; else re-project when ||Z^T Z - I||_F exceeds it

    def __post_init__(self):
        get_retraction(self.retraction)
        if self.optimizer not in OPTIMIZERS:
            raise PitcheckError(f"unknown optimizer {self.optimizer!r}; choose from {', '.join(OPTIMIZERS)}")
        if not (np.isfinite(self.lr) and self.lr > 0):
            raise PitcheckError(f"--lr must be a positive finite number, got {self.lr}")
        if self.reproject_every < 0:
            raise PitcheckError(f"--reproject-every must be >= 0, got {self.reproject_every}")
        # NaN would pass a '< 0' test and silently disable the guard
        if not (np.isfinite(self.reproject_threshold) and self.reproject_threshold >= 0):
            raise PitcheckError(f"--reproject-threshold must be a finite number >= 0, got {self.reproject_threshold}")


class StateBreakdown(Exception):
    """The stored model can no longer compute (non-finite entries, L singular): the run cannot go on."""


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise PitcheckError(f"--device {device} asked for, but torch sees no CUDA device")
    if device != "cpu" and not device.startswith("cuda"):
        raise PitcheckError(f"unknown device {device!r}; choose auto, cpu or cuda")
    return device


class Engine:
    """A PIT model (Z and the raw parameter of L) under a policy; TableEngine (heads.py) reuses it."""

    def __init__(self, backend: str, policy: Policy, settings: StepSettings, device: str = "auto"):
        self.backend, self.policy, self.settings = backend, policy, settings
        self.retract = get_retraction(settings.retraction)
        self.emulated: list[str] = []
        if backend == "numpy":
            if policy.name != "fp64":
                raise PitcheckError(
                    f"the numpy backend is the float64 reference; run --precision {policy.name} "
                    "with --backend torch"
                )
            self.device = "cpu"
            self.ops = NumpyOps()
            self._dtype = {"fp64": np.float64}
        elif backend == "torch":
            import torch

            self.torch = torch
            self.device = resolve_device(device)
            self._dtype = {
                "fp64": torch.float64,
                "fp32": torch.float32,
                "tf32": torch.float32,
                "bf16": torch.bfloat16,
                "fp16": torch.float16,
            }
            on_cuda = self.device.startswith("cuda")
            if on_cuda:
                # tf32 is native on CUDA; set explicitly so fp32 really is fp32
                torch.backends.cuda.matmul.allow_tf32 = policy.matmul == "tf32"
                torch.backends.cudnn.allow_tf32 = policy.matmul == "tf32"
            if policy.matmul == "tf32" and not on_cuda:
                self.ops = TorchOps(matmul_format=FORMATS["tf32"])
                self.emulated.append("tf32 matmul emulated on CPU by rounding operands to 11 bits")
            elif policy.matmul in ("bf16", "fp16"):
                self.ops = TorchOps(matmul_dtype=self._dtype[policy.matmul], native=on_cuda)
                if not on_cuda:
                    self.emulated.append(f"{policy.matmul} matmul emulated on CPU: operands cast to "
                                         f"{policy.matmul}, fp32 accumulation, result rounded")
            else:
                self.ops = TorchOps()
        else:
            raise PitcheckError(f"unknown backend {backend!r}; choose numpy or torch")
        self.loss_scale = LOSS_SCALE_INIT if policy.loss_scaling else 1.0
        self.good_steps = 0
        self.opt_step = 0
        # a gradient source with state of its own (pitcheck.lm), attached by the run: its state is the engine's
        self.source = None

    # ---- conversions -------------------------------------------------------------------------
    def _to(self, x, fmt: str):
        if self.backend == "numpy":
            return np.asarray(x, dtype=np.float64)
        if isinstance(x, np.ndarray):
            x = self.torch.from_numpy(np.ascontiguousarray(x, dtype=np.float64)).to(self.device)
        return x.to(self._dtype[fmt])

    def _numpy(self, x) -> np.ndarray:
        return self.ops.to_numpy(x)

    def _factor_L(self, raw):
        return self.ops.tril(raw, -1) + self.ops.diag(self.ops.softplus(self.ops.diag(raw)))

    # ---- state -------------------------------------------------------------------------------
    def initialise(self, Z0: np.ndarray, L0: np.ndarray) -> None:
        raw = np.tril(L0, -1) + np.diag(softplus_inverse(np.diag(L0)))
        self._set_master({"Z": Z0, "raw": raw}, {"Z": Z0, "L": L0})

    def _set_master(self, master: dict, opt_shapes: dict) -> None:
        p = self.policy
        self.master = {k: self._to(v, p.master) for k, v in master.items()}
        self.opt = {m + k: self._to(np.zeros_like(v), p.factor) for k, v in opt_shapes.items() for m in "mv"}
        self._refresh_stored()

    def _refresh_stored(self):
        p = self.policy
        self.Z = self._to(self.master["Z"], p.storage)
        self.L = self._to(self._factor_L(self._to(self.master["raw"], p.factor)), p.storage)

    def stored(self) -> tuple[np.ndarray, np.ndarray]:
        """Z and L as the model stores and computes with them, as float64 numpy (exact copies)."""
        return self._numpy(self.Z), self._numpy(self.L)

    def degenerate(self) -> str | None:
        """Why the stored model cannot compute its maps, or None: checked before any solve uses L."""
        p = self.policy
        if not self.ops.isfinite_all(self.Z):
            return f"Z has non-finite entries in {p.storage} storage"
        if not self.ops.isfinite_all(self.L):
            return f"L has non-finite entries in {p.storage} storage"
        diag = self.ops.diag(self.L)
        if not bool((diag > 0).all()):
            low = float(diag.min())
            return (f"L's diagonal reached {low:g} in {p.storage} storage: T = L L^T is singular "
                    "and the embedding's triangular solves would divide by zero")
        return None

    def snapshot(self) -> tuple:
        """The state between steps, by reference: a step replaces these arrays, it never writes into them."""
        source = self.source.snapshot() if self.source else None
        return self.master, dict(self.opt), self.loss_scale, self.good_steps, self.opt_step, source

    def restore(self, snap: tuple) -> None:
        master, opt, self.loss_scale, self.good_steps, self.opt_step, source = snap
        self.master, self.opt = master, dict(opt)
        if self.source:
            self.source.restore(source)
        self._refresh_stored()

    def state_dict(self) -> dict:
        d = {f"master_{k}": self._numpy(v) for k, v in self.master.items()}
        d.update({f"opt_{k}": self._numpy(v) for k, v in self.opt.items()})
        d["loss_scale"] = np.float64(self.loss_scale)
        d["good_steps"] = np.int64(self.good_steps)
        d["opt_step"] = np.int64(self.opt_step)
        if self.source:
            d.update({f"source_{k}": v for k, v in self.source.state_dict().items()})
        return d

    def load_state_dict(self, d: dict) -> None:
        p = self.policy
        # every value came from this policy's formats, so the casts back are exact
        self.master = {k[7:]: self._to(v, p.master) for k, v in d.items() if k.startswith("master_")}
        self.opt = {k[4:]: self._to(d[k], p.factor) for k in d if k.startswith("opt_") and k != "opt_step"}
        self.loss_scale = float(d["loss_scale"])
        self.good_steps = int(d["good_steps"])
        self.opt_step = int(d["opt_step"])
        if self.source:
            self.source.load_state_dict({k[7:]: v for k, v in d.items() if k.startswith("source_")})
        self._refresh_stored()

    # ---- the maps ----------------------------------------------------------------------------
    def embed_all(self) -> np.ndarray:
        """E = Z T^{-1} as this policy computes it: solves upcast to the factor dtype, result stored."""
        if self.backend == "numpy":
            return embedding_matrix(self.Z, self.L)
        p = self.policy
        L = self._to(self.L, p.factor)
        y = self.ops.solve_triangular(L, self._to(self.Z, p.factor).T, lower=True)
        E = self.ops.solve_triangular(L.T, y, lower=False).T
        return self._numpy(self._to(E, p.storage))

    # ---- one step ----------------------------------------------------------------------------
    def _gradient(self, G: np.ndarray):
        """G (times the loss scale) in the gradient format, and whether it fits without overflow."""
        p = self.policy
        scaled = G * self.loss_scale if p.loss_scaling else G
        # an entry overflows exactly when the largest magnitude rounds to infinity in that format
        peak = np.abs(scaled).max(initial=0.0)
        threshold = overflow_threshold(p.gradient)
        if threshold is None:
            fits = bool(np.isfinite(round_to(np.array([peak]), FORMATS[p.gradient])[0]))
        else:
            fits = bool(peak < threshold)
        return self._to(scaled, p.gradient), fits

    def gradients(self, names, seed: int, step: int, params, probe=None) -> dict:
        """This step's gradients from the named models, evaluated at the stored model (the attached
        source's, if named, added to the stateless models')."""
        if self.source is None or self.source.name not in names:
            return self.model_gradients(names, seed, step, params, probe)
        rest = [n for n in names if n != self.source.name]
        return self.source.add_gradients(self, self.model_gradients(rest, seed, step, params, probe), step)

    def model_gradients(self, names, seed: int, step: int, params, probe=None) -> dict:
        """The stateless models' gradients (zero for none), evaluated at the stored model."""
        Z, L = self.stored()
        GZ, GL = gradient(names, Z, L, seed, step, params, probe)
        return {"Z": GZ, "L": np.tril(GL)}

    def _admit(self, grads: dict) -> tuple[dict | None, list[dict]]:
        """Gradients in the factor dtype, unscaled; or None and the event when the step must be skipped."""
        p = self.policy
        if not all(np.isfinite(g).all() for g in grads.values()):
            return None, [{"event": "nonfinite_gradient", "action": "step skipped"}]
        cast = {k: self._gradient(g) for k, g in grads.items()}
        if not all(ok for _, ok in cast.values()):
            event = {"event": "gradient_overflow", "format": p.gradient, "loss_scale": self.loss_scale}
            if p.loss_scaling:
                self.loss_scale /= 2.0
                self.good_steps = 0
                event["action"] = "step skipped, loss scale halved"
            else:
                event["action"] = "step skipped"
            return None, [event]
        return {k: self._to(g, p.factor) / self.loss_scale for k, (g, _) in cast.items()}, []

    def _commit(self, master: dict) -> list[dict]:
        """Store the new master values unless any is non-finite; count the clean step for loss scaling."""
        if not all(self.ops.isfinite_all(v) for v in master.values()):
            return [{"event": "nonfinite_state", "action": "step skipped"}]
        self.master = {k: self._to(v, self.policy.master) for k, v in master.items()}
        self._refresh_stored()
        problem = self.degenerate()
        if problem:
            raise StateBreakdown(problem)  # the caller restores its snapshot
        if self.policy.loss_scaling:
            self.good_steps += 1
            if self.good_steps >= LOSS_SCALE_GROWTH_INTERVAL:
                self.loss_scale *= 2.0
                self.good_steps = 0
        return []

    def step(self, grads: dict, step_index: int) -> list[dict]:
        """Apply one step's gradients; returns the events it caused (an empty list on a clean step)."""
        p, s, ops = self.policy, self.settings, self.ops
        admitted, events = self._admit(grads)
        if admitted is None:
            return events
        gz, gl = admitted["Z"], admitted["L"]
        Z = self._to(self.master["Z"], p.factor)
        raw = self._to(self.master["raw"], p.factor)
        # gradient of the raw diagonal through softplus
        gl = ops.tril(gl, -1) + ops.diag(ops.diag(gl) * ops.sigmoid(ops.diag(raw)))
        direction_Z = self._optimizer_direction(tangent_projection(Z, gz, ops), "Z")
        direction_L = self._optimizer_direction(gl, "L")
        self.opt_step += 1
        xi = tangent_projection(Z, -s.lr * direction_Z, ops)
        if not ops.isfinite_all(xi):
            # a step that overflowed in the policy's matmuls: the retraction's QR/SVD must not see it
            return [{"event": "nonfinite_state", "action": "step skipped"}]
        try:
            Z_new = self.retract(Z, xi, ops)
        except RetractionError as exc:
            return [{"event": "retraction_failed", "message": str(exc), "action": "step skipped"}]
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
        return events + self._commit({"Z": Z_new, "raw": raw - s.lr * direction_L})

    def interface(self) -> dict:
        """The interface metrics of what this model computes with.

        When some metric is undefined (the computed embedding overflowed, say), the others are still
        measured; the undefined ones are NaN and the row's 'unmeasured' says why.
        """
        Z, L = self.stored()
        E = self.embed_all()
        u, factor_u = self.policy.u, FORMATS[self.policy.factor].u
        try:
            return interface_metrics(Z, L, E, u, factor_u)
        except PitcheckError:
            pass
        ids = sample_ids(Z.shape[0], 256)
        conditioning = measure_guarded([(CONDITIONING, lambda: cholesky_conditioning(L, factor_u))])
        cond_T = conditioning["cond_T"] if np.isfinite(conditioning["cond_T"]) else None
        return measure_guarded([
            (("orthonormality", "orthonormality_ratio"),
             lambda: {"orthonormality": orthonormality_loss(Z), "orthonormality_ratio": orthonormality_ratio(Z, u)}),
            (CONDITIONING, lambda: conditioning),
            (TRISOLVE, lambda: trisolve_errors(Z, L, E[ids], ids, u, cond_T)),
            (HEAD, lambda: head_metrics(E, Z @ (L @ L.T))),
        ], conditioning.get("unmeasured", []))

    def distance(self, other: "Engine") -> tuple[float, float]:
        """Relative distances of Z and of T from another engine's (the float64 shadow's)."""
        Z, L = self.stored()
        Zr, Lr = other.stored()
        Tr = Lr @ Lr.T
        return (float(np.linalg.norm(Z - Zr) / np.linalg.norm(Zr)),
                float(np.linalg.norm(L @ L.T - Tr) / np.linalg.norm(Tr)))

    def _optimizer_direction(self, g, which: str):
        opt, name = self.opt, self.settings.optimizer
        if name == "sgd":
            return g
        if name == "momentum":
            opt["m" + which] = MOMENTUM * opt["m" + which] + g
            return opt["m" + which]
        t = self.opt_step + 1
        opt["m" + which] = BETA1 * opt["m" + which] + (1 - BETA1) * g
        opt["v" + which] = BETA2 * opt["v" + which] + (1 - BETA2) * g * g
        m_hat = opt["m" + which] / (1 - BETA1**t)
        v_hat = opt["v" + which] / (1 - BETA2**t)
        return m_hat / (self.ops.sqrt(v_hat) + ADAM_EPS)

