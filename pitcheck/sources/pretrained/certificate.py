"""The certificate of a conversion (any mode): what the reference module built from it computes, against E0.

For the reference module (pitcheck.nn.PIT) built from the conversion's Z and L in each precision, with E its
embedding as that module computes it (two triangular solves), W = s T Z^T its head with the values it holds
(s = 1 unless the mode is scaled) and u the precision's unit roundoff, three relative Frobenius-norm figures:

    embedding  ||E - E0||_F / ||E0||_F
    head       ||W - E0^T||_F / ||E0||_F
    inverse    ||W E - s I||_F / s           (= ||T Z^T E - I||_F: the tie, up to the scalar s)

each also in units of u. A figure the mode aims at (keep-embedding: the embedding; keep-head: the head; every
mode: the inverse) is held to a first-order worst-case bound and judged: pass or fail where the bound is at
most RESOLVABLE = 0.1, "inconclusive" above it (its figure is then a measured floor). A figure the mode does
not aim at is a measured distance, verdict "measured". Beside them: the four Penrose residuals of the PIT
pair (E, T Z^T), ||Z^T Z - I||_F of Z as used, and cond(T) of the L the module holds.
"""
from __future__ import annotations

import math

import numpy as np

from ...infra.errors import PitcheckError
from ...numerics.formats import format_of_dtype
from ...numerics.metrics import head_metrics, orthonormality_loss
from .conversion import Conversion, get_mode

CERTIFIED_DTYPES = ("float64", "float32", "bfloat16")
# what each dtype of the module stores Z and L in and solves in (nn.PIT: float32 masters under bfloat16)
STORAGE = {"float64": ("float64", "float64", "float64"), "float32": ("float32", "float32", "float32"),
           "bfloat16": ("bfloat16", "float32", "float32")}  # (Z as used, L, solves)
NORMS = {"embedding": "||E - E0||_F / ||E0||_F", "head": "||W - E0^T||_F / ||E0||_F (W = s T Z^T)",
         "inverse": "||W E - s I||_F / s"}
# above this a bound cannot resolve the question (the project's rule): the figure is a measured floor
RESOLVABLE = 0.1


def _gamma(n: int, u: float) -> float:
    return n * u / (1.0 - n * u)


def _units(dtype: str) -> tuple[float, float, float, float]:
    """(u of float64, of Z as used, of L, of the solves) for the module in `dtype`."""
    if dtype not in STORAGE:
        raise PitcheckError(f"no certificate for dtype {dtype!r}; choose from {', '.join(STORAGE)}")
    return (format_of_dtype("float64").u, *(format_of_dtype(name).u for name in STORAGE[dtype]))


def _output_u(dtype: str) -> float:
    """u of rounding the solved rows to the module's dtype where it is coarser than the solves' (else 0)."""
    return format_of_dtype(dtype).u if STORAGE[dtype][2] != dtype else 0.0


def _parts(conv: Conversion, dtype: str) -> tuple[float, float, float]:
    """(the error of Z, the error of T without the solves, the solves' error): relative 2-norm, first order."""
    u64, u_z, u_l, u_s = _units(dtype)
    D = conv.L.shape[0]
    evaluation = D * u64  # error of evaluating each measured residual in float64
    of_z = (conv.svd_residual + conv.p_orthonormality + 2 * evaluation + D * _gamma(D, u64) + math.sqrt(D) * u_z
            + _output_u(dtype))
    of_t = (2 * (conv.q_orthonormality + evaluation) + D * _gamma(D, u64) + D * _gamma(D + 1, u64)
            + 2 * math.sqrt(D) * u_l)
    return of_z, of_t, 2 * math.sqrt(D) * _gamma(D, u_s)


def error_bound(conv: Conversion, dtype: str) -> float:
    """First-order worst-case bound on ||E - E0||_F / ||E0||_F for a mode that keeps the embedding (T = H^-1).

    Relative 2-norm perturbations, each a standard backward-error result (Higham, ASNA 2nd ed.):
      the SVD (a posteriori: its measured residual and the loss of orthonormality of P and Q, each
      evaluated with an error below D u64);
      forming Z = P Q^T and T = Q S^{-1} Q^T: |dX| <= gamma_D |P||Q^T|, normwise D gamma_D;
      Cholesky: |dT| <= gamma_{D+1} |L||L^T|, normwise D gamma_{D+1} ||T||;
      rounding Z to its storage format: ||dZ||_2 <= sqrt(D) u_Z, and L: sqrt(D) u_L relative;
      two triangular solves: |dL| <= gamma_D |L| each, normwise sqrt(D) gamma_D;
      rounding the solved rows to a module dtype coarser than the solves' (bfloat16): u of that dtype.
    Perturbations of T and L reach E = Z T^{-1} amplified by cond(T) = cond(E0); those of Z are not.
    A V x D relative error in the 2-norm is at most sqrt(D) times larger in the Frobenius norm.
    """
    of_z, of_t, solves = _parts(conv, dtype)
    return math.sqrt(conv.L.shape[0]) * (of_z + conv.cond_T * (of_t + solves))


