"""Interface metrics: raw values and, where a standard exists, LAPACK-style ratios in units of u = 2^-p.

All metrics take float64 copies of what a model actually computes with, and all cost O(V D^2):
nothing here forms a V x V matrix. Those O(V D^2) products go through a `work` (HostWork: numpy on the
host); pitcheck.numerics.device_metrics gives them a torch form on a model's device, and every D x D step
stays here. The interface is written with E (V x D, the embedding rows) and
B = W^T (V x D, the head), so the same functions judge PIT, standard tying (B = E) and untied heads.

Every public function checks its input first and raises PitcheckError with the reason when a metric is
undefined for it: arrays must be real, finite, 2-D and non-empty (numpy arrays, or torch tensors of any
real dtype, bf16 included), L lower triangular with a positive diagonal, u in (0, 1). A value that is not
finite in float64 (an overflow) is an error too, never a silent inf or NaN. Non-finite input is refused
before any factorisation: LAPACK's SVD on NaN or inf can loop for ever.
"""
from __future__ import annotations

import math

import numpy as np

from ..infra.errors import PitcheckError

# Extended precision for residuals and reference solves: x86 long double carries p = 64 bits.
EXTENDED = np.longdouble
EXTENDED_BITS = np.finfo(np.longdouble).nmant + 1


# ---- where the V x D work runs ------------------------------------------------------------------------
class HostWork:
    """The O(V D^2) products of the metrics in numpy float64 on the host. Every other step of a metric works
    on D x D matrices and scalars, on the host, whatever the tall arrays' home: TorchWork
    (pitcheck.numerics.device_metrics) does these products where a run's tensors live."""

    @staticmethod
    def gram(X, Y=None) -> np.ndarray:
        """X^T Y (X^T X without Y) as a D x D float64 numpy array."""
        with np.errstate(over="ignore", invalid="ignore"):
            return X.T @ (X if Y is None else Y)

    @staticmethod
    def times(X, A: np.ndarray):
        """X A, X tall where it lives and A a small numpy matrix: the result lives with X."""
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            return X @ A

    @staticmethod
    def minus(X, Y):
        with np.errstate(over="ignore", invalid="ignore"):
            return X - Y

    @staticmethod
    def norm(X) -> np.float64:
        """||X||_F as numpy's float64 (a Python float's ** would raise on overflow where numpy gives inf)."""
        with np.errstate(over="ignore", invalid="ignore"):
            return np.linalg.norm(X)

    @staticmethod
    def finite(X) -> bool:
        return bool(np.isfinite(X).all())

    @staticmethod
    def householder(X) -> tuple:
        """Thin Householder Q R of X: Q where X lives, R a numpy array."""
        return np.linalg.qr(X)

    @staticmethod
    def rows(X, ids: np.ndarray) -> np.ndarray:
        return X[ids]

    @staticmethod
    def host(X) -> np.ndarray:
        return X

    @staticmethod
    def yardstick(Z_rows, L: np.ndarray, E_rows, u: float) -> tuple:
        """The sampled rows' reference solves and residuals, and their bits (metrics.extended_yardstick)."""
        return extended_yardstick(Z_rows, L, E_rows)


HOST = HostWork()


# ---- input checks ---------------------------------------------------------------------------------
def _is_torch(x) -> bool:
    return type(x).__module__.split(".")[0] == "torch" and hasattr(x, "detach")


def as_matrix(x, name: str) -> np.ndarray:
    """x as a finite, real, non-empty float64 matrix (a copy only where a conversion needs one)."""
    if _is_torch(x):
        import torch

        if x.is_complex() or x.dtype == torch.bool:
            raise PitcheckError(f"{name} must be a real array, got a {x.dtype} tensor")
        x = x.detach().to(device="cpu", dtype=torch.float64).numpy()
    try:
        a = np.asarray(x)
    except (TypeError, ValueError) as exc:
        raise PitcheckError(f"{name} is not an array ({exc})") from None
    if a.dtype.kind == "c":
        raise PitcheckError(f"{name} must be real, got dtype {a.dtype}")
    # ml_dtypes' bfloat16 and float8 are numpy void-kind types with a float's name
    if a.dtype.kind not in "fiu" and not (a.dtype.kind == "V" and "float" in a.dtype.name):
        raise PitcheckError(f"{name} must be a real numeric array, got dtype {a.dtype}")
    if a.ndim != 2 or a.size == 0:
        raise PitcheckError(f"{name} must be a non-empty 2-D matrix, got shape {a.shape}")
    a = a.astype(np.float64, copy=False)
    if not np.isfinite(a).all():
        raise PitcheckError(f"{name} has non-finite entries (NaN or inf): its metrics are undefined")
    return a


