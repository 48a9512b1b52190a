"""What each rank runs in a sharded validation: building its module, and the probes of the two checks that
only a sharded target has (`shards`, `replicas`). Every rank runs the same probe in step; rank 0 returns it
(the arrays are the assembled maps, the same on every rank).

A probe that raises on any rank is not caught here: the exception ends the rank's task, and the pool names
that rank (pitcheck.model.sharded.ShardedPool) instead of leaving its peers waiting in a collective.
"""
from __future__ import annotations

import inspect
import math

import numpy as np
import torch
import torch.distributed as dist

from ...model.sharded.comm import assemble_rows
from ...model.sharded.metrics import replica_spread
from ...infra.threads import set_torch_threads
from .dtypes import HALF
from .probes import Probe, adversary_loss, to_numpy
from .registry import CHECK_RECORDS
from .sharded import ShardedHarness
from .target import TargetError, load_factory
from .worker import probe_arguments

_FACTORIES: dict = {}
CONTRACT = ("make(vocab_size, hidden_size, *, dtype, device, seed, rank, world_size) returning a module with "
            "embed, logits and vocab_range")


def _factory(spec: str):
    if spec not in _FACTORIES:
        _FACTORIES[spec] = load_factory(spec)
    return _FACTORIES[spec]


def _device(request: dict) -> str:
    return f"cuda:{torch.cuda.current_device()}" if request["device"] == "cuda" else "cpu"


def build_harness(request: dict, dtype: str | None = None, seed: int | None = None) -> ShardedHarness:
    """This rank's module, from the factory named in request, in a ShardedHarness."""
    factory = _factory(request["target"])
    rank, size = dist.get_rank(), dist.get_world_size()
    dtype, seed, device = dtype or request["dtype"], request["seed"] if seed is None else seed, _device(request)
    module = factory(request["vocab"], request["dim"], dtype=getattr(torch, dtype), device=device, seed=seed,
                     rank=rank, world_size=size)
    missing = [m for m in ("embed", "logits", "vocab_range") if not callable(getattr(module, m, None))]
    if missing:
        raise TargetError(f"the factory returned {type(module).__name__} without {', '.join(missing)}: the shard "
                          f"contract is {CONTRACT}")
    if not isinstance(module, torch.nn.Module):
        raise TargetError(f"the factory returned {type(module).__name__}, not a torch.nn.Module")
    return ShardedHarness(module, request["vocab"], request["dim"], getattr(torch, dtype), device, seed)


