"""A tied table in PIT's form, in one of several conversion modes, and its files.

E0 = P S Q^T (thin SVD, float64) = Z H: the polar decomposition, Z = P Q^T (orthonormal columns) and
H = Q S Q^T (SPD). PIT's embedding is E = Z T^{-1} and its head W = T Z^T, so W E = I whatever the SPD T:
no T keeps both E = E0 and W = E0^T unless H = I. Each mode is one choice of T = H^a (T = Q S^a Q^T,
L = chol T, cond(T) = cond(E0)^|a|):

    keep-embedding         a = -1   T = H^-1: E = E0,               W = H^-1 Z^T = pinv(E0)
    keep-head              a = +1   T = H:    E = Z H^-1 = pinv(E0)^T, W = H Z^T = E0^T
    balanced               a = 0    T = I:    E = Z,                W = Z^T
    sqrt                   a = 1/2  T = H^1/2: E = Z H^-1/2,        W = H^1/2 Z^T
    keep-embedding-scaled  a = -1   keep-embedding's Z and T plus one logit scale s outside PIT's
                                    formulation: logits s (h T) Z^T, so the head is s W and (s W) E = s I.

Never V x V: O(V D^2). The certificate of each mode is `certificate.py`'s.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ...infra.errors import PitcheckError
from ...infra.rundir import write_atomic
from ...numerics.reference import cholesky_factor, table_svd


@dataclass(frozen=True)
class Mode:
    power: float  # T = H^power
    keeps: str | None  # "embedding" (E = E0), "head" (W = E0^T) or None (neither: both distances measured)
    scaled: bool  # one logit scale s outside PIT: the head is s T Z^T
    algebra: str


MODES = {
    "keep-embedding": Mode(-1.0, "embedding", False, "T = H^-1: E = E0, W = pinv(E0) = Q S^-1 P^T"),
    "keep-head": Mode(1.0, "head", False, "T = H: W = E0^T = Q S P^T, E = Z H^-1 = P S^-1 Q^T"),
    "balanced": Mode(0.0, None, False, "T = I: E = Z = P Q^T, W = Z^T"),
    "keep-embedding-scaled": Mode(-1.0, "embedding", True,
                                  "T = H^-1 and a logit scale s: E = E0, head s pinv(E0), (s W) E = s I"),
    "sqrt": Mode(0.5, None, False, "T = H^1/2: E = Z H^-1/2 = P S^-1/2 Q^T, W = H^1/2 Z^T = Q S^1/2 P^T"),
}
DEFAULT_MODE = "keep-embedding"


def get_mode(name: str) -> Mode:
    if name not in MODES:
        raise PitcheckError(f"unknown conversion mode {name!r}; choose from {', '.join(MODES)}")
    return MODES[name]


@dataclass
class Conversion:
    Z: np.ndarray  # V x D, P Q^T
    L: np.ndarray  # D x D, chol(Q S^a Q^T) (the identity itself for a = 0)
    singular_values: np.ndarray  # S, descending
    svd_residual: float  # ||E0 - P S Q^T||_F / ||E0||_F as computed in float64
    p_orthonormality: float  # ||P^T P - I||_F
    q_orthonormality: float  # ||Q^T Q - I||_F
    mode: str = DEFAULT_MODE
    scale: float = 1.0  # the logit scale s (1 unless the mode is scaled)

    @property
    def cond(self) -> float:
        """cond(E0) = cond(H)."""
        return float(self.singular_values[0] / self.singular_values[-1])

    @property
    def cond_T(self) -> float:
        return self.cond ** abs(get_mode(self.mode).power)


def check_scale(mode: str, scale) -> float:
    """The logit scale a mode takes: a positive finite number for a scaled mode, 1 (or None) otherwise."""
    if not get_mode(mode).scaled:
        if scale not in (None, 1, 1.0):
            raise PitcheckError(f"mode {mode} has no logit scale (got {scale!r}); only keep-embedding-scaled has one")
        return 1.0
    if scale is None:
        raise PitcheckError(f"mode {mode} needs its logit scale s (fitted on held-out text, or given)")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not (0 < scale < math.inf):
        raise PitcheckError(f"the logit scale must be a positive finite number, got {scale!r}")
    return float(scale)


def convert_table(E0: np.ndarray, mode: str = DEFAULT_MODE, scale: float | None = None) -> Conversion:
    """Z and L of E0's PIT form in `mode` (float64), with the SVD's own residuals for the bounds."""
    spec = get_mode(mode)
    scale = check_scale(mode, scale)
    E0 = np.asarray(E0, dtype=np.float64)
    P, s, Qt = table_svd(E0, "the tied table")
    Q = Qt.T
    if spec.power == 0:
        L = np.eye(E0.shape[1])  # T = I exactly: E = Z to the last bit
    else:
        T = (Q * s**spec.power) @ Q.T
        L = cholesky_factor(0.5 * (T + T.T))  # symmetric to the last bit before the factorisation
    eye = np.eye(E0.shape[1])
    return Conversion(Z=P @ Qt, L=L, singular_values=s,
                      svd_residual=float(np.linalg.norm(E0 - (P * s) @ Qt) / np.linalg.norm(E0)),
                      p_orthonormality=float(np.linalg.norm(P.T @ P - eye)),
                      q_orthonormality=float(np.linalg.norm(Q.T @ Q - eye)), mode=mode, scale=scale)


def in_mode(conv: Conversion, mode: str, scale: float | None = None) -> Conversion:
    """`conv` in another mode of the same power (keep-embedding and keep-embedding-scaled), scale given:
    the same Z and L, so the same bits as convert_table(E0, mode, scale), without a second SVD of E0."""
    if get_mode(mode).power != get_mode(conv.mode).power:
        raise PitcheckError(f"mode {mode} takes T = H^{get_mode(mode).power:g}, not {conv.mode}'s "
                            f"H^{get_mode(conv.mode).power:g}: convert the table in {mode}")
    return replace(conv, mode=mode, scale=check_scale(mode, scale))


def converted_bytes(conv: Conversion, dtype: str = "float32") -> bytes:
    """Z and L (and, for a scaled mode, the 1-element "scale") as one safetensors file in float32 or float64."""
    try:
        from safetensors.numpy import save  # an optional extra (pitcheck[lm] / pitcheck[smollm2])
    except ImportError:
        raise PitcheckError("writing the converted table needs safetensors: pip install 'pitcheck[smollm2]'") from None
    if dtype not in ("float32", "float64"):
        raise PitcheckError(f"the converted table is written in float32 or float64, not {dtype!r}")
    tensors = {"Z": np.ascontiguousarray(conv.Z, dtype=dtype), "L": np.ascontiguousarray(conv.L, dtype=dtype)}
    if get_mode(conv.mode).scaled:
        tensors["scale"] = np.asarray([conv.scale], dtype=np.float64)
    return save(tensors, metadata={"format": "pitcheck-pit", "cond_E0": repr(conv.cond), "mode": conv.mode})


def write_conversion(out: Path | str, conv: Conversion, certificate: dict, dtype: str = "float32") -> dict:
    """OUT/converted.safetensors and OUT/certificate.json, each replaced atomically (a kill leaves the
    old file or the new one, whole)."""
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PitcheckError(f"cannot create {out}: {exc.strerror or exc}") from None
    paths = {"converted": out / "converted.safetensors", "certificate": out / "certificate.json"}
    write_atomic(paths["converted"], converted_bytes(conv, dtype))
    write_atomic(paths["certificate"], (json.dumps(certificate, indent=1) + "\n").encode())
    return {k: str(v) for k, v in paths.items()}


def read_converted(path: Path | str, with_scale: bool = False):
    """(Z, L) as float64 from a `pitcheck convert` safetensors file; with_scale: (Z, L, s), s = 1 for a file
    of an unscaled mode."""
    try:
        from safetensors.numpy import load_file
    except ImportError:
        raise PitcheckError("reading a converted table needs safetensors: pip install 'pitcheck[smollm2]'") from None
    if not Path(path).is_file():
        raise PitcheckError(f"cannot read converted table {path}: no such file")
    try:
        tensors = load_file(str(path))
    except Exception as exc:  # the library's own error types for a damaged header
        raise PitcheckError(f"cannot read converted table {path}: {exc}") from None
    if set(tensors) not in ({"Z", "L"}, {"Z", "L", "scale"}):
        raise PitcheckError(f"{path} is not a converted table: it holds {sorted(tensors)}, not Z and L")
    Z, L = (tensors[k].astype(np.float64) for k in ("Z", "L"))
    if Z.ndim != 2 or L.shape != (Z.shape[1], Z.shape[1]):
        raise PitcheckError(f"{path}: Z {Z.shape} and L {L.shape} do not fit (V x D and D x D)")
    if not with_scale:
        return Z, L
    scale = float(tensors["scale"].reshape(-1)[0]) if "scale" in tensors else 1.0
    return Z, L, scale
