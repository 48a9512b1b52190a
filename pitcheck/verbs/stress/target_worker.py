"""What runs in the target's process for a stress scenario on a user's module: step it, save its maps.

validate's isolation (pitcheck.verbs.validate.isolation.run_entry) starts this module's `run_and_exit` in a
child process tied to pitcheck's by the same lifeline as validate's worker. It imports and builds the
target (validate's contract: `factory(vocab_size, hidden_size, *, dtype, device, seed)`), steps it
`steps` times on the scenario's gradient models as losses on the module's outputs, with the module's own
optimizer (configure_optimizer, else SGD) or the scenario's optimizer and rate as torch.optim, and after
each recorded step writes the maps E (V x D) and W (D x V) to OUT/state-<step>.npz. Nothing is judged here:
pitcheck's own process measures the maps, so a target that corrupts its interpreter cannot corrupt the
budgets' verdicts. OUT/phases.log names each phase (import, build, step N) for a timeout's reason.
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import NoReturn

import numpy as np

# the gradient models that have a form as a loss on a module's outputs (pitcheck.model.gradients)
LOSS_CHANNELS = ("gaussian", "dense_output", "sparse_input", "spike")


def state_path(out: Path, step: int) -> Path:
    return out / f"state-{step:012d}.npz"


def torch_optimizer(torch, params, name: str, lr: float):
    """The scenario's optimizer as torch.optim over the module's trainable parameters."""
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if name == "momentum":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    raise ValueError(f"no torch optimizer for {name!r}")


def channel_loss(h, channels: list[str], rng: np.random.Generator, params) -> tuple:
    """The named gradient models as one loss on the module's outputs, and the norm its gradient is scaled
    to: gaussian (a dense random functional of both maps), dense_output (softmax cross-entropy of the head
    at Zipf targets), sparse_input (a Zipf batch of embedding rows, times input_scale), spike (with
    probability spike_probability, the step's gradient spike_scale times the usual norm)."""
    torch = h.torch
    V, D, batch = h.vocab, h.dim, params.batch
    zipf = 1.0 / np.arange(1, V + 1) ** params.zipf_exponent
    zipf /= zipf.sum()
    loss, norm = 0.0, 1.0
    if "gaussian" in channels:
        ids = torch.from_numpy(rng.integers(0, V, size=batch)).to(h.device)
        hid = torch.from_numpy(rng.standard_normal((batch, D))).to(h.device, h.dtype)
        r_in = torch.from_numpy(rng.standard_normal((batch, D)) / math.sqrt(D)).to(h.device)
        r_out = torch.from_numpy(rng.standard_normal((batch, V)) / math.sqrt(V)).to(h.device)
        loss = loss + (h.embed(ids).to(torch.float64) * r_in).sum() + (h.logits(hid).to(torch.float64) * r_out).sum()
    if "dense_output" in channels:
        hid = torch.from_numpy(rng.standard_normal((batch, D))).to(h.device, h.dtype)
        targets = torch.from_numpy(rng.choice(V, size=batch, p=zipf)).to(h.device)
        loss = loss + torch.nn.functional.cross_entropy(h.logits(hid).to(torch.float64), targets)
    if "sparse_input" in channels:
        ids = torch.from_numpy(rng.choice(V, size=batch, p=zipf)).to(h.device)
        r_in = torch.from_numpy(rng.standard_normal((batch, D)) / math.sqrt(D)).to(h.device)
        loss = loss + params.input_scale * (h.embed(ids).to(torch.float64) * r_in).sum()
    if "spike" in channels and rng.random() < params.spike_probability:
        norm = params.spike_scale
    if not torch.is_tensor(loss):  # spike alone: its bursts scale the gaussian channel
        ids = torch.from_numpy(rng.integers(0, V, size=batch)).to(h.device)
        r_in = torch.from_numpy(rng.standard_normal((batch, D)) / math.sqrt(D)).to(h.device)
        loss = (h.embed(ids).to(torch.float64) * r_in).sum()
    return loss, norm


def drive(h, request: dict, out: Path, log) -> None:
    """Step the harness `steps` times and save its maps at each recorded step."""
    from ...model.gradients import AdversaryParams

    if request.get("optimizer"):
        params = [p for p in h.module.parameters() if p.requires_grad]
        h.optimizer = torch_optimizer(h.torch, params, request["optimizer"], request["lr"]) if params else None
    channels = request["channels"]
    params = AdversaryParams(**request["adversary_params"])
    marks = set(request["recorded"])
    for step in range(request["steps"] + 1):
        if step in marks:
            E, W = h.maps()
            np.savez(str(state_path(out, step)) + ".tmp.npz", E=E, W=W)
            os.replace(str(state_path(out, step)) + ".tmp.npz", state_path(out, step))
        if step == request["steps"]:
            break
        log(f"step {step + 1}")
        rng = np.random.default_rng([request["seed"], step])
        h.own_step(*channel_loss(h, channels, rng, params))


def main(request_path: str) -> int:
    """Import, build and step the target of OUT/request.json, writing into OUT; 0 once every state is saved."""
    from ..validate.probes import Harness, describe_exception
    from ..validate.target import build
    from ..validate.worker import last_phase, open_request, prepare_torch

    request, out, log, factory = open_request(request_path)
    if factory is None:
        return 3
    try:
        import torch

        device = prepare_torch(request)
        log("build")
        dtype = request["dtype"]
        try:
            module = build(factory, request["vocab"], request["dim"], dtype, device, request["seed"])
        except BaseException as exc:
            (out / "fatal.txt").write_text(f"cannot build {request['target']}: {describe_exception(exc)}")
            return 3
        h = Harness(module, request["vocab"], request["dim"], getattr(torch, dtype), device, request["seed"])
    except BaseException as exc:
        phase = last_phase(out / "phases.log", "import")
        (out / "fatal.txt").write_text(f"target failed during {phase}: {describe_exception(exc)}")
        return 3
    try:
        drive(h, request, out, log)
    except Exception as exc:  # the module's own code failed while stepped: a result (the states so far), not a crash
        phase = last_phase(out / "phases.log", "build")
        (out / "raised.txt").write_text(f"the target raised during {phase}: {describe_exception(exc)}")
    log("finished")
    return 0


def run_and_exit(request_path: str) -> NoReturn:
    """The child's entry: main, then exit at once (a target's leftover threads cannot hang the end)."""
    from ..validate.worker import exit_now

    exit_now(main(request_path))