def as_factor(L, name: str = "L", strict: bool = True) -> np.ndarray:
    """L as a square lower-triangular float64 matrix with a positive diagonal (>= 0 unless strict)."""
    L = as_matrix(L, name)
    if L.shape[0] != L.shape[1]:
        raise PitcheckError(f"{name} must be square, got shape {L.shape}")
    if np.triu(L, 1).any():
        raise PitcheckError(f"{name} must be lower triangular (the Cholesky factor of T = L L^T)")
    low = float(np.min(np.diag(L)))
    if low < 0 or (strict and low == 0):
        raise PitcheckError(f"{name} must have a positive diagonal (T = L L^T SPD), its smallest entry is {low:g}")
    return L


def unit_roundoff(u, name: str = "u") -> float:
    try:
        value = float(u)
    except (TypeError, ValueError):
        raise PitcheckError(f"{name} must be a number in (0, 1), got {u!r}") from None
    if not (0 < value < 1):  # also refuses NaN
        raise PitcheckError(f"{name} is a unit roundoff and must lie in (0, 1), got {u!r}")
    return value


def _same_shape(a: np.ndarray, b: np.ndarray, names: str) -> None:
    if a.shape != b.shape:
        raise PitcheckError(f"shape mismatch: {names} are {a.shape} and {b.shape}")


def _finite(values: dict, what: str) -> dict:
    bad = [k for k, v in values.items() if isinstance(v, float) and not np.isfinite(v)]
    if bad:
        raise PitcheckError(f"{', '.join(bad)} not finite in float64 for this input ({what})")
    return values


UNDEFINED_RATIO = "a relative residual's reference is zero (or underflows): the residual is undefined"


def _ratio(num, den) -> float:
    """num / den for a relative residual; 0/0 is an exactly satisfied condition, x/0 is undefined (inf/inf,
    from an overflowed state: NaN, which the row reports as unmeasured, without numpy's warning)."""
    if den > 0:
        with np.errstate(invalid="ignore"):
            return num / den
    if num == 0:
        return 0.0
    raise PitcheckError(UNDEFINED_RATIO)


