"""Running a sharded target: N ranks (pitcheck.model.sharded.ShardedPool: torch.multiprocessing, gloo on the CPU,
NCCL on CUDA) that build the module and run one probe per check in step, under one time limit.

A rank that raises, dies or hangs (its peers time out in a collective, half the limit at most) ends the
run with a one-line reason naming the rank and the check; every rank is killed, and each rank is tied to
the validator (lifeline.die_with_parent) so none outlives it.
"""
from __future__ import annotations

import time

from ...infra.errors import PitcheckError
from ...model.sharded.processes import ShardedPool, ShardedRunError, default_backend
from .isolation import TargetRun
from .lifeline import die_with_parent
from .shard_checks import tiling_failures

# seconds a rank may take to start (import torch, join the group) on a busy machine, beyond the limit
START_UP = 120.0


def check_world_size(world_size) -> int:
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise PitcheckError(f"--world-size must be an integer >= 1, got {world_size!r}")
    if world_size > 64:
        raise PitcheckError(f"--world-size {world_size} is beyond what a validation needs (at most 64 ranks)")
    return world_size


def _tie_to_validator() -> None:
    die_with_parent()


def run_sharded(request: dict, world_size: int, timeout: float) -> TargetRun:
    """Build the target on `world_size` ranks and run request['checks'] in order; rank 0's probes."""
    from .shard_probes import rank_build, rank_check

    run = TargetRun()
    start = time.monotonic()
    deadline = start + timeout
    phase = "start-up"
    backend = default_backend("cuda" if request["device"] == "cuda" else "cpu")
    try:
        with ShardedPool(world_size, timeout=timeout, backend=backend, threads=request.get("threads") or 1,
                         start_timeout=START_UP) as pool:
            pool.run(_tie_to_validator, label="start-up")
            deadline = time.monotonic() + timeout  # the limit counts from the ranks' start
            phase = "build"
            built = pool.run(rank_build, request, label=phase, timeout=timeout)
            problem = next((b["problem"] for b in built if "problem" in b), "")
            if problem:
                run.fatal = problem
                return run
            untiled = tiling_failures(built, request["vocab"])
            for name in request["checks"]:
                if untiled and name != "shards":
                    # no assembled maps exist to judge: said once per check, not as a crash in each probe
                    run.skipped[name] = f"not run: {untiled[0][1]} (check shards)"
                    continue
                phase = f"check {name}"
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ShardedRunError(f"ranks timed out after {timeout:g} s before {phase}", None, "hung")
                run.probes[name] = pool.run(rank_check, request, name, label=phase, timeout=left)[0]
    except ShardedRunError as exc:
        run.fatal = f"target failed: {exc}"
        run.failed_during = phase[len("check "):] if phase.startswith("check ") else ""
    finally:
        run.seconds = time.monotonic() - start
    return run
