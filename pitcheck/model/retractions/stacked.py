"""The namespace of the stacked forms (B x V x D): each stacked form, beside its one-matrix form, is the same
arithmetic, so that a batched cell's numbers are the unbatched cell's bit for bit.

Why bit for bit holds: torch's and numpy's batched matmul, QR, Cholesky, SVD, eigh and solves on the CPU
run the one-matrix BLAS/LAPACK call once per matrix of the stack, and where the engine calls another
library's LAPACK (scipy's, for numpy's QR and triangular solves) the stack calls that one too (measured equal at 128 x 8 and 32 x 4,
float32 and float64: tests/trajectory/test_batched.py runs whole cells both ways and compares their files), and every
other operation here is elementwise. Each stacked form mirrors its one-matrix form line by line (a change
there must be made in it too: the equality tests fail otherwise).

A retraction that can fail for one matrix (a Cholesky, polar-gram's singular Gram, polar-ns not
converging) reports a per-matrix `failed` mask instead of raising: the caller hands those cells back to the
unbatched engine, which redoes the step and records the event. polar-ns has a data-dependent iteration
count: its stacked form iterates the still-active matrices only, each stopping where its own loop would.
The approximate maps have no stacked form: their cells run unbatched.
"""
from __future__ import annotations

import functools

import numpy as np
import scipy.linalg

from ...numerics.arrays import householder_qr
from .common import _plain_torch, _sum_products


# torch's CPU bmm/baddbmm compute a product of fewer multiply-adds than this (rows x inner x columns) by a
# loop of their own, not by the BLAS gemm that mm calls, and round differently (measured: D x D products at
# D = 4 and 6 with a column-major operand, as LAPACK's solves return it); such products go matrix by matrix
TORCH_BMM_OWN_LOOP_BELOW = 400


# below this many bytes a CPU elementwise kernel's input is all scalar remainder on every x86 torch build
# (two AVX2 vectors; see StackedOps._scalar_on_every_diagonal)
SCALAR_TAIL_BYTES = 64


@functools.lru_cache(maxsize=1)
def _x86_simd() -> bool:
    import torch

    return torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")


