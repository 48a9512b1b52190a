"""The reference vocabulary-parallel PIT (pitcheck.nn_sharded) against the single-process pitcheck.nn.PIT,
and the sharding bugs of tests/sharded_zoo, each caught by a sharded metric. 4 gloo ranks spawned once
for the module; 2-rank cases run on the subgroup of ranks 0 and 1.

Bounds: embed is the same computation as the single-process one on the rank's rows, and the all-reduce
adds exact zeros, so embed is tested for equality within 2 D u (it is bitwise equal here). A logits
slice is a GEMM over D with a column block of Z^T: each entry within gamma_D of the exact one on either
side, |difference| <= 2 D u (|h T| |Z|^T). Three SGD steps with cholqr2: each step's difference is the
retraction's (tests/model/sharded/test_sharded.py's bound_u) plus the gradient's sums in another order (V u per step),
so the trajectories are tested within 3 (bound_u + 2 V) u.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from pitcheck import nn
from pitcheck.model.nn_sharded import ShardedPIT, gather_logits, make_sharded
from pitcheck.model.sharded import ShardedPool, orthonormality, pit_pinv_drift, replica_spread, shard_distance
from tests.sharded_zoo import copy_padding, floor_slices, local_retraction, unsynced_grad
from tests.model.sharded.test_sharded import bound_u

D = 8
DTYPES = {"fp64": torch.float64, "fp32": torch.float32}
_GROUPS: dict[int, object] = {}


def _group(world: int):
    if world == dist.get_world_size():
        return None, dist.get_rank()
    if world not in _GROUPS:
        _GROUPS[world] = dist.new_group(list(range(world)))
    return (_GROUPS[world], dist.get_rank()) if dist.get_rank() < world else (False, None)


def _batch(V: int, dtype, seed: int = 11, B: int = 12):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (B,), generator=gen)
    h0 = torch.randn(B, D, generator=gen, dtype=torch.float64).to(dtype)
    targets = torch.randint(0, V, (B,), generator=gen)
    return ids, h0, targets


def _loss(model, ids, h0, targets, sharded: bool, group=None):
    """One global loss of the assembled maps, the same on every rank (the training contract)."""
    e = model.embed(ids)
    z = model.logits(e + h0)
    logits = gather_logits(z, group) if sharded else z
    return F.cross_entropy(logits, targets) + 0.1 * (e ** 2).sum()


def _train(model, V, dtype, steps, sharded, group=None):
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(steps):
        ids, h0, targets = _batch(V, dtype, seed=100 + step)
        opt.zero_grad()
        _loss(model, ids, h0, targets, sharded, group).backward()
        opt.step()
        model.post_step()


# ---- run on the ranks ------------------------------------------------------------------------------------
def _maps_case(world, V, dtype_name, pad_multiple=None):
    group, rank = _group(world)
    if group is False:
        return None
    dtype = DTYPES[dtype_name]
    u = torch.finfo(dtype).eps / 2
    m = ShardedPIT(V, D, rank=rank, world_size=world, dtype=dtype, group=group, pad_multiple=pad_multiple)
    single = nn.make(V, D, dtype=dtype, retraction="cholqr2")
    with torch.no_grad():  # a non-trivial T, the same on both
        L_raw = torch.tril(0.3 * torch.randn(D, D, generator=torch.Generator().manual_seed(5), dtype=torch.float64))
        m.L_raw.copy_(L_raw)
        single.L_raw.copy_(L_raw)
    ids = torch.arange(V)
    E, E1 = m.embed(ids).detach(), single.embed(ids).detach()
    h = torch.randn(5, D, generator=torch.Generator().manual_seed(6), dtype=torch.float64).to(dtype)
    start, stop = m.vocab_range()
    z_slice = m.logits(h).detach()
    z = gather_logits(z_slice, group).detach()
    z1 = single.logits(h).detach()
    T = (single.L @ single.L.T).detach().double()
    scale = (h.double() @ T).abs() @ single.Z.detach().double().abs().T
    ranges = [torch.zeros(2, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(ranges, torch.tensor([start, stop]), group=group)
    return {"embed_rel": float(torch.linalg.norm(E.double() - E1.double()) / torch.linalg.norm(E1.double())) / u,
            "embed_equal": bool(torch.equal(E, E1)),
            "logits_rel": float(((z.double() - z1.double()).abs() / scale).max()) / u,
            "slice_width": z_slice.shape[-1], "stored_rows": m.Z.shape[0],
            "ranges": [tuple(int(x) for x in r) for r in ranges],
            "Z_equal": bool(torch.equal(m.Z.detach()[:stop - start], single.Z.detach()[start:stop])),
            "pinv_drift": pit_pinv_drift(m.Z.detach()[:stop - start], m.L.detach(), E[start:stop], group)}


def _training_case(world, V, dtype_name, steps=3):
    group, rank = _group(world)
    if group is False:
        return None
    dtype = DTYPES[dtype_name]
    m = ShardedPIT(V, D, rank=rank, world_size=world, dtype=dtype, group=group)
    single = nn.make(V, D, dtype=dtype, retraction="cholqr2")
    _train(m, V, dtype, steps, sharded=True, group=group)
    _train(single, V, dtype, steps, sharded=False)
    start, stop = m.vocab_range()
    return {"Z_u": shard_distance(m.Z.detach(), single.Z.detach()[start:stop], group=group),
            # L is replicated: its distance is each rank's own (no collective)
            "L_u": float(torch.linalg.norm(m.L.detach() - single.L.detach()) / torch.linalg.norm(single.L.detach()))
            / (torch.finfo(dtype).eps / 2),
            "spread": replica_spread(m.L_raw.detach(), group),
            "orthonormality": orthonormality(m.Z.detach(), group)}


ZOO = {"reference": make_sharded, "local_retraction": local_retraction.make, "unsynced_grad": unsynced_grad.make,
       "copy_padding": copy_padding.make, "floor_slices": floor_slices.make}


def _zoo_case(name, V, steps):
    """The sharded metrics of a module from the zoo after `steps` training steps, using only the shard
    contract (vocab_range, the stored rows, the maps) and the single-process run for shard_distance."""
    rank, world = dist.get_rank(), dist.get_world_size()
    m = ZOO[name](V, D, dtype=torch.float64, rank=rank, world_size=world)
    single = nn.make(V, D, dtype=torch.float64, retraction="cholqr2")
    _train(m, V, torch.float64, steps, sharded=True)
    _train(single, V, torch.float64, steps, sharded=False)
    start, stop = m.vocab_range()
    real = m.Z.detach()[:stop - start]
    ranges = [torch.zeros(2, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(ranges, torch.tensor([start, stop]))
    ranges = [tuple(int(x) for x in r) for r in ranges]
    return {"orthonormality": orthonormality(real),
            "shard_distance": shard_distance(real, single.Z.detach()[start:stop]),
            "replica_spread": replica_spread(m.L_raw.detach()),
            "tiles": [r for r in ranges if r[1] > r[0]] == _tiling(ranges, V)}


def _tiling(ranges, V):
    """The ranges as they should be: contiguous, in rank order, covering 0..V exactly once."""
    out, at = [], 0
    for start, stop in ranges:
        if stop > start:
            out.append((at, at + stop - start))
            at += stop - start
    return out if at == V else None


@pytest.fixture(scope="module")
def pool():
    with ShardedPool(4, timeout=120) as p:
        yield p


# ---- tests -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("world,V", [(2, 67), (4, 67)])
@pytest.mark.parametrize("dtype_name", ["fp64", "fp32"])
def test_assembled_maps_equal_the_unsharded_module(pool, world, V, dtype_name):
    r = [x for x in pool.run(_maps_case, world, V, dtype_name) if x is not None]
    print(f"\nn={world} {dtype_name}: embed {r[0]['embed_rel']:.2f} u (bitwise equal: {r[0]['embed_equal']}), "
          f"logits max {max(x['logits_rel'] for x in r):.2f} u of |hT||Z|^T")
    assert all(x["Z_equal"] for x in r)  # the same seed gives the same rows of Z as pitcheck.nn.make
    assert all(x["embed_rel"] <= 2 * D for x in r)
    assert all(x["logits_rel"] <= 2 * D for x in r)
    assert r[0]["ranges"][0][0] == 0 and r[0]["ranges"][-1][1] == V
    assert all(a[1] == b[0] for a, b in zip(r[0]["ranges"], r[0]["ranges"][1:]))
    assert [x["slice_width"] for x in r] == [b - a for a, b in r[0]["ranges"]]
    u = torch.finfo(DTYPES[dtype_name]).eps / 2
    assert len({x["pinv_drift"] for x in r}) == 1 and r[0]["pinv_drift"] < 100 * D * u


def test_zero_padding_is_invisible_to_the_maps(pool):
    """V = 67 padded to 128 over 4 ranks: 32 stored rows each, the last rank 3 real ones; the logits
    slices still tile 0..67 and the maps equal the unpadded module's."""
    r = pool.run(_maps_case, 4, 67, "fp64", pad_multiple=16)
    assert [x["stored_rows"] for x in r] == [32, 32, 32, 32]
    assert [x["slice_width"] for x in r] == [32, 32, 3, 0]
    assert all(x["embed_equal"] and x["Z_equal"] for x in r)
    assert max(x["logits_rel"] for x in r) <= 2 * D


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("dtype_name", ["fp64", "fp32"])
def test_training_matches_the_unsharded_module(pool, world, dtype_name):
    """Three SGD steps with cholqr2: Z within 3 (bound_u + 2V) u of the single-process run, T's replicas
    exactly equal (its gradient is all-reduced)."""
    V = 67
    r = [x for x in pool.run(_training_case, world, V, dtype_name) if x is not None]
    print(f"\nn={world} {dtype_name} after 3 steps: Z {r[0]['Z_u']:.2f} u, L {max(x['L_u'] for x in r):.2f} u, "
          f"replica_spread {r[0]['spread']}")
    limit = 3 * (bound_u("cholqr2", V) + 2 * V)
    assert r[0]["Z_u"] <= limit and max(x["L_u"] for x in r) <= limit
    assert all(x["spread"] == 0.0 for x in r)
    assert r[0]["orthonormality"] < 30 * D * torch.finfo(DTYPES[dtype_name]).eps


