"""The exact PIT form of a tied table, and its certificate.

E0 = P S Q^T (thin SVD, float64). Z = P Q^T (the polar factor: orthonormal columns) and T = Q S^{-1} Q^T
with L = chol(T), so that E = Z T^{-1} = P S Q^T = E0 and W = T Z^T = Q S^{-1} P^T = pinv(E0);
cond(T) = cond(E0). Never V x V: O(V D^2).

The certificate measures, for the reference module (pitcheck.nn.PIT) built from Z and L in each precision:
||E - E0||_F / ||E0||_F with E = Z T^{-1} as that module computes it (two triangular solves), the four
Penrose residuals and ||W E - I||_F of its maps, and ||Z^T Z - I||_F of Z as it is used, each also in units
of the precision's u. Each is held to a first-order worst-case bound (`error_bound`): in float64 it resolves
the question (pass/fail); in float32 and bfloat16 at D = 576 it exceeds 0.1 and the verdict is
"inconclusive": their figures are measured floors.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...infra.errors import PitcheckError
from ...numerics.formats import format_of_dtype
from ...numerics.metrics import head_metrics, orthonormality_loss
from ...numerics.reference import cholesky_factor, table_svd
from ...infra.rundir import write_atomic

CERTIFIED_DTYPES = ("float64", "float32", "bfloat16")
# what each dtype of the module stores Z and L in and solves in (nn.PIT: float32 masters under bfloat16)
STORAGE = {"float64": ("float64", "float64", "float64"), "float32": ("float32", "float32", "float32"),
           "bfloat16": ("bfloat16", "float32", "float32")}  # (Z as used, L, solves)


@dataclass
class Conversion:
    Z: np.ndarray  # V x D, P Q^T
    L: np.ndarray  # D x D, chol(Q S^{-1} Q^T)
    singular_values: np.ndarray  # S, descending
    svd_residual: float  # ||E0 - P S Q^T||_F / ||E0||_F as computed in float64
    p_orthonormality: float  # ||P^T P - I||_F
    q_orthonormality: float  # ||Q^T Q - I||_F

    @property
    def cond(self) -> float:
        return float(self.singular_values[0] / self.singular_values[-1])


def convert_table(E0: np.ndarray) -> Conversion:
    """Z and L of the exact PIT form of E0 (float64), with the SVD's own residuals for the bound."""
    E0 = np.asarray(E0, dtype=np.float64)
    P, s, Qt = table_svd(E0, "the tied table")
    Q = Qt.T
    T = (Q / s) @ Q.T
    L = cholesky_factor(0.5 * (T + T.T))  # symmetric to the last bit before the factorisation
    eye = np.eye(E0.shape[1])
    return Conversion(Z=P @ Qt, L=L, singular_values=s,
                      svd_residual=float(np.linalg.norm(E0 - (P * s) @ Qt) / np.linalg.norm(E0)),
                      p_orthonormality=float(np.linalg.norm(P.T @ P - eye)),
                      q_orthonormality=float(np.linalg.norm(Q.T @ Q - eye)))


def _gamma(n: int, u: float) -> float:
    return n * u / (1.0 - n * u)


def error_bound(conv: Conversion, dtype: str) -> float:
    """First-order worst-case bound on ||E - E0||_F / ||E0||_F for the module in `dtype`.

    Relative 2-norm perturbations, each a standard backward-error result (Higham, ASNA 2nd ed.):
      the SVD (a posteriori: its measured residual and the loss of orthonormality of P and Q, each
      evaluated with an error below D u64);
      forming Z = P Q^T and T = Q S^{-1} Q^T: |dX| <= gamma_D |P||Q^T|, normwise D gamma_D;
      Cholesky: |dT| <= gamma_{D+1} |L||L^T|, normwise D gamma_{D+1} ||T||;
      rounding Z to its storage format: ||dZ||_2 <= sqrt(D) u_Z, and L: sqrt(D) u_L relative;
      two triangular solves: |dL| <= gamma_D |L| each, normwise sqrt(D) gamma_D.
    Perturbations of T and L reach E = Z T^{-1} amplified by cond(T) = cond(E0); those of Z are not.
    A V x D relative error in the 2-norm is at most sqrt(D) times larger in the Frobenius norm.
    """
    u64 = format_of_dtype("float64").u
    z_fmt, l_fmt, solve_fmt = STORAGE[dtype]
    u_z, u_l, u_s = (format_of_dtype(name).u for name in (z_fmt, l_fmt, solve_fmt))
    D, cond = conv.L.shape[0], conv.cond
    evaluation = D * u64  # error of evaluating each measured residual in float64
    unamplified = (conv.svd_residual + conv.p_orthonormality + 2 * evaluation + D * _gamma(D, u64)
                   + math.sqrt(D) * u_z)
    amplified = (2 * (conv.q_orthonormality + evaluation) + D * _gamma(D, u64) + D * _gamma(D + 1, u64)
                 + 2 * math.sqrt(D) * u_l + 2 * math.sqrt(D) * _gamma(D, u_s))
    return math.sqrt(D) * (unamplified + cond * amplified)