class StackedOps:
    """The stacked (B x ...) counterparts of an engine's Ops (arrays.py): matmul, casts and elementwise
    functions are the engine's own (they broadcast); transposes, diagonals, concatenation, QR, Cholesky
    and triangular solves act on the last two axes, matrix by matrix."""

    def __init__(self, ops):
        self.base = ops
        self.torch = getattr(ops, "torch", None)
        self.sqrt = ops.sqrt
        self.tril, self.sign_nonzero, self.svd, self.eigh = ops.tril, ops.sign_nonzero, ops.svd, ops.eigh

    def _small(self, a, b) -> bool:
        return bool(self.torch) and a.shape[-2] * a.shape[-1] * b.shape[-1] < TORCH_BMM_OWN_LOOP_BELOW

    def matmul(self, a, b):
        if self._small(a, b):  # torch's own loop would round otherwise than mm's BLAS call: one mm each
            return self.torch.stack([self.base.matmul(x, y) for x, y in zip(a, b)])
        return self.base.matmul(a, b)

    def t(self, x):
        return x.transpose(-1, -2) if self.torch else np.swapaxes(x, -1, -2)

    def diagonal(self, x):
        return x.diagonal(0, -2, -1) if self.torch else np.diagonal(x, 0, -2, -1)

    def diag_embed(self, d):
        if self.torch:
            return self.torch.diag_embed(d)
        out = np.zeros(d.shape + d.shape[-1:], dtype=d.dtype)
        idx = np.arange(d.shape[-1])
        out[..., idx, idx] = d
        return out

    def on_diagonals(self, fn, x):
        """fn (softplus, sigmoid) of each matrix's diagonal with the bits of the engine's one 1-D call per
        matrix: torch's vectorised exp and log round otherwise than its scalar path, and which one an element
        takes depends on the tensor's length and strides (measured: a stacked diagonal differs from the
        matrix's own from D = 32 float32 with AVX512, two of its vectors). One call where that cannot happen
        (_scalar_on_every_diagonal), else one call per matrix."""
        base = self.base
        if self._scalar_on_every_diagonal(x):
            return fn(x.diagonal(0, -2, -1))
        return (self.torch.stack if self.torch else np.stack)([fn(base.diag(m)) for m in x])

    def _scalar_on_every_diagonal(self, x) -> bool:
        """Whether one call on the stack's diagonal view gives each matrix's own bits.

        torch: its CPU kernels step two SIMD vectors at a time and leave the rest to the scalar kernel, so a
        lone diagonal shorter than two vectors is all scalar; the stack's diagonal view is strided, never
        vectorised, so all scalar too. Two AVX2 vectors are 64 bytes (AVX512's, 128): float32 D < 16, float64
        D < 8. Other CPUs, and other devices, keep the loop.
        numpy (the float64 shadow): its loops finish a vector's worth with a partial load of the same kernel,
        so an entry's bits do not depend on where it sits: one call at every D (measured at D = 1 to 39, 64
        and 128, with infinities, NaN and subnormals). tests/model/retractions/test_batched_diagonals.py holds
        both equal."""
        if not self.torch:
            return True
        return x.device.type == "cpu" and x.shape[-1] * x.element_size() < SCALAR_TAIL_BYTES and _x86_simd()

    def eye(self, n, like):
        return self.base.eye(n, like)

    def cat(self, xs, axis):
        # a one-matrix axis, shifted past the stack's
        return self.torch.cat(xs, dim=axis + 1) if self.torch else np.concatenate(xs, axis=axis + 1)

    def contiguous(self, x):
        return x.contiguous() if self.torch else np.ascontiguousarray(x)

    def finite(self, x) -> np.ndarray:
        """Per matrix: every entry finite (a bool array of B)."""
        if self.torch and (x.device.type != "cpu" or x.dtype not in (self.torch.float32, self.torch.float64)):
            return self.torch.isfinite(x).flatten(1).all(1).cpu().numpy()
        # numpy on the CPU tensor's memory: one call where torch dispatches four (TorchOps.isfinite_all)
        x = x.detach().numpy() if self.torch else x
        return np.isfinite(x).reshape(x.shape[0], -1).all(1)

    def qr(self, x):
        if self.torch:
            return self.torch.linalg.qr(x)
        # the engine's own call per matrix: np.linalg.qr's stacked form runs numpy's bundled LAPACK, where
        # householder_qr runs scipy's, another OpenBLAS build whose bits agree with numpy's only where their
        # kernels do (they did on the project's CPU; on an H200 machine's CPU, numpy 2.5.2 and its scipy,
        # they did not: results/gpu/NOTE.md). About 5 us a matrix more at 128 x 8.
        factors = [householder_qr(m) for m in x]
        return np.stack([Q for Q, _ in factors]), np.stack([R for _, R in factors])

    def cholesky(self, x):
        """(factors, failed mask): a failed matrix's factor is garbage, never an exception for the stack."""
        if self.torch:
            C, info = self.torch.linalg.cholesky_ex(x)
            return C, (info != 0).cpu().numpy()
        failed = np.zeros(x.shape[0], dtype=bool)
        try:
            return np.linalg.cholesky(x), failed
        except np.linalg.LinAlgError:  # numpy raises for the stack: factor matrix by matrix
            out = np.zeros_like(x)
            for b in range(x.shape[0]):
                try:
                    out[b] = np.linalg.cholesky(x[b])
                except np.linalg.LinAlgError:
                    failed[b] = True
            return out, failed

    def solve_triangular(self, a, b, lower):
        if self.torch:
            return self.torch.linalg.solve_triangular(a, b, upper=not lower)
        # scipy's trtrs has no stacked form here: one call per matrix, as the engine makes it
        return np.stack([scipy.linalg.solve_triangular(a[k], b[k], lower=lower, check_finite=False)
                         for k in range(a.shape[0])])

    def solve(self, a, b):
        """(solutions, failed mask): a singular matrix's solution is garbage, never an exception for the
        stack (the engine alone raises for it, and records that)."""
        if self.torch:
            x, info = self.torch.linalg.solve_ex(a, b)  # what linalg.solve calls, without its raise
            return x, (info != 0).cpu().numpy()
        failed = np.zeros(a.shape[0], dtype=bool)
        try:
            return np.linalg.solve(a, b), failed
        except np.linalg.LinAlgError:  # numpy raises for the stack: solve matrix by matrix
            out = np.zeros(np.broadcast_shapes(a.shape[:-1], b.shape[:-1]) + b.shape[-1:], dtype=b.dtype)
            for k in range(a.shape[0]):
                try:
                    out[k] = np.linalg.solve(a[k], b[k])
                except np.linalg.LinAlgError:
                    failed[k] = True
            return out, failed

    def add_products(self, Z, pairs):
        """common._add_products: baddbmm where the engine fuses addmm (plain torch, same dtype)."""
        fuse = (_plain_torch(self.base) and Z.dtype == pairs[0][0].dtype
                and not any(self._small(A, B) for A, B in pairs))
        return _sum_products(Z, pairs, self.matmul,
                             (self.torch.baddbmm, self.torch.Tensor.baddbmm_) if fuse else None)


def stacked_sym(a, ops: StackedOps):
    return 0.5 * (a + ops.t(a))


def tangent_projection(Z, G, ops: StackedOps):
    return G - ops.matmul(Z, stacked_sym(ops.matmul(ops.t(Z), G), ops))


def none_failed(Z) -> np.ndarray:
    return np.zeros(Z.shape[0], dtype=bool)


def replace_failed(C, failed, ops: StackedOps):
    """C with each failed matrix the identity, in C's own memory layout: a solve with a triangular factor
    rounds otherwise when the factor is row-major (torch's where() output) than column-major (LAPACK's,
    as cholesky_ex returns it): measured at 128 x 8 float32, every healthy cell's bits changed."""
    if not failed.any():
        return C
    out = C.clone() if ops.torch else C.copy(order="K")  # both keep the strides
    index = np.flatnonzero(failed)
    out[ops.torch.from_numpy(index).to(C.device) if ops.torch else index] = ops.eye(C.shape[-1], like=C)
    return out


def take(x, index: np.ndarray, ops: StackedOps):
    """The matrices of x at `index` (a copy, contiguous: as the one-matrix loop's own Y and G are)."""
    return x[ops.torch.from_numpy(index).to(x.device)] if ops.torch else x[index]
