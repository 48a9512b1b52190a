"""A batch's gradients computed as one stack: the bits of `gradients.gradient` run cell by cell.

Each cell still draws from its own streams (`np.random.default_rng([seed, step, index])`'s per component,
built by seed_streams; the same draws in the same order); only the arithmetic after the draws runs on the
whole stack (3-D matmuls, one softmax, one scatter-add), which gives each cell the bits of its own 2-D call: numpy's
matmul hands every matrix of a stack to the same BLAS call a lone matrix gets, elementwise ops do not
depend on the array's shape, and the reductions (softmax's max and sum) run over the last axis row by row
in both. The Cholesky solves stay per cell (LAPACK potrs on each cell's own factor).
tests/model/test_stacked_gradients.py holds the two byte-identical.

A cell whose models have no stacked form here, or whose input the stack cannot take (a non-finite factor
or table row that sparse_input's solve must refuse, as cho_solve does), is computed by `gradient` itself.
"""
from __future__ import annotations

import math

import numpy as np
import scipy.linalg

from .draw_memo import MEMO
from .gradients import AdversaryParams, _zipf_ids, gradient
from .seed_streams import covered, generators

# sparse_input's solve: the LAPACK routine _cho_solve_lower calls for float64 input, looked up once
_POTRS, = scipy.linalg.get_lapack_funcs(("potrs",), (np.zeros((1, 1)),))


def _draw_gaussian(rng, V, D, params):
    return rng.standard_normal((V, D)), rng.standard_normal((D, D))


def _draw_dense_output(rng, V, D, params):
    h = rng.standard_normal((params.batch, D))
    return h, _zipf_ids(V, params.batch, params.zipf_exponent, rng)


def _draw_sparse_input(rng, V, D, params):
    ids = _zipf_ids(V, params.batch, params.zipf_exponent, rng)
    return ids, rng.standard_normal((params.batch, D))


# each model's draws, in the order and amounts its gradients.py form takes them
DRAWS = {"gaussian": _draw_gaussian, "dense_output": _draw_dense_output, "sparse_input": _draw_sparse_input}


def _transpose(A):
    return A.transpose(0, 2, 1)


def _factor_gradient(GT, L):
    # gradients._factor_gradient on a stack
    return (GT + _transpose(GT)) @ L


def _gaussian(Z, L, draws, cells):
    V, D = Z.shape[1:]
    return (np.stack([d[0] for d in draws]) / math.sqrt(V * D),
            np.stack([d[1] for d in draws]) / math.sqrt(D * D))


def _dense_output(Z, L, draws, cells):
    batch = cells[0][2].batch  # one batch size to a group
    h = np.stack([d[0] for d in draws])
    targets = np.stack([d[1] for d in draws])
    hT = (h @ L) @ _transpose(L)
    logit = hT @ _transpose(Z)
    logit -= logit.max(axis=2, keepdims=True)
    prob = np.exp(logit)
    prob /= prob.sum(axis=2, keepdims=True)
    prob[np.arange(len(cells))[:, None], np.arange(batch), targets] -= 1.0
    dlogit = prob / batch
    GZ = _transpose(dlogit) @ hT
    GT = _transpose(h) @ (dlogit @ Z)
    return GZ, _factor_gradient(GT, L)


def _sparse_input(Z, L, draws, cells):
    D = Z.shape[2]
    ids = np.stack([d[0] for d in draws])
    upstream = np.stack([d[1] for d in draws]) / math.sqrt(D)
    # the two solves per cell, as _cho_solve_lower makes them (its checks were passed when the cell drew)
    Tinv_g = np.empty_like(upstream)
    e = np.empty_like(upstream)
    for j in range(len(cells)):
        Tinv_g[j] = _POTRS(L[j], upstream[j].T, lower=True, overwrite_b=False)[0].T
        e[j] = _POTRS(L[j], Z[j][ids[j]].T, lower=True, overwrite_b=False)[0].T
    GZ = np.zeros_like(Z)
    np.add.at(GZ, (np.arange(len(cells))[:, None], ids), Tinv_g)
    GT = _transpose(-Tinv_g) @ e
    scale = np.array([c[2].input_scale for c in cells], dtype=np.float64)[:, None, None]
    return scale * GZ, scale * _factor_gradient(0.5 * (GT + _transpose(GT)), L)


