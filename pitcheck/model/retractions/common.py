"""Helpers the maps share: the tangent projection, row-major copies, and sums of products fused into
addmm where that is exact (their stacked forms call the same sum with baddbmm)."""
from __future__ import annotations

from ...numerics.arrays import ops_for


def _sym(a):
    return 0.5 * (a + a.T)


def tangent_projection(Z, G, ops=None):
    """P_Z(G) = G - Z sym(Z^T G): the embedded-metric projection onto the tangent space at Z."""
    ops = ops or ops_for(Z)
    return G - ops.matmul(Z, _sym(ops.matmul(Z.T, G)))


def _contiguous(x):
    """x in row-major (C) order: LAPACK hands back column-major factors, and every later elementwise
    update of a column-major Z is a strided pass (a default step a third slower)."""
    if hasattr(x, "is_contiguous"):
        return x.contiguous()
    import numpy as np

    return np.ascontiguousarray(x)


def _scale_columns_into_row_major(Q, scale):
    """Q * scale written straight into a row-major array: one pass over LAPACK's column-major Q instead
    of a scaled column-major copy and then a transposing one."""
    if hasattr(Q, "is_contiguous"):
        import torch

        return torch.mul(Q, scale, out=torch.empty(Q.shape, dtype=Q.dtype, device=Q.device))
    import numpy as np

    return np.multiply(Q, scale, out=np.empty(Q.shape, dtype=Q.dtype))


def _plain_torch(ops) -> bool:
    """True for torch Ops that do no reduced-precision emulation: fused kernels (addmm) are then exact
    substitutes for the namespace's matmul followed by an add."""
    return getattr(ops, "name", "") == "torch" and ops.matmul_format is None and ops.matmul_dtype is None


def _sum_products(Z, pairs, matmul, fused=None):
    """Z + sum(A @ B for A, B in pairs): with fused = (first, accumulate), e.g. (addmm, addmm_), one fused
    call per product; else the namespace's matmul and adds. Shared with the stacked forms (baddbmm)."""
    if fused:
        first, accumulate = fused
        out = first(Z, *pairs[0])
        for A, B in pairs[1:]:
            accumulate(out, A, B)
        return out
    out = Z
    for A, B in pairs:
        out = out + matmul(A, B)
    return out


def _add_products(Z, pairs, ops):
    """Z + sum(A @ B for A, B in pairs), fused into addmm calls where that is exact."""
    fuse = _plain_torch(ops) and Z.dtype == pairs[0][0].dtype
    return _sum_products(Z, pairs, ops.matmul, (ops.torch.addmm, ops.torch.Tensor.addmm_) if fuse else None)
