"""`validate(target)`: the Python API behind `pitcheck validate` and the pytest plugin."""
from __future__ import annotations

import math
import tempfile
import time
from pathlib import Path

from ...infra.errors import PitcheckError
from ...infra.threads import policy_threads
from .device import ContextLost
from .checks import CHECKS, Context, CheckResult, conditioning_ladder, generic_condition, judge
from .isolation import TargetRun, run_isolated
from .result import ValidationResult
from .shard_checks import SHARDED_CHECKS
from .probes import describe_exception, load_probe
from .dtypes import DTYPES, UNIT_ROUNDOFF, narrow_dtype_refusal
from .target import describe_callable
from .worker import PhaseLog, collect, last_phase

DEFAULT_VOCAB, DEFAULT_DIM, DEFAULT_STEPS, DEFAULT_TIMEOUT = 2048, 32, 200, 300.0


def parse_checks(checks, sharded: bool = False) -> list[str]:
    """The check names asked for (all of them for None, '' or 'all'); `shards` and `replicas` exist only
    for a sharded target (world_size given), and come first."""
    known = [*SHARDED_CHECKS, *CHECKS] if sharded else list(CHECKS)
    if checks is None or checks == "" or checks == "all":
        return known
    names = [c.strip() for c in checks.split(",")] if isinstance(checks, str) else list(checks)
    only_sharded = [c for c in names if c in SHARDED_CHECKS and not sharded]
    if only_sharded:
        raise PitcheckError(f"check {', '.join(only_sharded)} needs a sharded target: give --world-size")
    unknown = [c for c in names if c not in known]
    if unknown or not names:
        raise PitcheckError(f"unknown check {', '.join(unknown) or '(none)'}; choose from {', '.join(known)}")
    return list(dict.fromkeys(names))


