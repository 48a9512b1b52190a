"""Distributed retractions, sharded metrics and the launcher, on 2 and 4 gloo ranks on the CPU.

One pool of 4 ranks is spawned for the module (spawning costs seconds); 2-rank cases run on a subgroup
of ranks 0 and 1. The launcher's failure tests use their own short-lived 2-rank pools.

The bound tested for sharded vs single-process (relative Frobenius distance, in units of u):
a Gram all-reduce sums the same V products in another order; either order is within gamma_V |Y|^T|Y|
of the exact Gram elementwise, so the two computed Grams differ by at most 2 gamma_V ||Y||_F^2 = 2 V u D
in Frobenius norm (||Y||_F^2 = D near the manifold). With cond(Y) ~ 1 a Gram perturbation dG moves the
result by about ||dG||_F, i.e. relatively by ||dG||_F / sqrt(D) <= 2 V sqrt(D) u; the local apply's row
dot products (length D) may be blocked differently, 2 D u more. Each all-reduced Gram a retraction uses
in sequence adds one such term: bound_u = passes * 2 (V sqrt(D) + D). TSQR against Householder QR: each
is within sqrt(D) gamma_{VD} of the exact Q of a matrix within gamma_{VD} of Y (Higham, Thm 19.4), so
for cond(Y) ~ 1 the two differ relatively by about 4 V D u; `polar` adds the SVD of R (8 V D u).
These are worst-case bounds; the measured distances are printed (run with -s) and are a few u.
"""
from __future__ import annotations

import math
import os
import time

import pytest
import torch
import torch.distributed as dist

from pitcheck.numerics.arrays import TorchOps
from pitcheck.infra.errors import PitcheckError
from pitcheck.model.retractions import get_retraction, tangent_projection as single_tangent_projection
from pitcheck.model.sharded import (ShardedPool, ShardedRunError, get_sharded_retraction, launch, orthonormality,
                              pinv_drift, relative_distance, replica_spread, scatter_rows, shard_distance,
                              shard_layout)
from pitcheck.model.sharded.comm import assemble_rows

D = 8
GRAM_PASSES = {"cholqr": 1, "cholqr2": 2, "polar-gram": 1, "cayley": 3,
               # Newton-Schulz from a step of 1e-2 stops after about 5 Grams; 8 leaves room
               "polar-ns": 8,
               # 5 Grams, each later step amplifying an earlier error by at most max|p'| = a = 3.4445
               "ns5": sum(3.4445 ** k for k in range(5))}
TSQR_FACTOR = {"qr": 4, "polar": 8}
RETRACTIONS = sorted(GRAM_PASSES) + sorted(TSQR_FACTOR)
DTYPES = {"fp64": torch.float64, "fp32": torch.float32}


def bound_u(name: str, V: int) -> float:
    if name in TSQR_FACTOR:
        return TSQR_FACTOR[name] * V * D
    return GRAM_PASSES[name] * 2 * (V * math.sqrt(D) + D)


# ---- run on the ranks ------------------------------------------------------------------------------
_GROUPS: dict[int, object] = {}


def _group(world: int):
    """The default group for 4 ranks, a cached subgroup of ranks 0, 1 for 2; None outside it."""
    if world == dist.get_world_size():
        return dist.group.WORLD, dist.get_rank(), world
    if world not in _GROUPS:  # every rank must take part in creating a group
        _GROUPS[world] = dist.new_group(list(range(world)))
    if dist.get_rank() >= world:
        return None, None, world
    return _GROUPS[world], dist.get_rank(), world


def _inputs(V: int, dtype, seed: int = 7):
    """Z on the manifold (float64 QR of a Gaussian) and a tangent step of size 1e-2, cast to dtype."""
    gen = torch.Generator().manual_seed(seed)
    g = torch.randn(V, D, generator=gen, dtype=torch.float64)
    Z = get_retraction("qr")(g, torch.zeros_like(g), TorchOps())
    step = 1e-2 * torch.randn(V, D, generator=gen, dtype=torch.float64) / math.sqrt(V)
    xi = single_tangent_projection(Z, step, TorchOps())
    return Z.to(dtype), xi.to(dtype)


