"""The target's process: `python -m pitcheck.validate.worker REQUEST.json`.

It imports and builds the target, runs one probe per requested check on a freshly built module, and
writes each probe to OUT/<check>.npz as soon as it is done. Before each phase it appends the phase's
name to OUT/phases.log, so when the target hangs, aborts or segfaults the validator can say where.
"""
from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

from . import probes
from .target import build, load_factory, resolve_device

PROBES = {
    "contract": probes.probe_contract,
    "penrose": probes.probe_penrose,
    "reference": probes.probe_reference,
    "conditioning": probes.probe_conditioning,
    "gradients": probes.probe_gradients,
    "trajectory": probes.probe_trajectory,
    "retraction": probes.probe_retraction,
    "checkpoint": probes.probe_checkpoint,
    "bad_input": probes.probe_bad_input,
    "scale": probes.probe_scale,
}


class PhaseLog:
    def __init__(self, path: Path):
        self.file = open(path, "a", buffering=1)

    def __call__(self, phase: str) -> None:
        self.file.write(phase + "\n")
        self.file.flush()


def collect(factory, request: dict, out: Path, log) -> None:
    """Run the requested probes; a probe whose target code raises is recorded with the exception."""
    import torch

    torch.manual_seed(request["seed"])
    if request["device"] != "cuda":
        # torch's thread pool spins against numpy's and other processes' on shared cores; one thread
        # keeps a validation's time predictable (the target's numbers do not depend on it)
        torch.set_num_threads(1)
    device = resolve_device(request["device"])
    V, D, dtype, seed = request["vocab"], request["dim"], request["dtype"], request["seed"]

    def harness(dt=dtype, sd=seed):
        module = build(factory, V, D, dt, device, sd)
        return probes.Harness(module, V, D, getattr(torch, dt), device, sd)

    def widest(only_for=("bfloat16", "float16", "float32")):
        """The same target in float64 (finite differences, shadow); None when it cannot be built."""
        if dtype not in only_for:
            return None
        try:
            return harness("float64")
        except Exception:
            return None

    log("build")
    harness()  # a target that cannot be built at all is exit 2, not nine failed checks
    for name in request["checks"]:
        log(f"check {name}")
        try:
            h = harness()
            extra = {"generic_cond": request["generic_cond"]}
            if name == "gradients":
                # finite differences resolve a derivative in fp32 and fp64, not in half precision
                extra["fd_harness"] = widest(only_for=("bfloat16", "float16"))
            elif name == "trajectory":
                extra["steps"] = request["steps"]
                extra["shadow"] = widest()
            elif name == "checkpoint":
                extra["fresh"] = harness(sd=seed + 1)
            elif name == "conditioning":
                extra["conds"] = request["conds"]
            probe = PROBES[name](h, **extra)
        except Exception as exc:
            probe = probes.Probe(facts={"error": probes.describe_exception(exc),
                                        "where": _target_frame(exc)})
        probes.save_probe(out / f"{name}.npz", probe)
        log(f"done {name}")


def _target_frame(exc: BaseException) -> str:
    """The innermost frame outside pitcheck: where in the target's code the exception came from."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "pitcheck/validate" not in f.filename]
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else ""


def main(argv: list[str]) -> int:
    request_path = Path(argv[0])
    request = json.loads(request_path.read_text())
    out = request_path.parent
    log = PhaseLog(out / "phases.log")
    log("import")
    try:
        factory = load_factory(request["target"])
    except BaseException as exc:  # SystemExit and friends from the target's import-time code too
        (out / "fatal.txt").write_text(f"cannot import {request['target']}: {probes.describe_exception(exc)}")
        return 3
    try:
        collect(factory, request, out, log)
    except BaseException as exc:
        phase = (out / "phases.log").read_text().split("\n")[-2]
        (out / "fatal.txt").write_text(f"target failed during {phase}: {probes.describe_exception(exc)}")
        return 3
    log("finished")
    return 0


if __name__ == "__main__":
    status = main(sys.argv[1:])
    # everything is on disk: exit now, so a target's leftover threads or atexit hooks cannot hang the end
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