def head_bound(conv: Conversion, dtype: str) -> float:
    """First-order worst-case bound on ||W - E0^T||_F / ||E0||_F for a mode that keeps the head (T = H).

    W = T Z^T involves no solve, so nothing is amplified by cond(T): the SVD's residuals, forming Z and T,
    Cholesky, rounding Z and L to storage (as in `error_bound`), and the float64 products L L^T and Z T that
    form W from the values the module holds (D gamma_D each); sqrt(D) from the 2-norm to Frobenius."""
    u64 = _units(dtype)[0]
    D = conv.L.shape[0]
    of_z, of_t, _ = _parts(conv, dtype)
    return math.sqrt(D) * (of_z + of_t + 2 * D * _gamma(D, u64))


def inverse_bound(vocab: int, dim: int, cond_t: float, orthonormality: float, dtype: str) -> float:
    """First-order worst-case bound on ||W E - s I||_F / s = ||T Z^T E - I||_F, from the measured state.

    With exact solves T Z^T Z T^{-1} - I = T (Z^T Z - I) T^{-1}: at most cond(T) ||Z^T Z - I||_F (measured
    on Z as used, evaluated in float64 with error below gamma_V). Each row's two solves are backward stable,
    (T + dT_v) e_v = z_v with ||dT_v||_2 <= 2 sqrt(D) gamma_D ||T||_2 (a different dT_v per row), which
    reaches T Z^T E as at most cond(T)^2 2 D gamma_D in the Frobenius norm; forming E^T (Z T) in float64
    adds D gamma_V cond(T), and rounding the solved rows to a coarser module dtype cond(T) sqrt(D) u of
    that dtype. cond(T) is that of the L the module holds."""
    u64, _, _, u_s = _units(dtype)
    return (cond_t * (orthonormality + 2 * dim * _gamma(vocab, u64) + math.sqrt(dim) * _output_u(dtype))
            + cond_t**2 * 2 * dim * _gamma(dim, u_s))


def verdict(measured: float, bound: float) -> str:
    if bound > RESOLVABLE:
        return "inconclusive"
    return "pass" if measured <= bound else "fail"


def _figure(value: float, u: float, bound: float | None) -> dict:
    out = {"error": value, "error_u": value / u}
    if bound is None:
        out["verdict"] = "measured"
    else:
        out.update(bound=bound, bound_u=bound / u, verdict=verdict(value, bound))
    return out


def _worst(verdicts) -> str:
    for v in ("fail", "inconclusive", "pass"):
        if v in verdicts:
            return v
    return "measured"