# above this a bound cannot resolve the question (the project's rule): the figure is a measured floor
RESOLVABLE = 0.1


def verdict(measured: float, bound: float) -> str:
    if bound > RESOLVABLE:
        return "inconclusive"
    return "pass" if measured <= bound else "fail"


def measure(E0: np.ndarray, conv: Conversion, dtype: str) -> dict:
    """The certificate's figures for nn.PIT built from the conversion in `dtype` (torch name)."""
    import torch  # deferred: seconds to import; the module under test is torch's

    from ...model.nn import memory_as_used
    from .pit_module import pit_from

    torch_dtype = getattr(torch, dtype)
    module = pit_from(conv.Z, conv.L, dtype=torch_dtype)
    with torch.no_grad():
        E = module.embed(torch.arange(E0.shape[0])).to(torch.float64).numpy()
        Z_used = memory_as_used(module.Z, module.dtype, module.compute_dtype).to(torch.float64).numpy()
        L = module.L.to(torch.float64).numpy()
    del module
    B = Z_used @ (L @ L.T)  # W^T = Z T: the head's map with the values it holds
    u = format_of_dtype(dtype).u
    rel = float(np.linalg.norm(E - E0) / np.linalg.norm(E0))
    heads = head_metrics(E, B)
    bound = error_bound(conv, dtype)
    out = {"u": u, "storage": dict(zip(("Z", "L", "solves"), STORAGE[dtype])),
           "relative_error": rel, "relative_error_u": rel / u, "bound": bound, "bound_u": bound / u,
           "verdict": verdict(rel, bound),
           "orthonormality": orthonormality_loss(Z_used), "orthonormality_u": orthonormality_loss(Z_used) / u}
    for key in ("pinv_drift", "penrose_1", "penrose_2", "penrose_3", "penrose_4", "pinv_error"):
        out[key], out[key + "_u"] = heads[key], heads[key] / u
    return out


def certify(E0: np.ndarray, conv: Conversion, dtypes=CERTIFIED_DTYPES, source: str = "", progress=None) -> dict:
    """The conversion certificate: the table's spectrum, the SVD's residuals and `measure` per dtype."""
    unknown = [d for d in dtypes if d not in STORAGE]
    if unknown:
        raise PitcheckError(f"no certificate for dtype {unknown[0]!r}; choose from {', '.join(STORAGE)}")
    s = conv.singular_values
    cert = {"source": source, "vocab": int(E0.shape[0]), "dim": int(E0.shape[1]),
            "singular_values": {"max": float(s[0]), "min": float(s[-1])}, "cond_E0": conv.cond,
            "svd": {"residual": conv.svd_residual, "p_orthonormality": conv.p_orthonormality,
                    "q_orthonormality": conv.q_orthonormality},
            "precisions": {}}
    for dtype in dtypes:
        if progress is not None:
            progress(dtype)
        cert["precisions"][dtype] = measure(E0, conv, dtype)
    return cert


def converted_bytes(conv: Conversion, dtype: str = "float32") -> bytes:
    """Z and L as one safetensors file (tensors "Z" and "L") in float32 or float64."""
    try:
        from safetensors.numpy import save  # an optional extra (pitcheck[lm] / pitcheck[smollm2])
    except ImportError:
        raise PitcheckError("writing the converted table needs safetensors: pip install 'pitcheck[smollm2]'") from None
    if dtype not in ("float32", "float64"):
        raise PitcheckError(f"the converted table is written in float32 or float64, not {dtype!r}")
    return save({"Z": np.ascontiguousarray(conv.Z, dtype=dtype), "L": np.ascontiguousarray(conv.L, dtype=dtype)},
                metadata={"format": "pitcheck-pit", "cond_E0": repr(conv.cond)})


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


def read_converted(path: Path | str) -> tuple[np.ndarray, np.ndarray]:
    """(Z, L) as float64 from a `pitcheck convert` safetensors file."""
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
    if set(tensors) != {"Z", "L"}:
        raise PitcheckError(f"{path} is not a converted table: it holds {sorted(tensors)}, not Z and L")
    Z, L = (tensors[k].astype(np.float64) for k in ("Z", "L"))
    if Z.ndim != 2 or L.shape != (Z.shape[1], Z.shape[1]):
        raise PitcheckError(f"{path}: Z {Z.shape} and L {L.shape} do not fit (V x D and D x D)")
    return Z, L