def contract_problem(request: dict) -> str:
    """'' when the factory takes the shard contract's rank= and world_size=, else the one-line reason."""
    factory = _factory(request["target"])
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable: let the call show
        return ""
    names = {p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
    if any(p.kind == p.VAR_KEYWORD for p in params) or {"rank", "world_size"} <= names:
        return ""
    lacking = " and ".join(n for n in ("rank", "world_size") if n not in names)
    return f"{request['target']} takes no {lacking} argument: a sharded target's factory is {CONTRACT}"


def rank_build(request: dict) -> dict:
    """Start-up on every rank: threads and seed, the contract's signature, then one module: {'problem':
    the one-line reason it cannot be validated} or {'range': its vocab_range(), 'width': its logits'}."""
    if request["device"] != "cuda" and request.get("threads"):
        set_torch_threads(request["threads"])
    torch.manual_seed(request["seed"])
    problem = contract_problem(request)
    if problem:
        return {"problem": problem}
    h = build_harness(request)
    with torch.no_grad():
        width = int(h.module.logits(h.randn(1, h.dim).to(h.dtype)).shape[-1])
    return {"range": list(h.range), "width": width}


def rank_check(request: dict, name: str):
    """Check `name`'s probe on this rank's freshly built module; rank 0 returns the Probe, the others None."""
    torch.manual_seed(request["seed"])
    dtype = request["dtype"]

    def harness(dt=dtype, sd=None):
        return build_harness(request, dt, sd)

    def widest(half_only=False):
        if dtype == "float64" or (half_only and dtype not in HALF):
            return None
        return harness("float64")  # every rank builds it, or none: a failure is the rank's error

    probe = CHECK_RECORDS[name].probe(harness(), **probe_arguments(name, request, harness, widest))
    uneven = uneven_vocab(request["vocab"], dist.get_world_size())
    if name == "shards" and uneven != request["vocab"]:
        # slicing and padding bugs hide at a V that every layout divides (2048 on 2 ranks): judge a prime V too
        other = probe_shards(build_harness({**request, "vocab": uneven}))
        probe.facts["uneven"] = {"vocab": uneven, **other.facts}
        probe.arrays.update({f"uneven/{key}": array for key, array in other.arrays.items()})
    return probe if dist.get_rank() == 0 else None


def uneven_vocab(vocab: int, world_size: int) -> int:
    """The largest prime <= vocab above world_size (no number of ranks or padding multiple divides it), or
    vocab itself when there is none or it is prime."""
    for candidate in range(vocab, world_size, -1):
        if candidate > 1 and all(candidate % d for d in range(2, math.isqrt(candidate) + 1)):
            return candidate
    return vocab


# ---- the probes of the sharded checks ---------------------------------------------------------------------

def probe_shards(h: ShardedHarness, **_) -> Probe:
    """Each rank's vocabulary range, logits width and stored rows; then, where the memory has padding rows,
    the maps and a post_step from a generic state with the padding as stored and with it zeroed (padding
    is invisible when the two agree)."""
    out = Probe()
    hid = h.randn(2, h.dim).to(h.dtype)
    with torch.no_grad():
        width = int(h.module.logits(hid).shape[-1])
    rows = int(h.memory[1].shape[0]) if h.memory else -1
    every = [None] * h.world_size
    dist.all_gather_object(every, {"range": list(h.range), "width": width, "rows": rows})
    out.facts["ranks"] = every
    out.facts["memory"] = h.memory[0] if h.memory else None
    padding = h.padding()
    count = torch.tensor([0 if padding is None else padding.shape[0]], dtype=torch.int64, device=h.device)
    dist.all_reduce(count)
    out.facts["padding_rows"] = int(count.item())
    if not count.item():
        return out
    for _ in range(3):
        h.own_step(h.random_loss())
    snapshot = {k: v.detach().clone() for k, v in h.module.state_dict().items()}
    access = h.memory_access()
    anchors = access.anchors()
    out.facts["padding_norm"] = float(np.linalg.norm(to_numpy(assemble_rows(padding))))
    for label in ("as stored", "zeroed"):
        h.module.load_state_dict(snapshot)
        if label == "zeroed":
            with torch.no_grad():
                for x in (h.memory[1], *anchors):
                    x[h.real_rows:].zero_()
        out.add_state(label, *h.maps())
        h.post_step()
        out.arrays[f"R:{label}"] = access.read()
    return out


def probe_replicas(h: ShardedHarness, steps: int = 10, generic_cond: float = 10.0, **_) -> Probe:
    """The spread across ranks (max_r ||x_r - x_0||_F, exactly 0 when the replicas agree) of the
    embeddings and of every replicated parameter, relative to its size: at initialisation, after own
    steps on a generic loss, after T is driven to cond(T) = generic_cond, and after the adversaries' steps."""
    out = Probe()
    replicated = h.replicated_parameters()
    out.facts["replicated"] = [n for n, _ in replicated]
    out.facts["memory"] = h.memory[0] if h.memory else None
    ids = torch.arange(h.vocab, device=h.device)

    def record(label: str) -> None:
        with torch.no_grad():
            tensors = [("embeddings", h.embed(ids))] + [(n, p) for n, p in replicated]
            spreads = {}
            for name, t in tensors:
                size = float(t.detach().double().norm())
                spreads[name] = replica_spread(t) / size if size > 0 else replica_spread(t)
        out.facts.setdefault("states", []).append({"label": label, "spread": spreads})

    record("init")
    for _ in range(3):
        h.own_step(h.random_loss())
    record("3 own steps")
    reached = h.drive_spectrum(generic_cond)
    record(f"cond {reached:.3g}")
    rng = np.random.default_rng(h.seed + 11)
    count = min(steps, 10)
    for step in range(count):
        h.own_step(*adversary_loss(h, step, rng))
    record(f"{count} adversary steps")
    return out