def judge_arrays(E0: np.ndarray, conv: Conversion, E: np.ndarray, Z_used: np.ndarray, L: np.ndarray,
                 dtype: str, penrose: bool = True) -> dict:
    """The certificate's figures for one precision from the arrays a module computes and holds (float64
    copies): E (V x D, its embedding), Z as used and L (its factor); penrose=False leaves out the Penrose
    residuals and pinv error (a QR of the V x D E: the costly part at full size)."""
    mode = get_mode(conv.mode)
    u = format_of_dtype(dtype).u
    B = Z_used @ (L @ L.T)  # (T Z^T)^T: the head's map with the values it holds, before the scale
    s = conv.scale
    norm0 = np.linalg.norm(E0)
    emb = float(np.linalg.norm(E - E0) / norm0)
    head = float(np.linalg.norm(s * B - E0) / norm0)
    M = E.T @ B  # (T Z^T E)^T, D x D: W E = s M^T
    eye = np.eye(E0.shape[1])
    inverse = float(np.linalg.norm(s * M - s * eye) / s)
    orth = orthonormality_loss(Z_used)
    sv = np.linalg.svd(L, compute_uv=False)
    cond_t = float((sv[0] / sv[-1]) ** 2)
    out = {"u": u, "storage": dict(zip(("Z", "L", "solves"), STORAGE[dtype])), "scale": s, "cond_T": cond_t,
           "embedding": _figure(emb, u, error_bound(conv, dtype) if mode.keeps == "embedding" else None),
           "head": _figure(head, u, head_bound(conv, dtype) if mode.keeps == "head" else None),
           "inverse": _figure(inverse, u, inverse_bound(*E0.shape, cond_t, orth, dtype))}
    out["verdict"] = _worst([out[k]["verdict"] for k in ("embedding", "head", "inverse")])
    # the flat figures of the embedding (its bound where the mode keeps it), as the first certificates had them
    out["relative_error"], out["relative_error_u"] = emb, emb / u
    if mode.keeps == "embedding":
        out["bound"], out["bound_u"] = out["embedding"]["bound"], out["embedding"]["bound_u"]
    out["orthonormality"], out["orthonormality_u"] = orth, orth / u
    heads = head_metrics(E, B) if penrose else {"pinv_drift": float(np.linalg.norm(M - eye))}
    for key in ("pinv_drift", "penrose_1", "penrose_2", "penrose_3", "penrose_4", "pinv_error"):
        if key in heads:
            out[key], out[key + "_u"] = heads[key], heads[key] / u
    return out


def measure(E0: np.ndarray, conv: Conversion, dtype: str, penrose: bool = True) -> dict:
    """The certificate's figures for nn.PIT built from the conversion in `dtype` (torch name)."""
    _units(dtype)
    import torch  # deferred: seconds to import; the module under test is torch's

    from ...model.nn import memory_as_used
    from .pit_module import pit_from

    module = pit_from(conv.Z, conv.L, dtype=getattr(torch, dtype))
    with torch.no_grad():
        E = module.embed(torch.arange(E0.shape[0])).to(torch.float64).numpy()
        Z_used = memory_as_used(module.Z, module.dtype, module.compute_dtype).to(torch.float64).numpy()
        L = module.L.to(torch.float64).numpy()
    del module
    return judge_arrays(E0, conv, E, Z_used, L, dtype, penrose)


def _header(E0: np.ndarray, conv: Conversion, source: str) -> dict:
    s = conv.singular_values
    return {"source": source, "mode": conv.mode, "algebra": get_mode(conv.mode).algebra,
            "vocab": int(E0.shape[0]), "dim": int(E0.shape[1]),
            "singular_values": {"max": float(s[0]), "min": float(s[-1])}, "cond_E0": conv.cond,
            "cond_T": conv.cond_T, "scale": conv.scale, "norms": dict(NORMS),
            "svd": {"residual": conv.svd_residual, "p_orthonormality": conv.p_orthonormality,
                    "q_orthonormality": conv.q_orthonormality}}


def certify(E0: np.ndarray, conv: Conversion, dtypes=CERTIFIED_DTYPES, source: str = "", progress=None,
            penrose: bool = True) -> dict:
    """The conversion certificate: the table's spectrum, the SVD's residuals, the mode and `measure` per dtype."""
    for d in dtypes:
        _units(d)
    cert = {**_header(E0, conv, source), "precisions": {}}
    for dtype in dtypes:
        if progress is not None:
            progress(dtype)
        cert["precisions"][dtype] = measure(E0, conv, dtype, penrose)
    return cert


def certify_start(E0: np.ndarray, conv: Conversion, Z0: np.ndarray, L0: np.ndarray, source: str = "") -> dict:
    """The certificate of a run's start (Z0, L0), in float64 numpy (no torch; no Penrose residuals): judged
    as the conversion `conv` in its mode, so a start that is not that conversion fails where the mode keeps
    E or W."""
    from ...numerics.reference import embedding_matrix

    Z0, L0 = np.asarray(Z0, dtype=np.float64), np.asarray(L0, dtype=np.float64)
    if Z0.shape != E0.shape or L0.shape != conv.L.shape:
        raise PitcheckError(f"the start's Z {Z0.shape} and L {L0.shape} do not fit the teacher {E0.shape}")
    figures = judge_arrays(E0, conv, embedding_matrix(Z0, L0), Z0, L0, "float64", penrose=False)
    return {**_header(E0, conv, source), "precisions": {"float64": figures}, "verdict": figures["verdict"],
            "start_is_conversion": bool(np.array_equal(Z0, conv.Z) and np.array_equal(L0, conv.L))}