def test_each_sharding_bug_is_caught_by_a_sharded_metric(pool):
    V, n = 66, 4  # 66 = 17 + 17 + 17 + 15; floor slices cover 64; copy padding stores 128 rows
    u = 2.0 ** -53
    ok_orth, ok_dist = 30 * D * 2 * u, 3 * (bound_u("cholqr2", V) + 2 * V)
    results = {name: pool.run(_zoo_case, name, V, 1)[0] for name in ZOO}
    results["floor_slices@init"] = pool.run(_zoo_case, "floor_slices", V, 0)[0]
    print("\n" + "\n".join(f"{k:>18}: orthonormality {v['orthonormality']:.3g}, shard_distance "
                           f"{v['shard_distance']:.3g} u, replica_spread {v['replica_spread']:.3g}, "
                           f"tiles {v['tiles']}" for k, v in results.items()))
    ref = results["reference"]
    assert ref["orthonormality"] < ok_orth and ref["shard_distance"] < ok_dist and ref["replica_spread"] == 0.0
    assert ref["tiles"]
    # each rank orthonormalises its own slice: Z^T Z = n I
    assert results["local_retraction"]["orthonormality"] == pytest.approx(math.sqrt(D) * (n - 1), rel=1e-9)
    # T's gradient not all-reduced: the replicas differ after one step
    assert results["unsynced_grad"]["replica_spread"] > 1e-6
    # copies of real rows mixed into the retraction: the real rows are no longer orthonormal
    assert results["copy_padding"]["orthonormality"] > 1e-3 and results["copy_padding"]["shard_distance"] > 1e6
    # floor slices: rows missing from the Gram at init, the covered rows retracted alone after a step
    assert results["floor_slices@init"]["orthonormality"] > 1e-3
    assert results["floor_slices"]["shard_distance"] > 1e6
    assert not results["floor_slices"]["tiles"]