def check_options(dtype, device="auto", vocab=DEFAULT_VOCAB, dim=DEFAULT_DIM, steps=DEFAULT_STEPS, seed=0,
                  timeout=DEFAULT_TIMEOUT) -> None:
    """Raise PitcheckError with a one-line reason for options that cannot make a validation."""
    if dtype not in DTYPES:
        raise PitcheckError(narrow_dtype_refusal(dtype) or f"unknown dtype {dtype!r}; choose from {', '.join(DTYPES)}")
    if device not in ("auto", "cpu", "cuda"):
        raise PitcheckError(f"unknown device {device!r}; choose auto, cpu or cuda")
    for name, value, low in (("vocab", vocab, 2), ("dim", dim, 1), ("steps", steps, 0), ("seed", seed, 0)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise PitcheckError(f"--{name} must be an integer >= {low}, got {value!r}")
    if seed >= 2**63:
        raise PitcheckError(f"--seed must be below 2^63, got {seed}")
    if vocab < 2 * dim:
        raise PitcheckError(f"--vocab {vocab} must be at least 2 x --dim {dim}: the memory is a tall V x D matrix")
    if vocab * dim > 2**27:
        raise PitcheckError(f"V x D = {vocab * dim} is beyond what a validation needs (at most 2^27 entries)")
    if not (isinstance(timeout, (int, float)) and math.isfinite(timeout) and timeout > 0):
        raise PitcheckError(f"--timeout must be a positive number of seconds, got {timeout!r}")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise PitcheckError("--device cuda asked for, but torch sees no CUDA device")


def check_arguments(dtype: str = "float32", *, device: str = "auto", vocab: int = DEFAULT_VOCAB,
                    dim: int = DEFAULT_DIM, steps: int = DEFAULT_STEPS, seed: int = 0, checks=None,
                    timeout: float = DEFAULT_TIMEOUT, world_size: int | None = None) -> list[str]:
    """validate()'s options judged before anything runs (PitcheckError for a bad one, in one line); the
    names of the checks asked for."""
    sharded = world_size is not None
    if sharded:
        from .shard_run import check_world_size  # deferred: torch.distributed, which `import pitcheck` must not need

        check_world_size(world_size)
    names = parse_checks(checks, sharded)
    check_options(dtype, device, vocab, dim, steps, seed, timeout)
    if sharded and vocab < world_size:
        raise PitcheckError(f"--vocab {vocab} gives some of the {world_size} ranks no vocabulary rows")
    return names


def validate(target, dtype: str = "float32", *, device: str = "auto", vocab: int = DEFAULT_VOCAB,
             dim: int = DEFAULT_DIM, steps: int = DEFAULT_STEPS, seed: int = 0, checks=None,
             timeout: float = DEFAULT_TIMEOUT, isolate: bool = True, threads: int | None = None,
             world_size: int | None = None) -> ValidationResult:
    """Judge a PIT implementation: `target` is 'module:factory', 'path/file.py:factory' or the factory.

    The target runs in a child process with a time limit (isolate=True); a factory that cannot be
    imported by name (defined in __main__ or a notebook) runs in this process instead. Raises
    PitcheckError for bad options; a target that fails to import, build or run gives a result with
    `fatal` set and exit_status 2. threads: torch threads of the target's process (None: the thread
    policy's count, pitcheck.infra.threads). world_size: validate a vocabulary-parallel target on that many ranks
    (the shard contract, pitcheck.verbs.validate.sharded), with the checks `shards` and `replicas` added.
    """
    sharded = world_size is not None
    names = check_arguments(dtype, device=device, vocab=vocab, dim=dim, steps=steps, seed=seed, checks=checks,
                            timeout=timeout, world_size=world_size)
    factory = None
    if callable(target):
        spec = describe_callable(target)
        if not spec and sharded:
            raise PitcheckError(f"{getattr(target, '__qualname__', target)!r} cannot be imported by name, which "
                                "every rank must do: give it as module:factory or path/file.py:factory")
        if not spec:
            factory, spec, isolate = target, getattr(target, "__qualname__", repr(target)), False
    else:
        spec = str(target)
    ctx = Context(dtype, UNIT_ROUNDOFF[dtype], vocab, dim)
    request = {"target": spec, "dtype": dtype, "device": device, "vocab": vocab, "dim": dim, "steps": steps,
               "seed": seed, "checks": names, "conds": conditioning_ladder(ctx),
               "generic_cond": generic_condition(ctx), "threads": policy_threads(threads)}
    start = time.monotonic()
    if sharded:
        from .shard_run import run_sharded

        run = run_sharded(request, world_size, timeout)
    else:
        run = run_isolated(request, timeout) if isolate else _run_here(factory, request)
    result = ValidationResult(spec, dtype, device, vocab, dim, steps, seed, fatal=run.fatal, world_size=world_size,
                              restarts=list(getattr(run, "restarts", [])))
    for name in names:
        if name in run.probes:
            result.checks.append(judge(name, run.probes[name], ctx))
        elif name in run.skipped:
            result.checks.append(CheckResult(name, "error", reason=run.skipped[name]))
        elif name == run.failed_during:
            result.checks.append(CheckResult(name, "error", reason=run.fatal))
        elif run.fatal:
            result.checks.append(CheckResult(name, "error", reason=f"not run: {run.fatal}"))
        else:  # no probe and no reason must never read as a pass (nor vanish from the table)
            result.checks.append(CheckResult(name, "error", reason="no result: the target's process ended without one"))
    result.seconds = time.monotonic() - start
    return result


def _run_here(factory, request: dict) -> TargetRun:
    """In this process, for factories that a child process cannot import by name (no time limit)."""
    run = TargetRun()
    with tempfile.TemporaryDirectory(prefix="pitcheck-validate-") as tmp:
        out = Path(tmp)
        log = PhaseLog(out / "phases.log")
        try:
            collect(factory, request, out, log)
        except ContextLost as lost:
            # the loss is CUDA's, not a verdict on the target (an out-of-range id's device-side assert is a
            # refusal); only a fresh process could run the rest, and this one is the caller's
            run.fatal = (f"the device context was lost after {lost.where} ({lost.reason}); a factory that "
                         "cannot be imported by name runs in the validator's process, which cannot start a fresh "
                         "process for the rest: give the target as module:factory or path/file.py:factory")
            run.failed_during = _check_of(last_phase(out / "phases.log", ""))
        except (Exception, SystemExit) as exc:  # a factory calling sys.exit must not end the caller
            phase = last_phase(out / "phases.log", "build")
            run.fatal = f"target failed during {phase}: {describe_exception(exc)}"
            run.failed_during = _check_of(phase)
        for name in request["checks"]:
            if (out / f"{name}.npz").exists():
                run.probes[name] = load_probe(out / f"{name}.npz")
    return run


def _check_of(phase: str) -> str:
    return phase[len("check "):] if phase.startswith("check ") else ""
