"""The target's process: lifeline.BOOTSTRAP calls `run_and_exit(REQUEST.json)` once the worker is tied to
the validator.

It imports and builds the target, runs one probe per requested check on a freshly built module, and
writes each probe to OUT/<check>.npz as soon as it is done. Before each phase it appends the phase's
name, with the time, to OUT/phases.log, so when the target hangs, aborts or segfaults the validator can
say where and what took the time. After each probe (and each of bad_input's cases) it checks the device's
context (device.py); when that is lost it saves what it has and exits with LOST_STATUS, and a
fresh worker on the same OUT runs what has no result yet.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import NoReturn

from ...infra.threads import policy_threads, set_torch_threads
from .device import LOST_STATUS, ContextLost, check_context
from .dtypes import HALF
from .probes import (Harness, Probe, TargetFault, describe_exception, gradient_path_breach, load_probe,
                     save_probe)
from .registry import CHECK_RECORDS
from .target import TargetError, build, load_factory, resolve_device

# probes that take the cases an earlier worker ran (done=) and report each case (after_case=): bad_input's
# out-of-range ids are what loses a CUDA context, and the cases after the one that lost it still count
RESUMABLE = ("bad_input",)


class PhaseLog:
    """OUT/phases.log: one line per phase, `<time.monotonic()> <phase>` (the clock is the machine's, so the
    validator times every worker's phases on it)."""

    def __init__(self, path: Path):
        self.file = open(path, "a", buffering=1)

    def __call__(self, phase: str) -> None:
        self.file.write(f"{time.monotonic():.3f} {phase}\n")
        self.file.flush()


def read_phases(path: Path) -> list[tuple[float, str]]:
    """(start time, phase) of each line of a phases.log, oldest first; [] when there is none."""
    if not path.exists():
        return []
    phases = []
    for line in path.read_text().splitlines():
        stamp, _, phase = line.partition(" ")
        try:
            phases.append((float(stamp), phase))
        except ValueError:  # a line cut short by a kill
            continue
    return phases


def last_phase(path: Path, default: str) -> str:
    phases = read_phases(path)
    return phases[-1][1] if phases else default


def prepare_torch(request: dict) -> str:
    """Seed torch and pin its threads for a target's process; returns the device the request resolves to."""
    import torch

    torch.manual_seed(request["seed"])
    if request["device"] != "cuda":
        # torch's thread pool spins against numpy's and other processes' on shared cores: the thread
        # policy's count (one unless the parent's --threads chose more, inherited through the environment)
        set_torch_threads(request.get("threads") or policy_threads())
    return resolve_device(request["device"])


def collect(factory, request: dict, out: Path, log) -> None:
    """Run the requested probes; a probe whose target code raises is recorded with the exception."""
    import torch

    device_name = prepare_torch(request)
    V, D, dtype, seed = request["vocab"], request["dim"], request["dtype"], request["seed"]

    def harness(dt=dtype, sd=seed):
        module = build(factory, V, D, dt, device_name, sd)
        return Harness(module, V, D, getattr(torch, dt), device_name, sd)

    def widest(half_only=False):
        """The same target in float64 (finite differences, shadow) for a narrower dtype under test; None
        when it cannot be built."""
        if dtype == "float64" or (half_only and dtype not in HALF):
            return None
        try:
            return harness("float64")
        except Exception:
            return None

    log("build")
    harness()  # a target that cannot be built at all is exit 2, not nine failed checks
    try:
        check_context(device_name, "build")
    except ContextLost as lost:
        raise TargetError(f"building the target lost the {device_name} device's context: {lost.reason}") from None
    for name in request["checks"]:
        if (out / f"{name}.npz").exists():
            continue  # an earlier worker ran it before its device context was lost
        log(f"check {name}")
        try:
            h = harness()
            arguments = probe_arguments(name, request, harness, widest)
            if name in RESUMABLE:
                arguments.update(resume_arguments(name, out, device_name))
            probe = CHECK_RECORDS[name].probe(h, **arguments)
        except ContextLost:
            raise
        except Exception as exc:
            probe = Probe(facts=blame(exc, harness))
        save_probe(out / f"{name}.npz", probe)
        (out / f"{name}.partial.npz").unlink(missing_ok=True)
        log(f"done {name}")
        check_context(device_name, f"check {name}")


def resume_arguments(name: str, out: Path, device_name: str) -> dict:
    """done=: the cases of check `name` that an earlier worker saved; after_case=: after each case, the
    device's context is checked, and on a loss the cases so far are saved for the next worker."""
    partial = out / f"{name}.partial.npz"

    def after_case(probe: Probe) -> None:
        case = next(reversed(probe.facts.get("cases", {})), "")
        try:
            check_context(device_name, f"check {name}, case {case}")
        except ContextLost:
            save_probe(partial, probe)
            raise

    return {"done": load_probe(partial) if partial.exists() else None, "after_case": after_case}


def probe_arguments(name: str, request: dict, harness, widest) -> dict:
    """The keyword arguments of check `name`'s probe beyond the harness: `harness(sd=...)` builds another
    instance of the target, `widest(half_only=...)` the float64 one (None when there is none)."""
    extra = {"generic_cond": request["generic_cond"]}
    if name == "gradients":
        # finite differences resolve a derivative in fp32 and fp64, not in half precision
        extra["fd_harness"] = widest(half_only=True)
    elif name == "penrose":
        # a dtype narrower than float32 passes errors of a few percent: the float64 build shows whether the
        # code has a defect hiding under that threshold (checks.judge_shadow)
        extra["shadow"] = widest(half_only=True)
    elif name == "trajectory":
        extra["steps"] = request["steps"]
        extra["shadow"] = widest()
    elif name == "checkpoint":
        extra["fresh"] = harness(sd=request["seed"] + 1)
    elif name == "conditioning":
        extra["conds"] = request["conds"]
    elif name == "replicas":
        extra["steps"] = request["steps"]
    return extra


def _as_dirs(paths) -> tuple[str, ...]:
    return tuple(os.path.join(os.path.realpath(p), "") for p in paths)


def _is_library(path: str) -> bool:
    """Code that is neither the target's nor the probe's: torch, numpy, the standard library (not the
    site-packages inside it, where a target may be installed)."""
    import sysconfig

    import numpy
    import torch

    paths = sysconfig.get_paths()
    if path.startswith(_as_dirs([os.path.dirname(torch.__file__), os.path.dirname(numpy.__file__)])):
        return True
    return path.startswith(_as_dirs([paths["stdlib"], paths["platstdlib"]])) and \
        not path.startswith(_as_dirs([paths["purelib"], paths["platlib"]]))


# probes.py lives beside this module: a frame in this directory is pitcheck's probe, not the target
PROBE_DIR = os.path.join(os.path.dirname(os.path.realpath(__file__)), "")


def _culprit_frame(exc: BaseException):
    """The innermost frame that is not library code: the target's, or pitcheck's probe's when the error
    came from a library call the probe made itself (its loss's backward, a factorisation)."""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        path = os.path.realpath(frame.filename)
        if not (frame.filename.startswith("<") or _is_library(path)):
            return frame, path.startswith(PROBE_DIR)
    return None, False


def blame(exc: BaseException, harness) -> dict:
    """The facts of a probe that raised: the target raised (with where), the probe found the target in
    breach of its contract, or the probe itself failed (and what, if anything, the target did wrong)."""
    if isinstance(exc, TargetFault):
        return {"error": str(exc), "by": "breach"}
    frame, in_probe = _culprit_frame(exc)
    where = f"{frame.filename}:{frame.lineno}" if frame else ""
    if not in_probe:
        return {"error": describe_exception(exc), "where": where, "by": "target"}
    try:
        breach = gradient_path_breach(harness())
    except Exception as again:  # the target's own code raised this time: that is the breach
        breach = f"the target raised {describe_exception(again)}"
    return {"error": describe_exception(exc), "where": f"{os.path.basename(frame.filename)}:"
            f"{frame.lineno} ({frame.name})", "by": "probe", "breach": breach}


def open_request(request_path: str):
    """(request, OUT, phase log, factory) of OUT/request.json, the target imported in the "import" phase; the
    factory is None when it could not be, with OUT/fatal.txt saying why."""
    request_path = Path(request_path)
    request = json.loads(request_path.read_text())
    out = request_path.parent
    log = PhaseLog(out / "phases.log")
    log("import")
    try:
        factory = load_factory(request["target"])
    except BaseException as exc:  # SystemExit and friends from the target's import-time code too
        (out / "fatal.txt").write_text(f"cannot import {request['target']}: {describe_exception(exc)}")
        factory = None
    return request, out, log, factory


def exit_now(status: int) -> NoReturn:
    """End a target's process at once: everything is on disk by then, so a target's leftover threads or
    atexit hooks cannot hang the end."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def main(request_path: str) -> int:
    """Import, build and probe the target of OUT/request.json, writing into OUT; 0 once every probe is on disk."""
    request, out, log, factory = open_request(request_path)
    if factory is None:
        return 3
    try:
        collect(factory, request, out, log)
    except ContextLost as lost:
        (out / "lost.txt").write_text(str(lost))
        return LOST_STATUS
    except BaseException as exc:
        phase = last_phase(out / "phases.log", "import")
        (out / "fatal.txt").write_text(f"target failed during {phase}: {describe_exception(exc)}")
        return 3
    log("finished")
    return 0


def run_and_exit(request_path: str) -> NoReturn:
    """The worker process's entry: main, then exit at once (exit_now)."""
    exit_now(main(request_path))