def _retraction_case(world, V, name, dtype_name, pad_multiple=None, allreduce=None):
    group, rank, n = _group(world)
    if group is None:
        return None
    dtype = DTYPES[dtype_name]
    Z, xi = _inputs(V, dtype)
    single = get_retraction(name)(Z, xi, TorchOps())
    layout = shard_layout(V, n, pad_multiple)
    Zl, xil = scatter_rows(Z, layout, rank), scatter_rows(xi, layout, rank)
    out = get_sharded_retraction(name)(Zl, xil, group=group, allreduce_dtype=allreduce)
    real = layout.real_rows(rank)
    return {"distance_u": shard_distance(out, scatter_rows(single, layout, rank), group=group),
            "orthonormality": orthonormality(out, group),
            "single_orthonormality": float(torch.linalg.norm(single.double().T @ single.double() - torch.eye(D,
                                                             dtype=torch.float64))),
            "padding_max": float(out[real:].abs().max()) if out.shape[0] > real else 0.0,
            "rows": out.shape[0]}


@pytest.fixture(scope="module")
def pool():
    with ShardedPool(4, timeout=120) as p:
        yield p


def _case(pool, *args, **kwargs):
    results = [r for r in pool.run(_retraction_case, *args, **kwargs) if r is not None]
    # every rank computes the metric from the same all-reduced sums: one value
    assert len({r["distance_u"] for r in results}) == 1
    assert len({r["orthonormality"] for r in results}) == 1
    return results


# ---- tests -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("world,V", [(2, 65), (4, 257)])
@pytest.mark.parametrize("dtype_name", ["fp64", "fp32"])
def test_sharded_matches_single_process(pool, world, V, dtype_name):
    """Every distributed retraction equals the single-process one within bound_u (uneven last slice:
    65 = 33 + 32 over 2 ranks, 257 = 65 * 3 + 62 over 4)."""
    lines = []
    for name in RETRACTIONS:
        r = _case(pool, world, V, name, dtype_name)[0]
        lines.append(f"{name:>10} {dtype_name} n={world} V={V}: shard_distance {r['distance_u']:.2f} u "
                     f"(bound {bound_u(name, V):.0f} u)")
        assert r["distance_u"] <= bound_u(name, V), lines[-1]
        # the sharded result is as orthonormal as the single-process one (ns5 is not, by design, either)
        assert r["orthonormality"] <= r["single_orthonormality"] + bound_u(name, V) * torch.finfo(
            DTYPES[dtype_name]).eps, lines[-1]
    print("\n" + "\n".join(lines))


@pytest.mark.parametrize("name", RETRACTIONS)
def test_tiny_uneven_slices_with_an_empty_rank(pool, name):
    """V = 11 over 4 ranks: slices 3, 3, 3, 2; V = 9: 3, 3, 3 and an empty last rank (TSQR's stack then
    has 9 rows; a Gram of zero rows is zero)."""
    for V in (11, 9):
        r = _case(pool, 4, V, name, "fp64")[0]
        assert r["distance_u"] <= bound_u(name, V), (name, V, r)


@pytest.mark.parametrize("name", RETRACTIONS)
def test_zero_padding_is_harmless(pool, name):
    """V = 100 padded to a multiple of 16 * 4 = 128 (slices of 32; the last rank 4 real rows, 28 zero):
    the padding rows stay zero and the real rows match the unpadded single-process result."""
    results = _case(pool, 4, 100, name, "fp64", pad_multiple=16)
    assert [r["rows"] for r in results] == [32, 32, 32, 32]
    r = results[0]
    assert r["distance_u"] <= bound_u(name, 100), r
    assert max(x["padding_max"] for x in results) <= (0.0 if name in GRAM_PASSES else 1e-14), results


def _bf16_cost(world, V):
    group, rank, n = _group(world)
    if group is None:
        return None
    Z, xi = _inputs(V, torch.float32)
    layout = shard_layout(V, n)
    Zl, xil = scatter_rows(Z, layout, rank), scatter_rows(xi, layout, rank)
    retract = get_sharded_retraction("cholqr2")
    return {name: orthonormality(retract(Zl, xil, group=group, allreduce_dtype=name), group)
            for name in ("fp64", "fp32", "bf16")}


