"""Retractions on a stack of B memories (B x V x D), each the same arithmetic as its one-matrix form in
retractions.py, so that a batched cell's numbers are the unbatched cell's bit for bit.

Why bit for bit holds: torch's and numpy's batched matmul, QR, Cholesky, SVD, eigh and solves on the CPU
run the one-matrix BLAS/LAPACK call once per matrix of the stack, and where the engine calls another
library's LAPACK (scipy's, for numpy's QR and triangular solves) the stack calls that one too (measured equal at 128 x 8 and 32 x 4,
float32 and float64: tests/test_batched.py runs whole cells both ways and compares their files), and every
other operation here is elementwise. Each function mirrors its model in retractions.py line by line
(a change there must be made here too: the equality tests fail otherwise).

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

from ..numerics.arrays import householder_qr
from .retractions import QR_BY_SOLVE_MIN_ELEMENTS, CheckedMap, _plain_torch, _sum_products, retract_qr


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
        and 128, with infinities, NaN and subnormals). tests/test_batched_diagonals.py holds both equal."""
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
        """retractions._add_products: baddbmm where the engine fuses addmm (plain torch, same dtype)."""
        fuse = (_plain_torch(self.base) and Z.dtype == pairs[0][0].dtype
                and not any(self._small(A, B) for A, B in pairs))
        return _sum_products(Z, pairs, self.matmul,
                             (self.torch.baddbmm, self.torch.Tensor.baddbmm_) if fuse else None)


def _sym(a, ops: StackedOps):
    return 0.5 * (a + ops.t(a))


def tangent_projection(Z, G, ops: StackedOps):
    return G - ops.matmul(Z, _sym(ops.matmul(ops.t(Z), G), ops))


def _none_failed(Z) -> np.ndarray:
    return np.zeros(Z.shape[0], dtype=bool)


class StackedMap(CheckedMap):
    """A stacked form behind check_point's refusal of a shape with no orthonormal point, as every registered
    one-matrix map is (retractions.CheckedMap); it pickles by name from this module's registry."""

    def __reduce__(self):
        return _stacked_map, (self.name,)


def _stacked_map(name: str):
    return STACKED_RETRACTIONS[name]


def stacked_form(name: str):
    """Wrap a stacked form as a StackedMap (under its own module name too)."""
    return lambda fn: StackedMap(name, fn, stacked=True)


@stacked_form("qr")
def stacked_qr(Z, xi, ops: StackedOps):
    if Z.shape[-2] * Z.shape[-1] >= QR_BY_SOLVE_MIN_ELEMENTS:  # retract_qr may form Q by a solve there
        stack = ops.torch.stack if ops.torch else np.stack
        return stack([retract_qr(z, x, ops.base) for z, x in zip(Z, xi)]), _none_failed(Z)
    Q, R = ops.qr(Z + xi)
    # row-major, as _scale_columns_into_row_major writes it (a column-major Z is another checkpoint file)
    return ops.contiguous(Q * ops.sign_nonzero(ops.diagonal(R))[..., None, :]), _none_failed(Z)


def _chol_gram(Y, ops: StackedOps):
    return ops.cholesky(_sym(ops.matmul(ops.t(Y), Y), ops))


@stacked_form("cholqr")
def stacked_cholqr(Z, xi, ops: StackedOps):
    Y = Z + xi
    C, failed = _chol_gram(Y, ops)
    # a failed factor may be singular: a solve with it would raise for the whole stack
    C = _replace_failed(C, failed, ops)
    return ops.contiguous(ops.t(ops.solve_triangular(C, ops.t(Y), lower=True))), failed


def _upper_inverse_right(Y, C, ops: StackedOps):
    eye = ops.eye(C.shape[-1], like=C)
    Cinv = ops.solve_triangular(C, eye.expand(C.shape) if ops.torch else np.broadcast_to(eye, C.shape), lower=True)
    return ops.contiguous(ops.matmul(Y, ops.t(Cinv)))


@stacked_form("cholqr2")
def stacked_cholqr2(Z, xi, ops: StackedOps):
    Y = Z + xi
    C, failed = _chol_gram(Y, ops)
    # a failed factor is garbage: its matrix is the unbatched engine's to redo; keep the stack finite
    C = _replace_failed(C, failed, ops)
    Y1 = _upper_inverse_right(Y, C, ops)
    C1, failed1 = _chol_gram(Y1, ops)
    C1 = _replace_failed(C1, failed1, ops)
    return _upper_inverse_right(Y1, C1, ops), failed | failed1


def _replace_failed(C, failed, ops: StackedOps):
    """C with each failed matrix the identity, in C's own memory layout: a solve with a triangular factor
    rounds otherwise when the factor is row-major (torch's where() output) than column-major (LAPACK's,
    as cholesky_ex returns it): measured at 128 x 8 float32, every healthy cell's bits changed."""
    if not failed.any():
        return C
    out = C.clone() if ops.torch else C.copy(order="K")  # both keep the strides
    index = np.flatnonzero(failed)
    out[ops.torch.from_numpy(index).to(C.device) if ops.torch else index] = ops.eye(C.shape[-1], like=C)
    return out


@stacked_form("polar")
def stacked_polar(Z, xi, ops: StackedOps):
    U, _, Vt = ops.svd(Z + xi)
    return ops.matmul(U, Vt), _none_failed(Z)


