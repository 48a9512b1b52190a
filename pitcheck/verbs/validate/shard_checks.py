"""Judging the two checks only a sharded target has, in float64 in the validator's process (as checks.py
judges the others, in the same units).

- `shards`: the ranks' vocabulary ranges tile 0..V exactly once, in rank order, and each rank's logits
  slice is as wide as its range; padding rows of the memory, if any, are invisible: the maps and a
  post_step are the same with the padding as stored and with it zeroed (zero rows add nothing to a Gram).
- `replicas`: the embeddings and every replicated parameter agree across ranks through training. The
  measured spread is relative to the tensor's size; a correct module shows exactly 0.
"""
from __future__ import annotations

import numpy as np

from .checks import CheckResult, Context, Verdicts
from .probes import Probe
from .registry import CHECK_RECORDS, Check, register


def _relative(a: np.ndarray, b: np.ndarray) -> float:
    size = float(np.linalg.norm(b))
    gap = float(np.linalg.norm(a - b)) if a.shape == b.shape else np.inf
    return gap / size if size > 0 else gap


def tiling_failures(ranks: list, vocab: int) -> list[tuple[str, str]]:
    """(label, reason) for each way the ranks' {'range', 'width'} fail to tile 0..vocab in rank order."""
    failures, expected_start = [], 0
    for rank, r in enumerate(ranks):
        start, stop = r["range"]
        label = f"rank {rank}"
        if not 0 <= start <= stop <= vocab:
            failures.append((label, f"vocab_range() is [{start}, {stop}), not a slice of 0..{vocab}"))
        elif start > expected_start:
            failures.append((label, f"ids [{expected_start}, {start}) belong to no rank (rank {rank} starts at {start})"))
        elif start < expected_start:
            failures.append((label, f"ids [{start}, {expected_start}) belong to rank {rank} and an earlier rank too"))
        elif r["width"] != stop - start:
            failures.append((label, f"logits returns {r['width']} columns for the {stop - start} ids of [{start}, {stop})"))
        expected_start = max(expected_start, stop)
    if expected_start < vocab:
        failures.append(("tiling", f"ids [{expected_start}, {vocab}) belong to no rank: the slices do not reach V"))
    return failures


def check_shards(probe: Probe, ctx: Context) -> CheckResult:
    """The slices and padding at the asked V and, where pitcheck built the target at a prime V as well
    (probe.facts['uneven']), there too."""
    v = Verdicts("shards", ctx)
    _judge_layout(v, probe.facts, probe.arrays, ctx.vocab, "", ctx)
    uneven = probe.facts.get("uneven")
    if uneven:
        arrays = {key[len("uneven/"):]: a for key, a in probe.arrays.items() if key.startswith("uneven/")}
        _judge_layout(v, uneven, arrays, uneven["vocab"], f"V={uneven['vocab']}: ", ctx)
    return v.done()


def _judge_layout(v: Verdicts, facts: dict, arrays: dict, vocab: int, prefix: str, ctx: Context) -> None:
    failures = tiling_failures(facts["ranks"], vocab)
    for label, reason in failures:
        v.fail(prefix + label, reason)
    if not failures:
        v.result.details.append({"state": prefix + "tiling", "verdict": "pass", "reason": f"the slices tile 0..{vocab}"})
    if not facts.get("padding_rows"):
        v.result.details.append({"state": prefix + "padding", "verdict": "pass", "reason": "no padding rows"})
        return
    for name, what in (("E", "embedding"), ("W", "head")):
        v.ratio(f"{prefix}{what} with padding zeroed", _relative(arrays[f"{name}:zeroed"], arrays[f"{name}:as stored"]),
                ctx.unit(), f"relative change of the {what} when the padding rows are zeroed")
    v.ratio(f"{prefix}post_step with padding zeroed", _relative(arrays["R:zeroed"], arrays["R:as stored"]),
            ctx.unit(), f"relative change of the real rows after post_step when the {facts['padding_rows']} "
                        f"padding rows (norm {facts['padding_norm']:.3g}) are zeroed")


def check_replicas(probe: Probe, ctx: Context) -> CheckResult:
    v = Verdicts("replicas", ctx)
    if not probe.facts["replicated"]:
        v.result.details.append({"state": "parameters", "verdict": "pass",
                                 "reason": "no replicated parameter (only the embeddings are compared)"})
    for state in probe.facts["states"]:
        spreads = state["spread"]
        worst = max(spreads, key=lambda k: spreads[k] if np.isfinite(spreads[k]) else np.inf)
        v.ratio(state["label"], float(spreads[worst]), ctx.unit(),
                f"spread across ranks of {worst} (max_r ||x_r - x_0||_F / ||x_0||_F)", tensor=worst)
    return v.done()


class RankProbe:
    """A sharded check's probe, run on every rank: taken from shard_probes at its first call, since that
    module imports torch.distributed, which the validator's own process never needs."""

    def __init__(self, name: str):
        self.name = name

    def __call__(self, harness, **arguments) -> Probe:
        from .shard_probes import probe_replicas, probe_shards  # deferred: torch.distributed, on the ranks only

        return {"probe_shards": probe_shards, "probe_replicas": probe_replicas}[self.name](harness, **arguments)


register(Check("shards", RankProbe("probe_shards"), check_shards, sharded=True),
         Check("replicas", RankProbe("probe_replicas"), check_replicas, sharded=True))
# name -> judge of the checks only a sharded target has: a view of the registry (checks.judge judges them)
SHARDED_CHECKS = {name: check.judge for name, check in CHECK_RECORDS.items() if check.sharded}
