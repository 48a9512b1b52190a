"""A sharded run's row of metrics, computed on the shards: every sum over the vocabulary is an all-reduce
(pitcheck.model.sharded.metrics), Z is never gathered. Same meaning as the single-process row where measured;
the sampled-row solve errors and the Penrose residuals need rows or factorisations of the whole E and
are not computed on shards (NaN by design, SHARD_UNMEASURED).

Beside them: shard_distance_Z and shard_distance_T, the relative distance of the sharded Z and T from the
single-process run in the same precision on the same gradients, in units of the policy's u; and
replica_spread, max over ranks of ||L_r - L_0||_F (exactly 0 while L's gradient is all-reduced).
"""
from __future__ import annotations

import numpy as np

from ..numerics.metrics import cholesky_conditioning

SHARD_UNMEASURED = ("trisolve_forward", "trisolve_forward_ratio", "trisolve_backward", "trisolve_backward_ratio",
                    "penrose", "penrose_1", "penrose_2", "penrose_3", "penrose_4", "pinv_error")


def _T(L: np.ndarray) -> np.ndarray:
    return L @ L.T


def measure_on_shards(model, reference: dict) -> dict:
    """model: the rank's RankModel; reference: {'single': (Z, L), 'shadow': (Z, L) or None}, float64."""
    import torch
    import torch.distributed as dist

    from ..numerics.formats import FORMATS
    from ..model.sharded import orthonormality, orthonormality_ratio, pit_pinv_drift, relative_distance, replica_spread
    from ..model.sharded import scatter_rows

    p, rank = model.policy, dist.get_rank()
    Z, L = model.Z, model.L
    L64 = model.arrays.numpy(L)
    row = {"orthonormality": orthonormality(Z),
           "orthonormality_ratio": orthonormality_ratio(Z, p.u, model.layout.vocab_size)}
    row.update(cholesky_conditioning(L64, FORMATS[p.factor].u))
    row["pinv_drift"] = pit_pinv_drift(Z, L, model.embedding_rows())
    row.update({k: float("nan") for k in SHARD_UNMEASURED})
    T = _T(L64)
    for name, columns in (("single", ("shard_distance_Z", "shard_distance_T")), ("shadow", ("shadow_Z", "shadow_T"))):
        if reference.get(name) is None:
            row.update({k: float("nan") for k in columns})
            continue
        Zr, Lr = reference[name]
        Zr_block = torch.from_numpy(scatter_rows(Zr, model.layout, rank))
        Tr = _T(Lr)
        dz = relative_distance(Z, Zr_block)
        dt = float(np.linalg.norm(T - Tr) / np.linalg.norm(Tr))
        scale = p.u if name == "single" else 1.0  # the shard distances in u, the shadow's as the single run's
        row[columns[0]], row[columns[1]] = dz / scale, dt / scale
    row["replica_spread"] = replica_spread(L)
    return row