@stacked_form("polar-gram")
def stacked_polar_gram(Z, xi, ops: StackedOps):
    Y = Z + xi
    gram = _sym(ops.matmul(ops.t(Y), Y), ops)
    # an overflowed Gram makes eigh raise for the whole stack: its matrix is failed, the stack goes on
    overflowed = ~ops.finite(gram)
    w, Q = ops.eigh(_replace_failed(gram, overflowed, ops))
    u = ops.base.dtype_unit_roundoff(w)
    w_np = w.detach().cpu().numpy() if ops.torch else w
    # retract_polar_gram's guard, per matrix (float(w.min()) there: the same comparison in float64)
    failed = overflowed | ~(w_np.min(-1).astype(np.float64) > Y.shape[-1] * u * w_np.max(-1).astype(np.float64))
    # a failed matrix's eigenvalues may be 0 or negative: its result is discarded (the mask), so numpy's
    # warnings about its square root and division would be noise
    with np.errstate(invalid="ignore", divide="ignore"):
        return ops.matmul(Y, ops.matmul(Q / ops.sqrt(w)[..., None, :], ops.t(Q))), failed


@stacked_form("cayley")
def stacked_cayley(Z, xi, ops: StackedOps):
    mm, t = ops.matmul, ops.t
    G, A, X = mm(t(Z), Z), mm(t(Z), xi), mm(t(xi), xi)
    GA = mm(G, A)
    Ztg = A - 0.5 * GA
    gtg = X - mm(t(A), A) + 0.25 * mm(t(A), GA)
    VtU = ops.cat([ops.cat([Ztg, G], 1), ops.cat([-gtg, -t(Ztg)], 1)], 0)
    VtZ = ops.cat([G, -t(Ztg)], 0)
    K, failed = ops.solve(ops.eye(VtU.shape[-1], like=VtU) - 0.5 * VtU, VtZ)
    D = Z.shape[-1]
    K1, K2 = K[:, :D], K[:, D:]
    return ops.add_products(Z, [(xi, K1), (Z, K2 - 0.5 * mm(A, K1))]), failed


@stacked_form("cayley-iter")
def stacked_cayley_iter(Z, xi, ops: StackedOps, iterations: int = 2):
    mm, t = ops.matmul, ops.t
    g = xi - 0.5 * mm(Z, mm(t(Z), xi))

    def apply_w(Y):
        return mm(g, mm(t(Z), Y)) - mm(Z, mm(t(g), Y))

    Y = Z + apply_w(Z)
    for _ in range(iterations):
        Y = Z + 0.5 * apply_w(Z + Y)
    return Y, _none_failed(Z)


def _take(x, index: np.ndarray, ops: StackedOps):
    """The matrices of x at `index` (a copy, contiguous: as the one-matrix loop's own Y and G are)."""
    return x[ops.torch.from_numpy(index).to(x.device)] if ops.torch else x[index]


@stacked_form("polar-ns")
def stacked_polar_ns(Z, xi, ops: StackedOps, max_iter: int = 50):
    """retract_polar_ns per matrix: each matrix iterates until its own ||Y^T Y - I||_F stops halving, and
    only the still-active matrices are stepped (a stopped one keeps its Y as its loop returns it). `failed`:
    the matrices for which retract_polar_ns raises RetractionError (no convergence, or too far from the
    manifold). Each error is ops.norm of that one matrix, a Python float as there: a norm over the stack
    sums in another order (numpy's differs from the matrix's own at most shapes)."""
    Y = Z + xi
    B = Y.shape[0]
    eye = ops.eye(Y.shape[-1], like=Y)
    prev = np.full(B, np.inf)  # float64, as the one-matrix loop's Python floats
    failed = _none_failed(Z)
    active = np.arange(B)
    for _ in range(max_iter):
        Ya = Y if len(active) == B else _take(Y, active, ops)
        G = ops.matmul(ops.t(Ya), Ya)
        err = np.array([ops.base.norm(d) for d in G - eye], dtype=np.float64)
        stop = ~(err < 0.5 * prev[active])
        failed[active[stop & (err > 1e-2)]] = True  # did not converge
        go = ~stop
        prev[active[go]] = err[go]
        far = go & (err > 1.0)  # too far from the manifold
        failed[active[far]] = True
        go &= ~far
        if not go.any():
            break
        if go.all():
            Y_new = ops.matmul(Ya, 1.5 * eye - 0.5 * G)
        else:
            index = np.flatnonzero(go)
            Y_new = ops.matmul(_take(Ya, index, ops), 1.5 * eye - 0.5 * _take(G, index, ops))
        active = active[go]
        if len(active) == B:
            Y = Y_new
        else:
            Y[ops.torch.from_numpy(active).to(Y.device) if ops.torch else active] = Y_new
    return Y, failed


# name -> stacked form; a retraction not named here runs its cells unbatched
STACKED_RETRACTIONS = {
    "qr": stacked_qr, "cholqr": stacked_cholqr, "cholqr2": stacked_cholqr2, "polar": stacked_polar,
    "polar-gram": stacked_polar_gram, "polar-ns": stacked_polar_ns, "cayley": stacked_cayley,
    "cayley-iter": stacked_cayley_iter,
}
