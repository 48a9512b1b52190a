"""A minimal common namespace over numpy and torch, so each retraction is written once.

`ops_for(x)` gives the Ops of x's library. The torch Ops can emulate reduced-precision matmuls
(operands rounded to a format, products accumulated in the working dtype), which is how tf32 and
bf16/fp16 tensor-core matmuls are modelled where the hardware does not do it natively.
"""
from __future__ import annotations

import functools

import numpy as np
import scipy.linalg
from scipy.linalg import lapack

from .deferred_checks import DeferredChecks
from .formats import Format, round_to


@functools.lru_cache(maxsize=64)
def _geqrf_lwork(rows: int, cols: int) -> int:
    return int(lapack.dgeqrf_lwork(rows, cols)[0])


def householder_qr(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Reduced Householder QR (Q, R) of a tall float64 matrix by LAPACK's geqrf and orgqr called directly,
    with the optimal (blocked) workspace that np.linalg.qr also asks for: the same factorisation, bit for
    bit (checked here at 128 x 8 to 8192 x 128, 1 and 2 threads), at 1.3x (8192 x 128) to 2x (128 x 8) its
    speed, for it skips np.linalg.qr's gufunc wrapping and copies. Q comes back column-major."""
    rows, cols = x.shape
    if x.dtype != np.float64 or rows < cols or cols == 0:
        return np.linalg.qr(x)  # not the hot path: square-or-wide, empty or not float64
    lwork = _geqrf_lwork(rows, cols)
    # a column-major copy that LAPACK factors in place (asfortranarray would hand a column-major x itself)
    factors, tau, _, info = lapack.dgeqrf(np.array(x, order="F"), lwork=lwork, overwrite_a=1)
    if info != 0:  # pragma: no cover - only for an illegal argument, which the shapes above exclude
        return np.linalg.qr(x)
    R = np.triu(factors[:cols])
    Q, _, info = lapack.dorgqr(factors, tau, lwork=lwork, overwrite_a=1)
    if info != 0:  # pragma: no cover
        return np.linalg.qr(x)
    return Q, R


def householder_r(x: np.ndarray) -> np.ndarray:
    """The R factor of householder_qr(x) alone (geqrf, no orgqr): the same bits as its R."""
    rows, cols = x.shape
    if x.dtype != np.float64 or rows < cols or cols == 0:
        return np.linalg.qr(x, mode="r")
    # info is nonzero only for an illegal argument, which the shapes above exclude
    factors = lapack.dgeqrf(np.array(x, order="F"), lwork=_geqrf_lwork(rows, cols), overwrite_a=1)[0]
    return np.triu(factors[:cols])


class NumpyOps:
    """float64 numpy: the reference's namespace (no reduced-precision emulation needed)."""

    name = "numpy"

    def __init__(self):
        self.checks = DeferredChecks()  # never deferring: a host array's check costs no device stall

    def matmul(self, a, b):
        return a @ b

    def eye(self, n, like):
        return np.eye(n, dtype=like.dtype)

    def dtype_unit_roundoff(self, x):
        """u = 2^-p of x's dtype (half of numpy's eps)."""
        return float(np.finfo(x.dtype).eps) / 2

    def cat(self, xs, axis):
        return np.concatenate(xs, axis=axis)

    def diag(self, x):
        return np.diag(x)

    def tril(self, x, k=0):
        return np.tril(x, k)

    def sqrt(self, x):
        return np.sqrt(x)

    def sign_nonzero(self, x):
        return np.where(x < 0, -1.0, 1.0).astype(x.dtype)

    def norm(self, x):
        return float(np.linalg.norm(x))

    def svd(self, x):
        return np.linalg.svd(x, full_matrices=False)

    def qr(self, x):
        return householder_qr(x)

    def householder_r(self, x):
        return householder_r(x)

    def eigh(self, x):
        return np.linalg.eigh(x)

    def cholesky(self, x):
        return np.linalg.cholesky(x)

    def solve(self, a, b):
        return np.linalg.solve(a, b)

    def solve_triangular(self, a, b, lower):
        return scipy.linalg.solve_triangular(a, b, lower=lower, check_finite=False)

    def softplus(self, x):
        return np.logaddexp(0.0, x)

    def sigmoid(self, x):
        return 0.5 * (1.0 + np.tanh(0.5 * x))

    def isfinite_all(self, x):
        return bool(np.isfinite(x).all())

    def all_true(self, mask):
        return bool(np.all(mask))

    def to_numpy(self, x):
        return np.asarray(x, dtype=np.float64)


class TorchOps:
    name = "torch"

    def __init__(self, matmul_format: Format | None = None, matmul_dtype=None, native: bool = True):
        """matmul_format: round operands to it (tf32 emulation); matmul_dtype: bf16/fp16 matmuls, run in
        that dtype when native (CUDA tensor cores), else emulated: operands cast exactly to it, product
        accumulated in the working dtype and rounded to it (the tensor-core contract, fast on a CPU)."""
        import torch

        self.torch = torch
        # the dtypes numpy can view without a copy (not bfloat16)
        self._numpy_view_dtypes = (torch.float16, torch.float32, torch.float64)
        self.matmul_format = matmul_format
        self.matmul_dtype = matmul_dtype
        self.native = native
        # while checks.deferring, isfinite_all, all_true and cholesky keep their verdicts on the device
        self.checks = DeferredChecks()

    def matmul(self, a, b):
        if self.matmul_dtype is not None and self.matmul_dtype != a.dtype:
            low = self.matmul_dtype
            if self.native:
                return (a.to(low) @ b.to(low)).to(a.dtype)
            return (a.to(low).to(a.dtype) @ b.to(low).to(a.dtype)).to(low).to(a.dtype)
        if self.matmul_format is not None:
            a, b = round_float32(a, self.matmul_format), round_float32(b, self.matmul_format)
        return a @ b

    def eye(self, n, like):
        return self.torch.eye(n, dtype=like.dtype, device=like.device)

    def dtype_unit_roundoff(self, x):
        """u = 2^-p of x's dtype (half of torch's eps)."""
        return float(self.torch.finfo(x.dtype).eps) / 2

    def cat(self, xs, axis):
        return self.torch.cat(xs, dim=axis)

    def diag(self, x):
        return self.torch.diag(x)

    def tril(self, x, k=0):
        return self.torch.tril(x, k)

    def sqrt(self, x):
        return self.torch.sqrt(x)

    def sign_nonzero(self, x):
        return self.torch.where(x < 0, -1.0, 1.0).to(x.dtype)

    def norm(self, x):
        return float(self.torch.linalg.norm(x))

    # device types whose eigensolver and SVD this class runs in float64 for lower-precision tensors. On an H100,
    # one tangent step at 32768 x 512 fp32 left polar (cuSOLVER's SVD) 4.9e4 u from the manifold and polar-gram
    # (its eigh) 3.4e4 u, where LAPACK on the CPU lands near 300 u and Householder QR on the GPU 68 u. The
    # float64 work is the D x D part only (O(D^3), small beside the V D^2 products); the CPU keeps LAPACK in
    # the tensor's own dtype, as every committed CPU result was computed.
    FLOAT64_FACTORS_ON = frozenset({"cuda"})

    def _factors_in_float64(self, x) -> bool:
        return x.device.type in self.FLOAT64_FACTORS_ON and x.dtype != self.torch.float64

    def svd(self, x):
        if not self._factors_in_float64(x):
            return self.torch.linalg.svd(x, full_matrices=False)
        if x.shape[-2] > x.shape[-1]:
            # tall: Householder QR in x's dtype (accurate on the GPU), then the D x D SVD of R in float64
            Q, R = self.torch.linalg.qr(x)
            U, S, Vh = self.torch.linalg.svd(R.double())
            return Q @ U.to(x.dtype), S.to(x.dtype), Vh.to(x.dtype)
        U, S, Vh = self.torch.linalg.svd(x.double(), full_matrices=False)
        return U.to(x.dtype), S.to(x.dtype), Vh.to(x.dtype)

    def qr(self, x):
        return self.torch.linalg.qr(x)

    def householder_r(self, x):
        """R of Householder QR (geqrf alone): torch.linalg.qr's R, without forming Q."""
        return self.torch.geqrf(x)[0][: x.shape[1]].triu()

    def eigh(self, x):
        if not self._factors_in_float64(x):
            return self.torch.linalg.eigh(x)
        w, Q = self.torch.linalg.eigh(x.double())
        return w.to(x.dtype), Q.to(x.dtype)

    def cholesky(self, x):
        if self.checks.deferring:  # cholesky_ex: the same factor, its failure kept instead of raised
            factor, info = self.torch.linalg.cholesky_ex(x)
            self.checks.keep(info == 0)
            return factor
        return self.torch.linalg.cholesky(x)

    def solve(self, a, b):
        return self.torch.linalg.solve(a, b)

    def solve_triangular(self, a, b, lower):
        return self.torch.linalg.solve_triangular(a, b, upper=not lower)

    def softplus(self, x):
        return self.torch.nn.functional.softplus(x)

    def sigmoid(self, x):
        return self.torch.sigmoid(x)

    def isfinite_all(self, x):
        if x.device.type == "cpu" and x.dtype in self._numpy_view_dtypes and not self.checks.deferring:
            # numpy on the same memory: one call where torch dispatches four (5 us against 30 at 128 x 8,
            # a tenth of a small step; no slower at 65536 x 32)
            return bool(np.isfinite(x.detach().numpy()).all())
        # min and max are finite exactly when every entry is (both propagate NaN): one reduction pass,
        # about a tenth of isfinite(x).all(), which writes a mask the size of x first
        if x.numel() == 0:
            return True
        low, high = self.torch.aminmax(x)
        return self.all_true(self.torch.isfinite(low) & self.torch.isfinite(high))

    def all_true(self, mask):
        if self.checks.deferring:
            return self.checks.keep(mask.all())
        return bool(mask.all())

    def to_numpy(self, x):
        return x.detach().to("cpu", self.torch.float64).numpy()


def round_float32(x, fmt: Format):
    """Round a float32 torch tensor to fmt (p <= 24, fp32's exponent range) by integer bit arithmetic:
    add half an ulp of fmt plus the tie-to-even bit, then clear the dropped bits. Exact RNE, and fast."""
    torch = __import__("torch")
    if x.dtype != torch.float32 or fmt.emin != -126 or fmt.emax != 127:
        return round_to(x, fmt)
    drop = 24 - fmt.p
    if x.device.type == "cpu" and not x.requires_grad:
        return torch.from_numpy(_round_float32_bits(x.numpy(), drop))
    bits = x.view(torch.int32)
    bias = (1 << (drop - 1)) - 1 + ((bits >> drop) & 1)
    y = ((bits + bias) & ~((1 << drop) - 1)).view(torch.float32)
    return torch.where(torch.isfinite(x), y, x)


def _round_float32_bits(a: np.ndarray, drop: int) -> np.ndarray:
    """round_float32's arithmetic in numpy on a CPU tensor's memory: the same bits at a quarter of the time
    at the default grid's sizes (torch dispatches seven small kernels; tf32 cells round every operand)."""
    bits = a.view(np.int32)
    y = (bits >> drop) & 1
    y += bits
    y += (1 << (drop - 1)) - 1  # int32 wraps only for NaN payloads, which are put back below
    y &= ~((1 << drop) - 1)
    out = y.view(np.float32)
    if not np.isfinite(a).all():
        nonfinite = ~np.isfinite(a)
        out[nonfinite] = a[nonfinite]
    return out


def linalg_errors() -> tuple[type, ...]:
    """The exceptions numpy's and torch's factorisations raise when one fails (an eigensolver that does not
    converge, a singular solve): a retraction's failure, which a run records and skips, not a crash."""
    import sys

    torch = sys.modules.get("torch")  # only a run that has loaded torch can get torch's error
    return (np.linalg.LinAlgError,) + ((torch.linalg.LinAlgError,) if torch is not None else ())


def ops_for(x) -> NumpyOps | TorchOps:
    if type(x).__module__.startswith("torch"):
        return TorchOps()
    return NumpyOps()