def test_bf16_allreduce_shows_its_cost(pool):
    """cholqr2 on fp32 data with its Grams all-reduced in bf16: the Gram's entries carry bf16's u = 2^-8,
    and the second pass cannot remove an error in its own Gram, so Z^T Z - I is of order u_bf16 (about
    sqrt(D) * D * 2^-8 at most) instead of fp32's O(u) level."""
    r = pool.run(_bf16_cost, 4, 257)[0]
    print(f"\ncholqr2 fp32 data, 4 ranks, V=257: orthonormality after one retraction "
          f"fp64 all-reduce {r['fp64']:.3g}, fp32 {r['fp32']:.3g}, bf16 {r['bf16']:.3g}")
    u32, u16 = 2.0 ** -24, 2.0 ** -8
    assert r["fp64"] < 30 * D * u32 and r["fp32"] < 30 * D * u32
    assert r["bf16"] > 100 * r["fp32"]
    assert u16 / 30 < r["bf16"] < math.sqrt(D) * D * u16


def _metrics_case(world, V):
    group, rank, n = _group(world)
    if group is None:
        return None
    gen = torch.Generator().manual_seed(3)
    Z = torch.randn(V, D, generator=gen, dtype=torch.float64)  # far from orthonormal: a real test
    Lfull = torch.tril(torch.randn(D, D, generator=gen, dtype=torch.float64)) + 3 * torch.eye(D, dtype=torch.float64)
    T = Lfull @ Lfull.T
    E = torch.linalg.solve(T, Z.T).T  # E = Z T^{-1}
    E = E + 1e-3 * torch.randn(V, D, generator=gen, dtype=torch.float64)
    layout = shard_layout(V, n)
    Zl, El = scatter_rows(Z, layout, rank), scatter_rows(E, layout, rank)
    from pitcheck.numerics import metrics as single

    return {"orth": (orthonormality(Zl, group), single.orthonormality_loss(Z.numpy())),
            "drift": (pinv_drift(El, Zl @ T, group), single.pinv_drift(E.numpy(), (Z @ T).numpy())),
            "dist": (relative_distance(El, Zl, group), float(torch.linalg.norm(E - Z) / torch.linalg.norm(Z))),
            "gathered": bool(torch.equal(assemble_rows(Zl, group), Z)),
            # a relative move of 2^-20 in float32 is 16 units of u = 2^-24 (not 8 units of eps = 2^-23)
            "dist_u": shard_distance(Zl.float() * (1 + 2.0**-20), Zl.float(), group=group)}


@pytest.mark.parametrize("world", [2, 4])
def test_sharded_metrics_equal_single_process_metrics(pool, world):
    r = pool.run(_metrics_case, world, 67)[0]
    for key in ("orth", "drift", "dist"):
        sharded, single = r[key]
        assert sharded == pytest.approx(single, rel=1e-12), key
    assert r["gathered"]
    assert r["dist_u"] == pytest.approx(16.0, rel=1e-3)


def _spread_case(world, perturb_rank):
    group, rank, n = _group(world)
    if group is None:
        return None
    T = torch.eye(D, dtype=torch.float32) * 1.5
    if rank == perturb_rank:
        T[2, 3] += 1e-7
    return replica_spread(T, group)


def test_replica_spread_is_exactly_zero_for_equal_replicas(pool):
    assert pool.run(_spread_case, 4, -1) == [0.0] * 4
    spreads = pool.run(_spread_case, 4, 3)
    assert spreads == [spreads[0]] * 4 and spreads[0] == pytest.approx(1e-7, rel=0.1)


def _bad_metric_input(world):
    group, rank, n = _group(world)
    if group is None:
        return None
    Z = torch.zeros(5, D, dtype=torch.float64)
    if rank == 1:
        Z[0, 0] = float("nan")
    try:
        orthonormality(Z, group)
    except PitcheckError as exc:
        return str(exc)
    return "no error"


def test_non_finite_block_on_one_rank_is_an_error_on_every_rank(pool):
    """One rank's NaN makes every rank raise (no rank left waiting in a collective)."""
    messages = pool.run(_bad_metric_input, 4)
    assert all("non-finite" in m for m in messages), messages