def _single_rank_errors():
    rank, world = dist.get_rank(), dist.get_world_size()
    out = []
    for kwargs in ({"rank": (rank + 1) % world, "world_size": world}, {"rank": rank, "world_size": world + 1}):
        try:
            make_sharded(40, D, **kwargs)
            out.append("built")
        except ValueError as exc:
            out.append(str(exc))
    m = make_sharded(40, D, rank=rank, world_size=world)
    try:
        m.embed(torch.tensor([40]))
        out.append("embedded")
    except IndexError as exc:
        out.append(str(exc))
    return out


def test_contract_errors_are_clear(pool):
    for messages in pool.run(_single_rank_errors):
        assert "process group" in messages[0] and "process group" in messages[1]
        assert "out of range" in messages[2]


def test_one_process_without_a_group_is_the_unsharded_module():
    m = make_sharded(40, D, rank=0, world_size=1, dtype=torch.float64)
    single = nn.make(40, D, dtype=torch.float64, retraction="cholqr2")
    ids = torch.arange(40)
    assert torch.equal(m.Z.detach(), single.Z.detach())
    assert torch.equal(m.embed(ids), single.embed(ids))
    with pytest.raises(ValueError, match="retraction"):
        make_sharded(40, D, rank=0, world_size=1, retraction="landing")
    with pytest.raises(ValueError, match="vocab_size"):
        make_sharded(4, D, rank=0, world_size=1)


def test_bfloat16_module_runs_with_float32_masters():
    m = make_sharded(40, D, rank=0, world_size=1, dtype=torch.bfloat16)
    assert m.Z.dtype == torch.float32 and m.embed(torch.arange(5)).dtype == torch.bfloat16
    assert m.logits(torch.randn(2, D, dtype=torch.bfloat16)).dtype == torch.bfloat16