STACKED = {"gaussian": _gaussian, "dense_output": _dense_output, "sparse_input": _sparse_input}


def _solvable(names, draws, finite_rows, finite_factor) -> bool:
    """sparse_input's solves take this cell's input without refusing it (cho_solve raises on a non-finite
    factor or drawn row: such a cell goes to gradient(), which raises as it always did)."""
    if "sparse_input" not in names:
        return True
    ids = draws[names.index("sparse_input")][0]
    return bool(finite_factor) and bool(finite_rows[ids].all())


def stacked_gradients(cells: list[tuple[list[str], int, AdversaryParams]], Z: np.ndarray, L: np.ndarray,
                      step: int) -> tuple[np.ndarray, np.ndarray]:
    """Every cell's `gradient(names, Z[k], L[k], seed, step, params)` for cells[k] = (names, seed, params),
    stacked: GZ (K x V x D) and GL (K x D x D), the same bytes."""
    K = len(cells)
    GZ = np.zeros_like(Z)
    GL = np.zeros_like(L)
    # the stack's matmuls see each cell as gradient() sees Z[k]: float64 and C-contiguous (what
    # StackedPit.stored gives); other input, and an empty table, go cell by cell
    stackable = (Z.dtype == L.dtype == np.float64 and Z.flags.c_contiguous and L.flags.c_contiguous
                 and Z.ndim == 3 and Z.shape[1] > 0 and Z.shape[2] > 0)
    if stackable:
        V, D = Z.shape[1:]
        solving = any("sparse_input" in names for names, _, _ in cells)
        finite_rows = np.isfinite(Z).all(axis=2) if solving else None
        finite_factors = np.isfinite(L).all(axis=(1, 2)) if solving else None
    drawn = {k for k, (names, seed, _) in enumerate(cells)
             if stackable and all(n in DRAWS for n in names) and covered((seed, step, len(names)))}
    # each drawn cell's draws by stream: kept by an earlier batch (draw_memo), or drawn here, the streams not
    # kept built at once, each its own default_rng([seed, step, index])
    keys = {(k, index): (name, cells[k][1], step, index, V, D, cells[k][2])
            for k in sorted(drawn) for index, name in enumerate(cells[k][0])}
    kept = {ki: MEMO.get(key) for ki, key in keys.items()}
    missing = [ki for ki, draws_kept in kept.items() if draws_kept is None]
    streams = dict(zip(missing, generators([(cells[k][1], step, index) for k, index in missing])))

    def drawn_by(k: int, index: int, name: str, params: AdversaryParams) -> tuple:
        if kept[k, index] is not None:
            return kept[k, index]
        made = DRAWS[name](streams[k, index], V, D, params)
        MEMO.put(keys[k, index], made)
        return made

    groups: dict[tuple, list[int]] = {}
    draws: list = [None] * K
    # in cell order, as the loop over gradient() went: the draws, and the cells computed alone (whose
    # error, if one raises, is the one that loop raised first)
    for k, (names, seed, params) in enumerate(cells):
        names = list(names)
        if k in drawn:
            draws[k] = [drawn_by(k, index, n, params) for index, n in enumerate(names)]
            if not solving or _solvable(names, draws[k], finite_rows[k], finite_factors[k]):
                groups.setdefault((tuple(names), params.batch), []).append(k)
                continue
        GZ[k], GL[k] = gradient(names, Z[k], L[k], seed, step, params)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        for (names, _), ks in groups.items():
            gz_sum, gl_sum = np.zeros((len(ks),) + Z.shape[1:]), np.zeros((len(ks),) + L.shape[1:])
            sub_Z, sub_L = Z[ks], L[ks]
            group_cells = [cells[k] for k in ks]
            for index, name in enumerate(names):
                gz, gl = STACKED[name](sub_Z, sub_L, [draws[k][index] for k in ks], group_cells)
                gz_sum += gz
                gl_sum += gl
            GZ[ks], GL[ks] = gz_sum, gl_sum
    return GZ, GL