def _ratios(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """_ratio elementwise, in one pass (a record's 256 sampled rows took ~1 ms one by one)."""
    positive = den > 0
    if not (positive | (num == 0)).all():
        raise PitcheckError(UNDEFINED_RATIO)
    with np.errstate(invalid="ignore"):
        return np.where(positive, num / np.where(positive, den, 1.0), 0.0)


def _gram_deviation(Z, work=HOST) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        return work.gram(Z) - np.eye(Z.shape[1])


def _orthonormality(deviation: np.ndarray) -> float:
    with np.errstate(over="ignore", invalid="ignore"):
        loss = float(np.linalg.norm(deviation))
    return _finite({"orthonormality": loss}, "entries too large")["orthonormality"]


def _orthonormality_ratio(deviation: np.ndarray, vocab: int, u: float) -> float:
    with np.errstate(over="ignore", invalid="ignore"):
        ratio = float(np.linalg.norm(deviation, 1) / (vocab * u))
    return _finite({"orthonormality_ratio": ratio}, "entries too large")["orthonormality_ratio"]


def orthonormality_loss(Z: np.ndarray) -> float:
    """||Z^T Z - I||_F."""
    Z = as_matrix(Z, "Z")
    return _orthonormality(_gram_deviation(Z))


def orthonormality_ratio(Z: np.ndarray, u: float) -> float:
    """LAPACK dqrt01's ratio ||I - Z^T Z||_1 / (V u); about 1 for Householder QR, pass below 30."""
    Z, u = as_matrix(Z, "Z"), unit_roundoff(u)
    return _orthonormality_ratio(_gram_deviation(Z), Z.shape[0], u)


def checked_orthonormality(Z, u: float, work=HOST) -> dict:
    """orthonormality_loss and orthonormality_ratio of a finite Z, from one Gram where `work` computes."""
    deviation = _gram_deviation(Z, work)
    return {"orthonormality": _orthonormality(deviation),
            "orthonormality_ratio": _orthonormality_ratio(deviation, Z.shape[0], u)}


def cholesky_conditioning(L: np.ndarray, u: float) -> dict:
    """cond_2(L), cond_2(T) = cond_2(L)^2, min diag(L), and the breakdown margin 20 n^{3/2} cond(T) u.

    Cholesky of T in a precision with unit roundoff u is guaranteed to complete while the margin is
    below 1 (Higham, Accuracy and Stability, Thm 10.7); above it, breakdown is possible.
    """
    L, u = as_factor(L), unit_roundoff(u)
    s = _singular_values(L, "L")
    cond_L = float(s[0] / s[-1]) if s[-1] > 0 else float("inf")
    n = L.shape[0]
    with np.errstate(over="ignore"):
        cond_T = float(np.float64(cond_L) ** 2)  # a Python float would raise OverflowError instead of inf
    return _finite({
        "cond_L": cond_L,
        "cond_T": cond_T,
        "min_diag_L": float(np.min(np.diag(L))),
        "breakdown_margin": float(20.0 * n**1.5 * np.float64(cond_T) * u),
    }, "L is singular to float64")


def _singular_values(A: np.ndarray, name: str) -> np.ndarray:
    try:
        return np.linalg.svd(A, compute_uv=False)
    except np.linalg.LinAlgError as exc:
        raise PitcheckError(f"the SVD of {name} failed ({exc})") from None


def drift_bound(Z: np.ndarray, L: np.ndarray, u: float) -> float:
    """cond(T) (||Z^T Z - I||_F + u): the first-order bound on ||W E - I||_F (inf if T is singular)."""
    L, u = as_factor(L, strict=False), unit_roundoff(u)
    s = _singular_values(L, "L")
    bound = (s[0] / s[-1]) ** 2 * (orthonormality_loss(Z) + u) if s[-1] > 0 else np.inf
    return float(bound) if np.isfinite(bound) else float("inf")


def _solve_lower_extended(L: np.ndarray, rhs: np.ndarray, transpose: bool) -> np.ndarray:
    """Substitution for L x = rhs (or L^T x = rhs) in extended precision; rhs is D x B."""
    Lx = L.astype(EXTENDED)
    A = Lx.T if transpose else Lx
    n = A.shape[0]
    x = np.zeros(rhs.shape, dtype=EXTENDED)
    b = rhs.astype(EXTENDED)
    order = range(n - 1, -1, -1) if transpose else range(n)
    for i in order:
        # only the solved entries: the rest of row i is the triangle's zeros times x's zeros, which the
        # sum would add at its ends (same values; long double products are not BLAS, so this halves the cost)
        done = slice(i + 1, n) if transpose else slice(0, i)
        x[i] = (b[i] - A[i, done] @ x[done]) / A[i, i]
    return x


def reference_embedding(Z: np.ndarray, L: np.ndarray, ids) -> np.ndarray:
    """T^{-1} z_v for the given rows in extended precision (the yardstick for the forward error)."""
    return _reference_rows(np.asarray(Z, dtype=np.float64)[ids], L)


def _reference_rows(Z_rows: np.ndarray, L: np.ndarray) -> np.ndarray:
    y = _solve_lower_extended(L, Z_rows.T, transpose=False)
    return _solve_lower_extended(L, y, transpose=True).T


def trisolve_errors(Z, L, E_rows, ids, u: float, cond_T: float | None = None) -> dict:
    """Forward and backward error of computed embedding rows E_rows = T^{-1} Z[ids].

    forward: max_v ||e_v - e*_v|| / ||e*_v|| against an extended-precision solve of the same Z, L;
      its ratio divides by cond(T) u (a solve's forward error is about cond * u).
    backward: max_v ||z_v - L L^T e_v||_1 / (||L||_1 ||L^T||_1 ||e_v||_1), residual in extended
      precision; its ratio divides by u (dtrt02's normalisation; a backward-stable pair of solves
      gives about 1, LAPACK passes below 30).
    """
    Z, L, E_rows, u = as_matrix(Z, "Z"), as_factor(L), as_matrix(E_rows, "E_rows"), unit_roundoff(u)
    if L.shape[0] != Z.shape[1]:
        raise PitcheckError(f"shape mismatch: Z {Z.shape} and L {L.shape}")
    ids = _row_ids(ids, Z.shape[0])
    _same_shape(E_rows, Z[ids], "E_rows and Z[ids]")
    if cond_T is None:
        cond_T = cholesky_conditioning(L, u)["cond_T"]
    elif not (np.isfinite(cond_T) and cond_T >= 1):
        raise PitcheckError(f"cond_T must be a finite condition number >= 1, got {cond_T!r}")
    return _trisolve(Z[ids], L, E_rows, u, cond_T)


def extended_yardstick(Z_rows: np.ndarray, L: np.ndarray, E_rows: np.ndarray) -> tuple:
    """The trisolve metrics' yardstick in extended precision on the host: the reference rows T^{-1} z_v, the
    residuals z_v - L L^T e_v, and the bits they carry."""
    Lx = L.astype(EXTENDED)
    resid = Z_rows.astype(EXTENDED) - (E_rows.astype(EXTENDED) @ Lx) @ Lx.T
    return _reference_rows(Z_rows, L), resid, EXTENDED_BITS


def _trisolve(Z_rows, L: np.ndarray, E_rows, u: float, cond_T: float, work=HOST) -> dict:
    """trisolve_errors from the sampled rows of Z and E (checked) alone, rows where `work` computes: its
    yardstick gives the reference rows and the residuals, this the norms and ratios on the host."""
    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        exact, resid, bits = work.yardstick(Z_rows, L, E_rows, u)
        E_rows = work.host(E_rows)
        fwd_num = np.linalg.norm((E_rows - exact).astype(np.float64), axis=1)
        fwd_den = np.linalg.norm(exact.astype(np.float64), axis=1)
        denom = np.linalg.norm(L, 1) * np.linalg.norm(L.T, 1) * np.abs(E_rows).sum(axis=1)
        bwd_num = np.abs(resid.astype(np.float64)).sum(axis=1)
    fwd, bwd = _ratios(fwd_num, fwd_den), _ratios(bwd_num, denom)
    forward, backward = float(fwd.max()), float(bwd.max())
    _finite({"trisolve_forward": forward, "trisolve_backward": backward}, "entries too large or too small")
    return _finite({
        "trisolve_forward": forward,
        "trisolve_forward_ratio": forward / (cond_T * u),
        "trisolve_backward": backward,
        "trisolve_backward_ratio": backward / u,
        # resolved only while the forward-error bound cond(T) u stays small, and while the yardstick is
        # finer than u (long double is no wider than float64 on some platforms, e.g. ARM macOS)
        "trisolve_resolved": bool(cond_T * u <= 0.1 and 2.0**-bits <= u / 16),
    }, "entries too large or too small")


def _row_ids(ids, vocab: int) -> np.ndarray:
    ids = np.asarray(ids)
    if ids.dtype.kind not in "iu" or ids.ndim != 1 or ids.size == 0:
        raise PitcheckError(f"ids must be a non-empty 1-D array of row indices, got {ids.dtype} {ids.shape}")
    if ids.min() < 0 or ids.max() >= vocab:
        raise PitcheckError(f"ids out of range [0, {vocab}): min {ids.min()}, max {ids.max()}")
    return ids


def pinv_drift(E: np.ndarray, B: np.ndarray) -> float:
    """||W E - I||_F with W = B^T; D x D, O(V D^2)."""
    E, B = as_matrix(E, "E"), as_matrix(B, "B")
    _same_shape(E, B, "E and B")
    return _pinv_drift(E.T @ B)


def _pinv_drift(M: np.ndarray) -> float:
    # W E = B^T E = M^T with M = E^T B; the Frobenius norm does not see the transpose
    with np.errstate(over="ignore", invalid="ignore"):
        drift = float(np.linalg.norm(M - np.eye(*M.shape)))
    return _finite({"pinv_drift": drift}, "entries too large")["pinv_drift"]


# Above this cond(E), one pass of Cholesky QR loses orthogonality (its error grows like cond(E)^2 u):
# Householder QR takes over. Below it, Cholesky QR twice is as accurate as Householder (O(u)
# orthogonality and backward error; Yamamoto et al. 2015) at a third of the cost.
CHOLQR2_MAX_COND = 1e6


class RangeSplit:
    """E = Q R (thin, Q orthonormal) and B = Q C + B_perp with C = Q^T B, B_perp orthogonal to range(E).

    In this basis the V x V products of the Penrose conditions and of pinv(E) = R^{-1} Q^T split into
    mutually orthogonal pieces whose Frobenius norms are those of D x D and V x D matrices. `work` does the
    V x D products where E and B live (HostWork: numpy); R and C are D x D numpy arrays either way.
    """

    def __init__(self, E, B, work=HOST):
        self.B, self.work = B, work
        with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
            self.Q, self.R = _thin_qr(E, work)
            self.C = work.gram(self.Q, B)
            self.B_perp = work.minus(B, work.times(self.Q, self.C))
        if not (np.isfinite(self.R).all() and np.isfinite(self.C).all() and work.finite(self.B_perp)):
            raise PitcheckError("entries too large for a QR of E in float64")


def _thin_qr(E, work=HOST) -> tuple:
    """Thin Q R of E: Cholesky QR twice while E is tall and well conditioned, else Householder. The D x D
    factorisations run on the host in float64 whatever E's home; the products, in `work`."""
    import scipy.linalg

    try:
        G = work.gram(E)
        # an SVD of non-finite entries can loop for ever: a Gram that overflowed goes to Householder
        R1 = scipy.linalg.cholesky(G) if np.isfinite(G).all() else None  # upper: G = R1^T R1
        if R1 is not None and _condition(R1) <= CHOLQR2_MAX_COND:
            # E R1^{-1} as one GEMM with the D x D triangular inverse: a V-sized triangular solve on a
            # transposed operand costs several GEMMs; below this condition number the inverse loses no
            # more than the solve, and the second pass restores orthogonality to O(u)
            Q1 = work.times(E, _upper_inverse(R1))
            R2 = scipy.linalg.cholesky(work.gram(Q1))
            return work.times(Q1, _upper_inverse(R2)), R2 @ R1
    except (np.linalg.LinAlgError, ValueError):
        pass
    return work.householder(E)


def _upper_inverse(R: np.ndarray) -> np.ndarray:
    import scipy.linalg

    return scipy.linalg.solve_triangular(R, np.eye(*R.shape))


def _condition(R: np.ndarray) -> float:
    """cond_2 of a finite square triangular factor (inf when singular)."""
    s = np.linalg.svd(R, compute_uv=False)
    with np.errstate(divide="ignore"):
        return float(s[0] / s[-1])


def condition_number(A: np.ndarray) -> float:
    """cond_2(A) from the singular values of the triangular factor of its tall orientation, in float64.

    LAPACK's divide-and-conquer SVD of SmolLM2's 49152 x 576 float32 table did not converge; a QR first
    leaves a D x D problem (O(V D^2)), and QR-then-SVD is backward stable like the SVD itself."""
    A = np.asarray(A, dtype=np.float64)
    if A.shape[0] < A.shape[1]:
        A = A.T
    if not np.isfinite(A).all():
        return math.inf
    R = np.linalg.qr(A, mode="r")
    try:
        s = np.linalg.svd(R, compute_uv=False)
    except np.linalg.LinAlgError:  # the slower QR-iteration SVD where divide and conquer gives up
        import scipy.linalg

        s = scipy.linalg.svd(R, compute_uv=False, lapack_driver="gesvd")
    return float(s[0] / s[-1]) if s[-1] > 0 else math.inf


def _require_tall(E: np.ndarray) -> None:
    if E.shape[0] < E.shape[1]:
        raise PitcheckError(f"E must have at least as many rows as columns (V >= D), got shape {E.shape}")


def _penrose(M: np.ndarray, split: RangeSplit) -> dict:
    """The four Penrose residuals from M = E^T B and the range split of (E, B); see penrose_residuals."""
    D = M.shape[0]
    R, C, B_perp, B, work = split.R, split.C, split.B_perp, split.B, split.work
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        MmI = M - np.eye(D)
        # ABA - A = (M - I) A, i.e. E (M - I)^T = Q R (M - I)^T: its norm and ||E||_F are R's
        r1 = _ratio(np.linalg.norm(R @ MmI.T), np.linalg.norm(R))
        r2 = _ratio(work.norm(work.times(B, MmI)), work.norm(B))  # BAB - B = B (M - I)
        r3 = _ratio(np.linalg.norm(M - M.T), np.linalg.norm(M))
        # BA = B R^T Q^T = Q C R^T Q^T + B_perp R^T Q^T, so BA - (BA)^T = Q (C R^T - R C^T) Q^T
        # + B_perp R^T Q^T - Q R B_perp^T: three orthogonal pieces, the last two of equal norm, and
        # ||BA||_F^2 = ||C R^T||_F^2 + ||B_perp R^T||_F^2
        CRt = C @ R.T
        inner = np.linalg.norm(CRt - CRt.T)
        outer = work.norm(work.times(B_perp, R.T))
        r4 = _ratio(np.sqrt(inner ** 2 + 2.0 * outer ** 2), np.sqrt(np.linalg.norm(CRt) ** 2 + outer ** 2))
    return _finite({"penrose_1": float(r1), "penrose_2": float(r2), "penrose_3": float(r3), "penrose_4": float(r4)},
                   "entries too large or too small")


def penrose_residuals(E: np.ndarray, B: np.ndarray) -> dict:
    """Relative residuals of the four Penrose conditions for A = E^T (embed) and B = W^T (unembed).

    ABA = A, BAB = B, (AB)^T = AB, (BA)^T = BA, each as ||lhs - rhs||_F / ||rhs||_F. BA is V x V and is
    never formed: with E = Q R and B = Q C + B_perp (B_perp orthogonal to range(E)), BA - (BA)^T splits
    into orthogonal pieces, ||BA - (BA)^T||_F^2 = ||C R^T - R C^T||_F^2 + 2 ||B_perp R^T||_F^2, each
    computed from small entries (no difference of large squared norms).
    """
    E, B = as_matrix(E, "E"), as_matrix(B, "B")
    _same_shape(E, B, "E and B")
    with np.errstate(over="ignore", invalid="ignore"):
        M = E.T @ B  # AB, D x D
    if not np.isfinite(M).all():
        raise PitcheckError("E^T B overflows float64: entries too large for the Penrose residuals")
    return _penrose(M, RangeSplit(E, B))


def _pinv_error(split: RangeSplit) -> float:
    # pinv(E) = R^{-1} Q^T and W = B^T = C^T Q^T + B_perp^T, so W - pinv(E) = (C^T - R^{-1}) Q^T + B_perp^T,
    # two orthogonal pieces; ||pinv(E)||_F = ||R^{-1}||_F
    R = split.R
    if not np.all(np.diag(R) != 0):
        raise PitcheckError("E is rank deficient: its pseudo-inverse is not a left inverse, pinv_error is undefined")
    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        R_inv = _upper_inverse(R)
        err = _ratio(np.sqrt(np.linalg.norm(split.C.T - R_inv) ** 2 + split.work.norm(split.B_perp) ** 2),
                     np.linalg.norm(R_inv))
    return _finite({"pinv_error": float(err)}, "E is too close to rank deficient")["pinv_error"]


def pinv_error(E: np.ndarray, B: np.ndarray) -> float:
    """||W - pinv(E)||_F / ||pinv(E)||_F with pinv(E) = R^{-1} Q^T from a thin QR of E (never V x V)."""
    E, B = as_matrix(E, "E"), as_matrix(B, "B")
    _same_shape(E, B, "E and B")
    _require_tall(E)
    return _pinv_error(RangeSplit(E, B))


def interface_metrics(Z, L, E, u: float, factor_u: float | None = None, sample_rows: int = 256, B=None,
                      solve_u: float | None = None) -> dict:
    """Every tracked metric for a PIT model: Z and L as stored, E the embedding rows as computed.

    u is the unit roundoff errors are reported in; factor_u (default u) that of the precision T would
    be factorised in, which decides the Cholesky breakdown margin; solve_u (default u) that of the
    solves' arithmetic and stored rows (Policy.solve_u), which the trisolve errors are judged in. B = W^T
    is the head as computed (default Z T, exact from the stored Z and L; an FP8 logits GEMM's head differs).
    """
    Z, L, E = as_matrix(Z, "Z"), as_matrix(L, "L"), as_matrix(E, "E")
    L, u, factor_u = checked_settings(Z.shape, L, E.shape, u, factor_u, sample_rows)
    solve_u = u if solve_u is None else unit_roundoff(solve_u, "solve_u")
    B = Z @ (L @ L.T) if B is None else as_matrix(B, "B")  # W^T = Z T
    _same_shape(E, B, "E and B")
    return checked_interface_metrics(Z, L, E, B, u, factor_u, sample_rows, solve_u=solve_u)


def checked_settings(Z_shape, L: np.ndarray, E_shape, u, factor_u, sample_rows) -> tuple:
    """interface_metrics' checks of the shapes, L and the settings, wherever Z and E live: (L, u, factor_u)."""
    Z_shape, E_shape = tuple(Z_shape), tuple(E_shape)
    if Z_shape != E_shape or L.shape != (Z_shape[1], Z_shape[1]):
        raise PitcheckError(f"shape mismatch: Z {Z_shape}, L {L.shape}, E {E_shape}")
    L, u = as_factor(L), unit_roundoff(u)
    factor_u = u if factor_u is None else unit_roundoff(factor_u, "factor_u")
    if isinstance(sample_rows, bool) or not isinstance(sample_rows, (int, np.integer)) or sample_rows < 1:
        raise PitcheckError(f"sample_rows must be a positive integer, got {sample_rows!r}")
    return L, u, factor_u


def checked_interface_metrics(Z, L: np.ndarray, E, B, u: float, factor_u: float, sample_rows: int,
                              work=HOST, solve_u: float | None = None) -> dict:
    """interface_metrics of checked arguments (finite, matching shapes, L a factor, u and factor_u unit
    roundoffs); Z, E and B where `work` computes (HostWork: numpy arrays), L on the host."""
    out = checked_orthonormality(Z, u, work)
    out.update(cholesky_conditioning(L, factor_u))
    ids = sample_ids(Z.shape[0], sample_rows)
    out.update(_trisolve(work.rows(Z, ids), L, work.rows(E, ids), solve_u or u, out["cond_T"], work))
    out.update(checked_head_metrics(E, B, work))
    return out


def head_metrics(E: np.ndarray, B: np.ndarray) -> dict:
    """The interface metrics any head has: pinv drift, the four Penrose residuals and pinv error."""
    E, B = as_matrix(E, "E"), as_matrix(B, "B")
    _same_shape(E, B, "E and B")
    return checked_head_metrics(E, B)


def checked_head_metrics(E, B, work=HOST) -> dict:
    """head_metrics of finite E and B of one shape, where `work` computes."""
    # one E^T B and one QR of E serve every metric here
    M = work.gram(E, B)
    out = {"pinv_drift": _pinv_drift(M)}
    if not np.isfinite(M).all():
        raise PitcheckError("E^T B overflows float64: entries too large for the Penrose residuals")
    split = RangeSplit(E, B, work)
    pen = _penrose(M, split)
    out["penrose"] = max(pen.values())
    out.update(pen)
    _require_tall(E)
    out["pinv_error"] = _pinv_error(split)
    return out


def sample_ids(vocab: int, count: int) -> np.ndarray:
    """Evenly spaced rows, first and last included: deterministic, the same at every step."""
    return np.unique(np.linspace(0, vocab - 1, min(count, vocab)).round().astype(np.int64))


def measure_guarded(parts, unmeasured: list[str] | tuple = ()) -> dict:
    """Run each (keys, measure) part; a part whose metric is undefined gives NaN for its keys.

    For runs, which must record what they can of a damaged state rather than stop: the result's
    'unmeasured' lists why each failed part failed (empty when all were measured).
    """
    out, reasons = {}, list(unmeasured)
    for keys, measure in parts:
        try:
            out.update(measure())
        except PitcheckError as exc:
            out.update({k: float("nan") for k in keys})
            reasons.append(str(exc))
    out["unmeasured"] = reasons
    return out