def test_bad_arguments_are_one_line_errors():
    with pytest.raises(PitcheckError, match="pad_multiple"):
        shard_layout(10, 2, 0)
    with pytest.raises(PitcheckError, match="world_size"):
        shard_layout(10, 0)
    with pytest.raises(PitcheckError, match="allreduce dtype"):
        get_sharded_retraction("cholqr")(torch.eye(3), torch.zeros(3, 3), allreduce_dtype="fp8")
    with pytest.raises(PitcheckError, match="distributed retraction"):
        get_sharded_retraction("landing")
    with pytest.raises(PitcheckError, match="rank"):
        shard_layout(10, 2).slice(2)
    with pytest.raises(PitcheckError, match="timeout"):
        ShardedPool(2, timeout=0)


@pytest.mark.parametrize("gpus", [0, 1, 2])
def test_nccl_with_fewer_gpus_than_ranks_is_refused_before_any_rank_starts(monkeypatch, gpus):
    # NCCL's own error ("Duplicate GPU detected") comes only at the first collective, from inside a rank
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    started = []
    monkeypatch.setattr("torch.multiprocessing.get_context", lambda *a: started.append(a) or pytest.fail("spawned"))
    with pytest.raises(PitcheckError, match=f"one GPU per rank.*{'3 ranks' if gpus else 'no CUDA device'}"):
        ShardedPool(3, backend="nccl")
    assert started == []


def test_no_process_group_outside_torchrun_is_a_clear_error(monkeypatch):
    from pitcheck.model.sharded import ensure_process_group

    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(PitcheckError, match="torchrun"):
        ensure_process_group()


def test_layout_tiles_the_vocabulary():
    for V, n, m in [(257, 4, None), (9, 4, None), (100, 4, 16), (128, 4, 16), (5, 3, 1)]:
        layout = shard_layout(V, n, m)
        ranges = [layout.vocab_range(r) for r in range(n)]
        assert ranges[0][0] == 0 and ranges[-1][1] == V
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
        assert sum(layout.local_rows(r) for r in range(n)) == layout.padded_size
        if m:
            assert layout.padded_size % (m * n) == 0 and len({layout.local_rows(r) for r in range(n)}) == 1


def test_single_process_without_a_group_is_the_single_process_retraction():
    """No process group: the distributed code runs as one rank (the all-reduce is the identity)."""
    Z, xi = _inputs(40, torch.float64)
    for name in RETRACTIONS:
        single = get_retraction(name)(Z, xi, TorchOps())
        assert float(torch.linalg.norm(get_sharded_retraction(name)(Z, xi) - single)) <= 50 * 2.0 ** -53, name


# ---- the launcher: a rank that raises, dies or hangs ---------------------------------------------------
def _raise_on_rank_1():
    if dist.get_rank() == 1:
        raise ValueError("planted failure on rank 1")
    dist.all_reduce(torch.ones(1))  # rank 0 waits for rank 1, which never comes
    return "done"


def _die_on_rank_1():
    if dist.get_rank() == 1:
        os._exit(7)
    dist.all_reduce(torch.ones(1))
    return "done"


def _hang_on_rank_1():
    if dist.get_rank() == 1:
        time.sleep(600)
    dist.all_reduce(torch.ones(1))
    return "done"


def _pids(pool):
    return [p.pid for p in pool._procs]


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.parametrize("task,kind,words", [(_raise_on_rank_1, "raised", "ValueError"),
                                             (_die_on_rank_1, "died", "exit status 7"),
                                             (_hang_on_rank_1, "hung", "hung")])
def test_a_failing_rank_is_named_and_every_rank_is_killed(task, kind, words):
    limit = 4.0
    pool = ShardedPool(2, timeout=limit)
    pids = _pids(pool)
    start = time.monotonic()
    with pytest.raises(ShardedRunError, match=words) as info:
        pool.run(task)
    elapsed = time.monotonic() - start
    assert info.value.rank == 1 and info.value.kind == kind
    assert "rank 1" in str(info.value) and "\n" not in str(info.value)
    assert elapsed < limit + 8, elapsed  # within the time limit (plus killing), never waited out
    assert all(_gone(pid) for pid in pids)
    with pytest.raises(PitcheckError, match="closed"):
        pool.run(_raise_on_rank_1)


def _ranks():
    return dist.get_rank(), dist.get_world_size()


def test_launch_runs_once_and_returns_results_by_rank():
    assert launch(_ranks, 2, timeout=30) == [(0, 2), (1, 2)]
