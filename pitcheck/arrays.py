"""A minimal common namespace over numpy and torch, so each retraction is written once.

`ops_for(x)` gives the Ops of x's library. The torch Ops can emulate reduced-precision matmuls
(operands rounded to a format, products accumulated in the working dtype), which is how tf32 and
bf16/fp16 tensor-core matmuls are modelled where the hardware does not do it natively.
"""
from __future__ import annotations

import numpy as np
import scipy.linalg

from .formats import Format, round_to


class NumpyOps:
    name = "numpy"

    def __init__(self, matmul_format: Format | None = None):
        self.matmul_format = matmul_format

    def matmul(self, a, b):
        if self.matmul_format is not None:
            a, b = round_to(a, self.matmul_format), round_to(b, self.matmul_format)
        return a @ b

    def eye(self, n, like):
        return np.eye(n, dtype=like.dtype)

    def zeros_like(self, x):
        return np.zeros_like(x)

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
        return np.linalg.qr(x)

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

    def to_numpy(self, x):
        return np.asarray(x, dtype=np.float64)


class TorchOps:
    name = "torch"

    def __init__(self, matmul_format: Format | None = None, matmul_dtype=None):
        import torch

        self.torch = torch
        self.matmul_format = matmul_format  # emulate by rounding the operands
        self.matmul_dtype = matmul_dtype  # run natively in this dtype (bf16/fp16 tensor cores)

    def matmul(self, a, b):
        if self.matmul_dtype is not None and self.matmul_dtype != a.dtype:
            return (a.to(self.matmul_dtype) @ b.to(self.matmul_dtype)).to(a.dtype)
        if self.matmul_format is not None:
            a, b = round_to(a, self.matmul_format), round_to(b, self.matmul_format)
        return a @ b

    def eye(self, n, like):
        return self.torch.eye(n, dtype=like.dtype, device=like.device)

    def zeros_like(self, x):
        return self.torch.zeros_like(x)

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

    def svd(self, x):
        return self.torch.linalg.svd(x, full_matrices=False)

    def qr(self, x):
        return self.torch.linalg.qr(x)

    def eigh(self, x):
        return self.torch.linalg.eigh(x)

    def cholesky(self, x):
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
        return bool(self.torch.isfinite(x).all())

    def to_numpy(self, x):
        return x.detach().to("cpu", self.torch.float64).numpy()


def ops_for(x) -> NumpyOps | TorchOps:
    if type(x).__module__.startswith("torch"):
        return TorchOps()
    return NumpyOps()
