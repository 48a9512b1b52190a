"""What runs inside the target's process: drive the module, read off what it computes, judge nothing.

Every probe takes a freshly built module and returns a `Probe`: named float64 arrays (the maps the
module computes, extracted black-box) and JSON-able facts (dtypes, exceptions, reached conditioning).
The judging (checks.py) runs in pitcheck's own process on these values, so a target that corrupts its
interpreter cannot corrupt its verdict.

The maps: A = E^T with E = embed(0..V-1) (V x D, the embedding rows) and B = W^T with W = logits(I_D)
(D x V, the head: row i is the logits of the i-th basis hidden state). Nothing forms a V x V matrix.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...model.gradients import AdversaryParams
from ...numerics.metrics import condition_number
from .dtypes import element_bits

# optimizer for the default target contract: plain SGD at this rate
DEFAULT_LR = 1e-2
# Adam rate of the spectrum drive on T-side parameters (log-scale parameters move ~ this per step)
DRIVE_LR = 0.05
DRIVE_MAX_STEPS = 400
# the drive undoes a step that multiplies its error by more than this (Adam is not monotone: small rises
# are its normal course), grows an accepted rate by DRIVE_GROW, and stops below DRIVE_MIN_RATE x DRIVE_LR
DRIVE_REJECT = 1.5
DRIVE_GROW = 1.25
DRIVE_MIN_RATE = 1e-6


@dataclass
class Probe:
    arrays: dict = field(default_factory=dict)
    facts: dict = field(default_factory=dict)

    def add_state(self, label: str, E, W, **facts) -> None:
        self.arrays[f"E:{label}"] = E
        self.arrays[f"W:{label}"] = W
        self.facts.setdefault("states", []).append({"label": label, **facts})


def save_probe(path: Path, probe: Probe) -> None:
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, __facts__=np.array(json.dumps(probe.facts, default=float)), **probe.arrays)
    os.replace(tmp, path)


def load_probe(path: Path) -> Probe:
    with np.load(path, allow_pickle=False) as data:
        facts = json.loads(str(data["__facts__"]))
        arrays = {k: data[k] for k in data.files if k != "__facts__"}
    return Probe(arrays=arrays, facts=facts)


class TargetFault(Exception):
    """A breach of the target contract found by pitcheck's probe (a non-finite gradient, an output with no
    gradient path): the target's fault, though the target's code raised nothing."""


def _torch():
    import torch

    return torch


def describe_exception(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__


class Harness:
    """The target module and the ways pitcheck may touch it: maps, its own optimizer, post_step."""

    def __init__(self, module, vocab: int, dim: int, dtype, device: str, seed: int):
        torch = _torch()
        self.torch, self.module = torch, module
        self.vocab, self.dim, self.dtype, self.device, self.seed = vocab, dim, dtype, device, seed
        self.generator = torch.Generator(device="cpu").manual_seed(seed)
        self.optimizer = self.make_optimizer()
        self.own_steps = 0

    # ---- what the module computes ----------------------------------------------------------------
    def embed(self, ids):
        return self.module.embed(ids)

    def logits(self, h):
        return self.module.logits(h)

    def maps(self) -> tuple[np.ndarray, np.ndarray]:
        """E (V x D) and W (D x V) as float64 copies of what the module returns."""
        torch = self.torch
        with torch.no_grad():
            E = self.embed(torch.arange(self.vocab, device=self.device))
            W = self.logits(torch.eye(self.dim, dtype=self.dtype, device=self.device))
        return to_numpy(E), to_numpy(W)

    # ---- how the module moves ----------------------------------------------------------------
    def make_optimizer(self):
        params = [p for p in self.module.parameters() if p.requires_grad]
        if hasattr(self.module, "configure_optimizer"):
            opt = self.module.configure_optimizer(params)
            if not isinstance(opt, self.torch.optim.Optimizer):
                # silently taking no steps would let a missing retraction pass the trajectory check
                raise TypeError(f"configure_optimizer returned {type(opt).__name__}, not a torch.optim.Optimizer")
            return opt
        return self.torch.optim.SGD(params, lr=DEFAULT_LR) if params else None

    def post_step(self) -> None:
        if hasattr(self.module, "post_step"):
            self.module.post_step()

    def randn(self, *shape, scale: float = 1.0):
        x = self.torch.randn(*shape, generator=self.generator, dtype=self.torch.float64) * scale
        return x.to(device=self.device)

    def random_loss(self, batch: int = 32):
        """A generic linear functional of both maps: gradients reach every parameter."""
        torch = self.torch
        ids = torch.randint(0, self.vocab, (batch,), generator=self.generator).to(self.device)
        h = self.randn(batch, self.dim).to(self.dtype)
        r_in = self.randn(batch, self.dim).to(self.dtype)
        r_out = self.randn(batch, self.vocab, scale=1.0 / math.sqrt(self.vocab)).to(self.dtype)
        return (self.embed(ids) * r_in).float().sum() + (self.logits(h) * r_out).float().sum()

    def own_step(self, loss, grad_norm: float = 1.0) -> None:
        """One step of the module's own optimizer on `loss`, then post_step. The gradient is rescaled to
        `grad_norm` (as clipping does in LM training): a linear loss on logits = h L L^T Z^T has a
        gradient that grows with L, and unscaled it would blow T up within a few bursts."""
        if self.optimizer is None:
            return
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.own_steps += 1
        moved = [p for group in self.optimizer.param_groups for p in group["params"] if p.grad is not None]
        grads = [p.grad for p in moved]
        total = math.sqrt(self.squared_norm(moved, grads))
        if not math.isfinite(total):
            # reported here, not by what a non-finite step breaks later (a factorisation of NaNs)
            names = {id(p): n for n, p in self.module.named_parameters()}
            bad = next((p for p in moved if not bool(self.torch.isfinite(p.grad).all())), None)
            if bad is None:  # sharded: another rank's block holds it
                raise TargetFault(f"the target's backward gave a non-finite gradient on another rank at its own "
                                  f"step {self.own_steps}, before the step was taken")
            value = float(bad.grad.detach().double().flatten()[~self.torch.isfinite(bad.grad.detach().double().flatten())][0])
            raise TargetFault(f"the target's backward gave a non-finite gradient ({value}) for parameter "
                              f"{names.get(id(bad), '(optimizer tensor)')} at its own step {self.own_steps}, "
                              "before the step was taken")
        if total > 0 and math.isfinite(total):
            for g in grads:
                g.mul_(grad_norm / total)
        self.optimizer.step()
        self.post_step()

    def squared_norm(self, params, tensors) -> float:
        """sum of ||t||_F^2 over tensors (one per parameter of params): the whole model's, in float64.
        The sharded harness sums row blocks over the ranks and counts replicated parameters once."""
        return sum(float(t.detach().double().pow(2).sum()) for t in tensors)

    def dot(self, params, a, b) -> float:
        """sum of <a_i, b_i> over parameters (a_i, b_i shaped like params[i]), in float64."""
        return sum(float((x.to(self.torch.float64) * y.to(x.device, self.torch.float64)).sum()) for x, y in zip(a, b))

    def random_direction(self, params, generator) -> list:
        """A float64 direction per parameter, each scaled to 0.1 max(||p||, 1) (a gradient check's step)."""
        torch = self.torch
        out = []
        for p in params:
            d = torch.randn(p.shape, generator=generator, dtype=torch.float64)
            out.append(d / max(float(d.norm()), 1e-300) * max(float(p.detach().double().norm()), 1.0) * 1e-1)
        return out

    def memory_access(self):
        """A MemoryAccess to the V x D memory the optimizer moves, or None (see memory_parameter)."""
        found = memory_parameter(self)
        return None if found is None else MemoryAccess(self, *found)

    def retraction_start(self, memory) -> None:
        """Where the retraction probe judges post_step from: the state the own steps left (the sharded
        harness first moves the assembled memory onto the manifold)."""

    def t_side_parameters(self) -> list:
        """Parameters smaller than the memory: where T lives in every convention we know of."""
        return [p for p in self.module.parameters() if p.requires_grad and p.numel() < self.vocab * self.dim]

    def drive_spectrum(self, cond: float, max_steps: int = DRIVE_MAX_STEPS) -> float:
        """Push the eigenvalues of T toward a geometric spectrum of condition `cond` about their present
        geometric mean (the spread changes, not the scale) through the module's own T-side parameters
        (Adam on the squared log-eigenvalue error, post_step after each step). T's eigenvalues are read off
        the embedding, E^T E = T^{-1} Z^T Z T^{-1} = T^{-2}: through the solves, so a head that is not the
        embedding's inverse cannot stall the drive. Adam moves every entry by about its rate whatever its
        gradient, so a step that breaks the maps or grows the error past DRIVE_REJECT is undone and retried
        at half the rate (at D = 576 a full-rate step moves L by several times its norm and the solves
        overflow); an accepted step raises the rate again, up to DRIVE_LR. Returns cond(T) reached."""
        torch = self.torch
        params = self.t_side_parameters()
        if not params or cond <= 1.0:
            return self.condition()
        log_t = self.log_spectrum()
        if log_t is None:
            return self.condition()  # the maps say so themselves; the judging reports it
        half = 0.5 * math.log(cond)
        target = float(log_t.detach().mean()) + torch.linspace(-half, half, self.dim, dtype=torch.float64,
                                                      device=self.device)
        opt = torch.optim.Adam(params, lr=DRIVE_LR)
        loss = ((log_t - target) ** 2).sum()
        for _ in range(max_steps):
            reached = float(torch.exp(log_t[-1] - log_t[0]).detach())
            if abs(math.log(reached / cond)) < 0.05 * max(math.log(cond), 1.0):
                break
            saved = self.saved_state(opt)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            self.post_step()
            new_log_t = self.log_spectrum()
            new_loss = None if new_log_t is None else ((new_log_t - target) ** 2).sum()
            if new_loss is not None and float(new_loss.detach()) <= DRIVE_REJECT * float(loss.detach()):
                log_t, loss = new_log_t, new_loss
                self.set_rate(opt, min(DRIVE_LR, DRIVE_GROW * opt.param_groups[0]["lr"]))
                continue
            self.restore_state(opt, saved)
            rate = 0.5 * opt.param_groups[0]["lr"]
            if rate < DRIVE_LR * DRIVE_MIN_RATE:
                break  # no step of any size helps: report where it stands
            self.set_rate(opt, rate)
            log_t = self.log_spectrum()
            loss = ((log_t - target) ** 2).sum()
        return self.condition()

    def log_spectrum(self):
        """The ascending log-eigenvalues of T as the embedding shows them (with their graph), or None when
        the embedding is not finite."""
        torch = self.torch
        E = self.embed(torch.arange(self.vocab, device=self.device)).to(torch.float64)
        if not bool(torch.isfinite(E).all()):
            return None
        ev = torch.linalg.eigvalsh(E.T @ E).clamp_min(1e-300)
        log_t = -0.5 * torch.log(ev).flip(0)
        return log_t if bool(torch.isfinite(log_t).all()) else None

    def saved_state(self, opt) -> tuple:
        """Copies of the module's state (parameters and buffers) and the drive optimizer's, to undo a step."""
        import copy

        module_state = {k: v.detach().clone() for k, v in self.module.state_dict().items()}
        return module_state, copy.deepcopy(opt.state_dict())

    def restore_state(self, opt, saved: tuple) -> None:
        module_state, opt_state = saved
        with self.torch.no_grad():
            for name, value in self.module.state_dict().items():
                value.copy_(module_state[name])
        opt.load_state_dict(opt_state)

    @staticmethod
    def set_rate(opt, rate: float) -> None:
        for group in opt.param_groups:
            group["lr"] = rate

    def condition(self) -> float:
        """cond(T) as the embedding shows it: cond_2(E) (= cond(T) for an orthonormal memory)."""
        with self.torch.no_grad():
            E = self.embed(self.torch.arange(self.vocab, device=self.device))
        return condition_number(to_numpy(E))

    def generic_state(self, cond: float = 10.0, own_steps: int = 3) -> float:
        """Away from T = I (where one solve and two agree): a few own steps, then T driven to `cond`."""
        for _ in range(own_steps):
            self.own_step(self.random_loss())
        return self.drive_spectrum(cond)


def gradient_path_breach(h: Harness) -> str:
    """What in the target's outputs breaks the gradient contract ('' when nothing is found): an output
    that does not require grad, or one whose graph does not survive a second call and backward (a cached
    output whose graph was built once)."""
    torch = h.torch
    ids = torch.arange(min(h.vocab, 8), device=h.device)
    hid = h.randn(2, h.dim).to(h.dtype)
    for what, call in (("embedding", lambda: h.embed(ids)), ("logits", lambda: h.logits(hid))):
        for attempt in ("first", "second"):
            out = call()
            if not out.requires_grad:
                return f"the target's {what} has no gradient path to its parameters (it does not require grad)"
            try:
                out.float().sum().backward()
            except RuntimeError as exc:
                return (f"a backward through the target's {what} raised {describe_exception(exc)} at the "
                        f"{attempt} call: its graph is not built afresh at each call (a cached {what}?)")
    return ""


def _dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def _wrapped_storage(t) -> dict:
    """For a tensor subclass that stores its values in other tensors (torchao's MXTensor and Float8Tensor
    report the dtype they stand for, float32 say, while holding float8 elements and scales), the
    narrowest element dtype inside it: of its inner tensors (__tensor_flatten__) and of the dtypes in its
    metadata (a packed FP4 element type lives there). {} for a plain tensor or one with nothing narrower."""
    flatten = getattr(type(t), "__tensor_flatten__", None)
    if flatten is None or type(t) in (_torch().Tensor, _torch().nn.Parameter):
        return {}
    try:
        names, meta = t.__tensor_flatten__()
    except Exception:  # a subclass that cannot say what it holds: judged by its dtype alone
        return {}
    dtype_type = type(_torch().float32)
    inner = [getattr(t, n).dtype for n in names if hasattr(getattr(t, n, None), "dtype")]
    inner += [v for v in (meta or {}).values() if isinstance(v, dtype_type)] if isinstance(meta, dict) else []
    bits = [(element_bits(_dtype_name(d)), _dtype_name(d)) for d in inner]
    bits = [b for b in bits if b[0] is not None]
    if not bits:
        return {}
    return {"stored": min(bits)[1], "wrapper": type(t).__name__}


def to_numpy(x) -> np.ndarray:
    return x.detach().to(device="cpu", dtype=_torch().float64).numpy().copy()


# ---- one probe per check --------------------------------------------------------------------------

def probe_contract(h: Harness, generic_cond: float = 10.0, **_) -> Probe:
    torch = h.torch
    out = Probe()
    ids = torch.randint(0, h.vocab, (2, 3), generator=h.generator).to(h.device)
    e = h.embed(ids)
    hid = h.randn(2, 3, h.dim).to(h.dtype)
    lg = h.logits(hid)
    out.facts["embed"] = {"shape": list(e.shape), "dtype": str(e.dtype).replace("torch.", "")}
    out.facts["logits"] = {"shape": list(lg.shape), "dtype": str(lg.dtype).replace("torch.", "")}
    out.facts["tensors"] = [
        {"name": name, "dtype": _dtype_name(t.dtype), "kind": kind, **_wrapped_storage(t)}
        for kind, items in (("parameter", h.module.named_parameters()), ("buffer", h.module.named_buffers()))
        for name, t in items
        if t.is_floating_point()
    ]
    E, W = h.maps()
    narrow = [t for t in out.facts["tensors"] if (element_bits(t.get("stored", t["dtype"])) or 99) <
              (element_bits(_dtype_name(h.dtype)) or 0)]
    if narrow:
        mark_narrow_reads(h, narrow, E, W)
    # at initialisation the maps may show stored values as they are (T = I: E = Z), exact in a narrower
    # format by construction (a Hadamard or identity memory, float32 draws cast up): not judged for precision
    out.add_state("init", E, W, at_init=True)
    h.generic_state(generic_cond)
    E, W = h.maps()
    out.add_state("generic", E, W)
    return out


# Loaded from the dtype under test, the float64 build holds its stored values: a memory rounded to bfloat16
# sits ~6e-4 off the manifold (V = 2048, D = 32), storage rounding that no defect of the code made. A V x D
# tensor (the memory, a frozen memory, an anchor copy) within this many times sqrt(D) units of its storage
# format from orthonormal is taken to the nearest orthonormal matrix, its polar factor, before the build's
# first step; one further off is left as stored (a parametrisation's raw tensor, or a defect to be seen).
STORAGE_REPROJECT = 4.0


def mark_narrow_reads(h: Harness, narrow: list, E, W) -> None:
    """For each tensor fact in `narrow` (stored narrower than the dtype under test), whether the maps read it:
    zeroed, does E or W change? A tensor that cannot be zeroed and restored counts as read."""
    torch = h.torch
    tensors = {**dict(h.module.named_parameters()), **dict(h.module.named_buffers())}
    for fact in narrow:
        t = tensors[fact["name"]]
        try:
            saved = t.detach().clone()
            with torch.no_grad():
                t.zero_()
            try:
                E0, W0 = h.maps()
                fact["read_by_maps"] = not (np.array_equal(E0, E) and np.array_equal(W0, W))
            finally:
                with torch.no_grad():
                    t.copy_(saved)
        except Exception:
            fact["read_by_maps"] = True


def synced_shadow(h: Harness, shadow, out: Probe):
    """`shadow` (the target built in float64) put at h's state with its stored orthonormal tensors taken back
    to the manifold from the dtype's rounding, or None where there is none or the state does not transfer
    (the judging then has no float64 build to consult). out.facts["shadow_start"] records what was taken
    back, from how far off (checks.judge_shadow)."""
    if shadow is None:
        return None
    try:
        shadow.module.load_state_dict(h.module.state_dict())
    except Exception:
        return None
    torch = h.torch
    stored, start = h.module.state_dict(), {"tall": [], "reprojected": {}}
    with torch.no_grad():
        for name, t in shadow.module.state_dict().items():
            if not (t.is_floating_point() and t.dim() == 2 and sorted(t.shape) == sorted((h.vocab, h.dim))
                    and name in stored):
                continue
            start["tall"].append(name)
            z = t.detach().to("cpu", torch.float64).numpy()
            z = z.T if z.shape[0] < z.shape[1] else z
            gap = stiefel_gap(z)
            u = float(torch.finfo(stored[name].dtype).eps) / 2
            if 0 < gap <= STORAGE_REPROJECT * math.sqrt(h.dim) * u:
                U, _, Vt = np.linalg.svd(z, full_matrices=False)
                polar = U @ Vt
                t.copy_(torch.from_numpy(polar if t.shape[0] >= t.shape[1] else polar.T.copy()).to(t.dtype))
                start["reprojected"][name] = gap
    out.facts["shadow_start"] = start
    return shadow


def stiefel_gap(Z: np.ndarray) -> float:
    """||Z^T Z - I||_2 of a V x D array (a D x D Gram)."""
    G = Z.T @ Z
    return float(np.max(np.abs(np.linalg.eigvalsh(0.5 * (G + G.T)) - 1.0)))


def add_shadow_maps(out: Probe, label: str, shadow) -> None:
    """The float64 build's maps beside state `label`'s: what the same code does without the rounding of the
    dtype under test (checks.judge_shadow)."""
    E64, W64 = shadow.maps()
    out.arrays[f"E64:{label}"] = E64
    out.arrays[f"W64:{label}"] = W64
    # the build is no finer than the coarsest tensor it keeps: one asked for float64 that stores Z in
    # bfloat16 shows bfloat16 rounding, not a defect
    torch = shadow.torch
    stored = [t.dtype for t in list(shadow.module.parameters()) + list(shadow.module.buffers()) if t.is_floating_point()]
    out.facts["shadow_storage"] = _dtype_name(max([shadow.dtype] + stored, key=lambda dt: torch.finfo(dt).eps))


def probe_penrose(h: Harness, generic_cond: float = 10.0, shadow=None, **_) -> Probe:
    """The maps at initialisation, after 3 own steps and at cond(T) = generic_cond. `shadow` (the same target
    built in float64, for a dtype narrower than float32) takes the same 3 steps from the same state."""
    out = Probe()
    shadow = synced_shadow(h, shadow, out)
    out.add_state("init", *h.maps(), cond_target=1.0)
    if shadow is not None:
        add_shadow_maps(out, "init", shadow)
    for _ in range(3):
        h.own_step(h.random_loss())
        if shadow is not None:
            shadow.own_step(shadow.random_loss())  # the same draws: both generators start from the seed
    out.add_state("own steps", *h.maps(), cond_target=None)
    if shadow is not None:
        add_shadow_maps(out, "own steps", shadow)
    reached = h.drive_spectrum(generic_cond)
    out.add_state(reached_label(reached, generic_cond), *h.maps(), cond_target=generic_cond, cond_reached=reached)
    return out


def probe_reference(h: Harness, generic_cond: float = 10.0, **_) -> Probe:
    out = Probe()
    out.add_state("init", *h.maps())
    reached = h.generic_state(generic_cond)
    out.add_state(reached_label(reached, generic_cond), *h.maps(), cond_reached=reached)
    # the maps as the module applies them to batches: gathers and a batched head
    torch = h.torch
    ids = torch.randint(0, h.vocab, (64,), generator=h.generator).to(h.device)
    hid = h.randn(64, h.dim).to(h.dtype)
    # and to batches of sequences, (B, T) ids and (B, T, D) hidden states, as a language model calls them
    ids_grid = torch.randint(0, h.vocab, (4, 16), generator=h.generator).to(h.device)
    hid_grid = h.randn(4, 16, h.dim).to(h.dtype)
    with torch.no_grad():
        out.arrays["ids"] = ids.cpu().numpy()
        out.arrays["embed_rows"] = to_numpy(h.embed(ids))
        out.arrays["hidden"] = to_numpy(hid)
        out.arrays["logits_rows"] = to_numpy(h.logits(hid))
        out.arrays["ids_grid"] = ids_grid.cpu().numpy()
        out.arrays["embed_grid"] = to_numpy(h.embed(ids_grid))
        out.arrays["hidden_grid"] = to_numpy(hid_grid)
        out.arrays["logits_grid"] = to_numpy(h.logits(hid_grid))
    return out


def reached_label(reached: float, target: float) -> str:
    """A state's label by the cond(T) it reached, the drive's target beside it: a module whose T cannot be
    driven is not reported at a conditioning it never had."""
    return f"cond(T) {reached:.3g} (driven toward {target:.0e})"


def probe_conditioning(h: Harness, conds=(), **_) -> Probe:
    """States of rising cond(T) reached through the module's parameters; then zeroed T-side parameters
    (weight decay's limit), which a positive-definite parametrisation survives."""
    out = Probe()
    snapshot = {k: v.detach().clone() for k, v in h.module.state_dict().items()}
    for cond in conds:
        reached = h.drive_spectrum(cond)
        out.add_state(reached_label(reached, cond), *h.maps(), cond_target=cond, cond_reached=reached)
    h.module.load_state_dict(snapshot)
    t_side = {id(p) for p in h.t_side_parameters()}
    attacks = [name for name, p in h.module.named_parameters() if id(p) in t_side]
    out.facts["zeroed"] = []
    for name in attacks:
        h.module.load_state_dict(snapshot)
        with h.torch.no_grad():
            dict(h.module.named_parameters())[name].zero_()
        try:
            h.post_step()
            E, W = h.maps()
        except Exception as exc:  # a clear refusal is what we hope for
            out.facts["zeroed"].append({"parameter": name, "raised": describe_exception(exc)})
            continue
        label = f"zeroed {name}"
        out.add_state(label, E, W, attack=name)
        out.facts["zeroed"].append({"parameter": name, "state": label})
    return out


def _gradients(h: Harness, loss_fn) -> list:
    """Autograd's gradient of loss_fn() for each trainable parameter (zeros where none reaches it)."""
    params = [p for p in h.module.parameters() if p.requires_grad]
    for p in params:
        p.grad = None
    loss_fn().backward()
    return [p.grad.detach().clone() if p.grad is not None else h.torch.zeros_like(p) for p in params]


def _shift(h: Harness, direction, t: float) -> None:
    with h.torch.no_grad():
        for p, d in zip([p for p in h.module.parameters() if p.requires_grad], direction):
            p.add_(t * d.to(p.device, p.dtype))


def probe_gradients(h: Harness, fd_harness=None, generic_cond: float = 10.0, **_) -> Probe:
    """Autograd's directional derivative of a fixed loss through embed and logits, against central
    differences in the widest precision the target builds in (fd_harness), at a generic state."""
    torch = h.torch
    out = Probe()
    work = fd_harness or h
    out.facts["cond_T"] = work.generic_state(generic_cond)
    g = torch.Generator().manual_seed(h.seed + 7)
    ids = torch.randint(0, h.vocab, (32,), generator=g)
    hid = torch.randn(32, h.dim, generator=g, dtype=torch.float64)
    r_in = torch.randn(32, h.dim, generator=g, dtype=torch.float64)
    r_out = torch.randn(32, h.vocab, generator=g, dtype=torch.float64) / math.sqrt(h.vocab)

    def loss_of(hh: Harness):
        def loss():
            e = hh.embed(ids.to(hh.device)).to(torch.float64)
            lg = hh.logits(hid.to(hh.device, hh.dtype)).to(torch.float64)
            return (e * r_in.to(e.device)).sum() + (lg * r_out.to(lg.device)).sum()
        return loss

    params = [p for p in work.module.parameters() if p.requires_grad]
    direction = work.random_direction(params, g)
    # the differences resolve no finer than the coarsest parameter they shift: a build asked for float64
    # that keeps a bfloat16 parameter rounds every shift to bfloat16
    fd_dtype = max([work.dtype] + [p.dtype for p in params if p.is_floating_point()],
                   key=lambda dt: torch.finfo(dt).eps)
    out.facts["fd_dtype"] = str(fd_dtype).replace("torch.", "")
    out.facts["reference_dtype"] = str(work.dtype).replace("torch.", "")  # the build whose autograd is compared
    out.facts["parameters"] = len(params)
    if not params:
        return out
    g_wide = _gradients(work, loss_of(work))
    ad = work.dot(params, g_wide, direction)
    fd = {}
    u = float(torch.finfo(fd_dtype).eps) / 2
    snapshot = {k: v.detach().clone() for k, v in work.module.state_dict().items()}
    for step in (u ** (1 / 3), 0.5 * u ** (1 / 3)):
        with torch.no_grad():
            _shift(work, direction, step)
            plus = float(loss_of(work)())
            work.module.load_state_dict(snapshot)
            _shift(work, direction, -step)
            minus = float(loss_of(work)())
            work.module.load_state_dict(snapshot)
        fd[step] = (plus - minus) / (2 * step)
    steps = sorted(fd)
    # Richardson: removes the O(t^2) term of central differences
    fd_value = (4 * fd[steps[0]] - fd[steps[1]]) / 3
    out.facts.update({"autograd": ad, "finite_difference": fd_value, "fd_at_step": fd[steps[1]],
                      "fd_at_half_step": fd[steps[0]], "fd_step": steps[1]})
    out.facts["loss_scale"] = float(abs(loss_of(work)().detach()))
    out.facts["components"] = gradient_components(work, params, direction, parts_of(work, ids, hid, r_in, r_out),
                                                  steps)
    if fd_harness is not None:
        # the target in the dtype under test, at the same state, against the widest build's autograd
        h.module.load_state_dict(work.module.state_dict())
        h_params = [p for p in h.module.parameters() if p.requires_grad]
        if len(h_params) == len(params):
            g_test = _gradients(h, loss_of(h))
            out.facts["autograd_under_test"] = h.dot(h_params, g_test, direction)
            # the size of the terms the derivative sums: sum_i |g_i d_i| of the widest build. A random
            # direction is nearly orthogonal to the gradient in V D dimensions, so |sum_i g_i d_i| may be far
            # below it, and the dtype's rounding of each g_i is then amplified in the sum (check_gradients)
            out.facts["autograd_magnitude"] = work.dot(params, [g.abs() for g in g_wide], [d.abs() for d in direction])
            if all(a.shape == b.shape for a, b in zip(h_params, params)):
                # each parameter's gradient against the widest build's, in norm: the derivatives along the
                # worst direction in that parameter's block, which no cancellation hides
                names = [n for n, p in work.module.named_parameters() if p.requires_grad]
                blocks = []
                for name, p_test, p_wide, a, b in zip(names, h_params, params, g_test, g_wide):
                    diff = a.to(torch.float64) - b.to(a.device, torch.float64)
                    blocks.append({"parameter": name, "norm": math.sqrt(work.squared_norm([p_wide], [b])),
                                   "difference": math.sqrt(h.squared_norm([p_test], [diff]))})
                out.facts["gradient_blocks"] = blocks
            # state the state_dict does not carry (a memory kept outside parameters and buffers) leaves the
            # two builds at different points, where their derivatives need not agree
            with torch.no_grad():
                e_test = h.embed(ids.to(h.device)).to(torch.float64).cpu()
                e_wide = work.embed(ids.to(work.device)).to(torch.float64).cpu()
            out.facts["state_transfer_error"] = float((e_test - e_wide).norm() / max(float(e_wide.norm()), 1e-300))
    return out


def parts_of(hh: Harness, ids, hid, r_in, r_out):
    """The gradients probe's loss split by map: (embed's term, logits' term), as float64 scalars."""
    torch = hh.torch

    def parts():
        e = hh.embed(ids.to(hh.device)).to(torch.float64)
        lg = hh.logits(hid.to(hh.device, hh.dtype)).to(torch.float64)
        return {"embed": (e * r_in.to(e.device)).sum(), "logits": (lg * r_out.to(lg.device)).sum()}
    return parts


def gradient_components(h: Harness, params: list, direction: list, parts, steps: list) -> list:
    """The directional derivative of each map's term along each parameter's block of `direction`, by
    autograd and by central differences at `steps` (checks.check_gradients judges each): a wrong backward
    named by its parameter and its map. Parameter blocks are shifted one at a time, both maps read at once."""
    torch = h.torch
    names = {id(p): n for n, p in h.module.named_parameters()}
    maps = list(parts())
    autograd = {m: _gradients(h, lambda m=m: parts()[m]) for m in maps}
    snapshot = {k: v.detach().clone() for k, v in h.module.state_dict().items()}
    rows = []
    for k, p in enumerate(params):
        block = [d if i == k else torch.zeros_like(d) for i, d in enumerate(direction)]
        fd = {}
        for step in steps:
            with torch.no_grad():
                _shift(h, block, step)
                plus = {m: float(v) for m, v in parts().items()}
                h.module.load_state_dict(snapshot)
                _shift(h, block, -step)
                minus = {m: float(v) for m, v in parts().items()}
                h.module.load_state_dict(snapshot)
            fd[step] = {m: (plus[m] - minus[m]) / (2 * step) for m in maps}
        with torch.no_grad():
            values = {m: float(abs(v)) for m, v in parts().items()}
        small, big = sorted(steps)
        for m in maps:
            rows.append({"parameter": names.get(id(p), f"parameter {k}"), "map": m,
                         "autograd": h.dot([p], [autograd[m][k]], [direction[k]]),
                         "finite_difference": (4 * fd[small][m] - fd[big][m]) / 3,
                         "fd_at_step": fd[big][m], "fd_at_half_step": fd[small][m], "loss_scale": values[m]})
    return rows


def adversary_loss(h: Harness, step: int, rng: np.random.Generator, params: AdversaryParams = AdversaryParams()):
    """The adversaries' channels as losses on the module's outputs: gaussian (dense random functional of
    both maps), dense output (softmax cross-entropy residual of the head at Zipf targets), sparse input
    (a Zipf batch of embedding rows), spike (with probability spike_probability, a burst spike_scale
    times the usual size), with the gradient models' parameters (pitcheck.model.gradients). Returns the loss
    and the norm its gradient is scaled to."""
    torch = h.torch
    V, D, batch = h.vocab, h.dim, params.batch
    zipf = 1.0 / np.arange(1, V + 1) ** params.zipf_exponent
    zipf /= zipf.sum()
    ids = torch.from_numpy(rng.choice(V, size=batch, p=zipf)).to(h.device)
    hid = torch.from_numpy(rng.standard_normal((batch, D))).to(h.device, h.dtype)
    r_in = torch.from_numpy(rng.standard_normal((batch, D)) / math.sqrt(D)).to(h.device)
    r_out = torch.from_numpy(rng.standard_normal((batch, V)) / math.sqrt(V)).to(h.device)
    targets = torch.from_numpy(rng.choice(V, size=batch, p=zipf)).to(h.device)
    burst = rng.random() < params.spike_probability
    lg = h.logits(hid).to(torch.float64)
    e = h.embed(ids).to(torch.float64)
    gaussian = (e * r_in).sum() + (lg * r_out).sum()
    dense_output = torch.nn.functional.cross_entropy(lg, targets)
    sparse_input = (e * r_in).sum()
    # a spike: the step's gradient spike_scale times the usual norm
    return gaussian + dense_output + sparse_input, (params.spike_scale if burst else 1.0)


def probe_trajectory(h: Harness, steps: int = 200, shadow=None, **_) -> Probe:
    """N steps of the module's own optimizer and post_step on the adversaries' losses; maps at log-spaced
    steps. `shadow` (the same target built in float64) is driven by the same losses."""
    out = Probe()
    rng_seed = h.seed + 11
    marks = sorted({0, steps, *np.unique(np.round(np.logspace(0, math.log10(max(steps, 1)), 8)).astype(int))})
    marks = [m for m in marks if m <= steps]
    rng = np.random.default_rng(rng_seed)
    shadow_rng = np.random.default_rng(rng_seed)
    shadow = synced_shadow(h, shadow, out)
    # the memory's orthonormality is measured on the memory itself where the optimizer's V x D tensor is
    # found (the maps show only W E, whose error may lie in the solves or the head)
    memory = h.memory_access()
    if memory is not None:
        out.facts["memory"] = memory.name
    for step in range(steps + 1):
        if step in marks:
            E, W = h.maps()
            facts = {"step": step}
            if memory is not None:
                Z = memory.read()
                facts["memory_orthonormality"] = stiefel_gap(Z)
                if step == 0:
                    out.arrays["memory:step 0"] = Z  # whether it is the Z the maps use (checks.check_trajectory)
            if shadow is not None:
                add_shadow_maps(out, f"step {step}", shadow)
                E64, W64 = out.arrays[f"E64:step {step}"], out.arrays[f"W64:step {step}"]
                facts["shadow_E"] = float(np.linalg.norm(E - E64) / max(np.linalg.norm(E64), 1e-300))
                facts["shadow_W"] = float(np.linalg.norm(W - W64) / max(np.linalg.norm(W64), 1e-300))
            out.add_state(f"step {step}", E, W, **facts)
        if step == steps:
            break
        h.own_step(*adversary_loss(h, step, rng))
        if shadow is not None:
            shadow.own_step(*adversary_loss(shadow, step, shadow_rng))
    return out


# step sizes of the retraction probe's first-order test: t^2 (1e-3) far above fp32 rounding of the
# residual, t small enough that the t^3 term barely moves the fitted order, and an O(t) residual 1/t = 32
# times t^2 (above the threshold 16)
RETRACTION_STEPS = (2.0**-5, 2.0**-6)


def memory_parameter(h: Harness):
    """(name, tensor, transposed) of the V x D tensor the optimizer moves (the memory Z), or None.

    Among trainable floating tensors of shape (V, D) or (D, V) that the module's optimizer updates (its
    parameters when it has none), the one nearest orthonormal: a parametrisation's raw tensor is not."""
    torch = h.torch
    names = {id(p): n for n, p in h.module.named_parameters()}
    moved = ([p for g in h.optimizer.param_groups for p in g["params"]] if h.optimizer is not None
             else list(h.module.parameters()))
    best = None
    for p in moved:
        if not (p.is_floating_point() and p.requires_grad and p.dim() == 2):
            continue
        if tuple(p.shape) == (h.vocab, h.dim):
            transposed = False
        elif tuple(p.shape) == (h.dim, h.vocab):
            transposed = True
        else:
            continue
        with torch.no_grad():
            z = p.detach().to(torch.float64)
            z = z.T if transposed else z
            off = float(torch.linalg.matrix_norm(z.T @ z - torch.eye(h.dim, dtype=torch.float64, device=z.device), 2))
        if best is None or not off >= best[0]:
            best = (off, names.get(id(p), "(optimizer tensor)"), p, transposed)
    return None if best is None else best[1:]


class MemoryAccess:
    """The memory Z as a float64 V x D array, read from and written to the tensor that stores it (transposed
    when it is stored D x V)."""

    def __init__(self, harness: Harness, name: str, tensor, transposed: bool):
        self.harness, self.name, self.tensor, self.transposed = harness, name, tensor, transposed

    def anchors(self) -> list:
        """Buffers holding a copy of the memory (a Cayley anchor: the point last retracted to)."""
        torch, memory = self.harness.torch, self.tensor
        # a copy has the memory's dtype and device: torch.equal would raise on a float8 buffer of its shape
        return [b for _, b in self.harness.module.named_buffers()
                if b.shape == memory.shape and b.dtype == memory.dtype and b.device == memory.device
                and torch.equal(b, memory)]

    def read(self) -> np.ndarray:
        z = to_numpy(self.tensor)
        return z.T.copy() if self.transposed else z

    def write(self, z: np.ndarray, *also) -> None:
        torch, memory = self.harness.torch, self.tensor
        t = torch.from_numpy(z.T.copy() if self.transposed else z).to(memory.device, memory.dtype)
        with torch.no_grad():
            for x in (memory, *also):
                x.copy_(t.to(x.dtype))


def probe_retraction(h: Harness, own_steps: int = 3, **_) -> Probe:
    """post_step as a retraction R of the stored memory Z (V x D), at a state after a few own steps:
    R(Z, 0) (post_step with no move); R(Z Q, 0) at another point of the manifold (Q a random orthogonal
    D x D: a retraction fixes every point, not only those its own convention produces); and R(Z + t xi)
    for a tangent xi at two step sizes. The memory is set directly and the module's state (Cayley anchors,
    buffers) restored from a state_dict before each call; buffers that hold a copy of the memory (an
    anchor: the point the module last retracted to) move with it to Z Q, and stay at Z for Z + t xi (the
    optimizer's move from there). xi = (I - Z Z^T) G + Z Omega (Omega skew): O(V D^2), no V x V matrix."""
    torch = h.torch
    out = Probe()
    out.facts["post_step"] = callable(getattr(h.module, "post_step", None))
    if not out.facts["post_step"]:
        return out
    for _ in range(own_steps):
        h.own_step(h.random_loss())
    memory = h.memory_access()
    if memory is None:
        return out
    out.facts.update({"memory": memory.name, "memory_dtype": str(memory.tensor.dtype).replace("torch.", ""),
                      "steps": list(RETRACTION_STEPS)})
    h.retraction_start(memory)
    out.add_state("state", *h.maps())
    read, write = memory.read, memory.write
    anchors = memory.anchors()

    snapshot = {k: v.detach().clone() for k, v in h.module.state_dict().items()}
    Z = read()
    out.arrays["Z"] = Z
    h.post_step()
    out.arrays["R0"] = read()
    g = torch.Generator().manual_seed(h.seed + 17)
    q, r = torch.linalg.qr(torch.randn(h.dim, h.dim, generator=g, dtype=torch.float64))
    rotation = (q * torch.sign(torch.diagonal(r))).numpy()
    h.module.load_state_dict(snapshot)
    write(Z @ rotation, *anchors)
    out.arrays["ZQ"] = read()
    h.post_step()
    out.arrays["RQ"] = read()
    G = torch.randn(h.vocab, h.dim, generator=g, dtype=torch.float64).numpy()
    A = torch.randn(h.dim, h.dim, generator=g, dtype=torch.float64).numpy()
    xi = G - Z @ (Z.T @ G) + Z @ (0.5 * (A - A.T))
    xi *= np.linalg.norm(Z) / np.linalg.norm(xi)
    for t in RETRACTION_STEPS:
        h.module.load_state_dict(snapshot)
        write(Z, *anchors)  # state outside the state_dict (a memory kept as an attribute) back at Z too
        write(Z + t * xi)
        out.arrays[f"X:{t!r}"] = read()  # the point as stored (rounded to the memory's dtype)
        h.post_step()
        out.arrays[f"Y:{t!r}"] = read()
    return out


def probe_checkpoint(h: Harness, fresh=None, **_) -> Probe:
    """state_dict -> a fresh instance built with another seed -> load_state_dict (optimizer state too)
    -> one step, against the uninterrupted module taking the same step."""
    out = Probe()
    for _ in range(3):
        h.own_step(h.random_loss())
    out.add_state("before", *h.maps())
    fresh.module.load_state_dict(h.module.state_dict())
    if h.optimizer is not None and fresh.optimizer is not None:
        fresh.optimizer.load_state_dict(h.optimizer.state_dict())
    out.add_state("loaded", *fresh.maps())
    seed = h.seed + 13
    for harness in (h, fresh):
        harness.generator.manual_seed(seed)
        harness.own_step(harness.random_loss())
    out.add_state("uninterrupted after step", *h.maps())
    out.add_state("resumed after step", *fresh.maps())
    return out


def _attempt(fn) -> dict:
    """fn()'s value (a tensor copied to the CPU), or what it raised. The copy is made inside: on CUDA a
    kernel's error (a device-side assert) surfaces only when its result is read, and is this call's."""
    torch = _torch()
    try:
        value = fn()
        if isinstance(value, torch.Tensor):
            value = value.detach().to("cpu")
    except Exception as exc:
        return {"raised": describe_exception(exc)}
    return {"value": value}


def probe_bad_input(h: Harness, done: Probe | None = None, after_case=None, **_) -> Probe:
    """Each bad input's result or refusal. done: the cases an earlier worker ran before its device context
    was lost (a device-side assert on an out-of-range id is CUDA's refusal, and poisons the process); they
    are kept and the rest run here. after_case(probe) is called after each case with the cases so far."""
    torch = h.torch
    out = Probe()
    V, D = h.vocab, h.dim
    cases = {
        "id -1": lambda: h.embed(torch.tensor([0, -1], device=h.device)),
        "id V": lambda: h.embed(torch.tensor([0, V], device=h.device)),
        "float ids": lambda: h.embed(torch.tensor([0.0, 1.0], device=h.device)),
        "empty batch": lambda: h.embed(torch.zeros(0, dtype=torch.long, device=h.device)),
    }
    hid = h.randn(3, D).to(h.dtype)
    with torch.no_grad():
        clean = to_numpy(h.logits(hid))
        first_row = to_numpy(h.embed(torch.tensor([0, V - 1], device=h.device)))
    out.arrays["clean_logits"] = clean
    out.arrays["rows_0_last"] = first_row
    for name, bad in (("nan hidden row", math.nan), ("inf hidden row", math.inf)):
        def call(bad=bad):
            x = hid.clone()
            x[1] = bad
            return h.logits(x)
        cases[name] = call
    earlier = done.facts.get("cases", {}) if done is not None else {}
    results = out.facts["cases"] = {}
    for name, fn in cases.items():
        if name in earlier:
            results[name] = earlier[name]
            if f"value:{name}" in done.arrays:
                out.arrays[f"value:{name}"] = done.arrays[f"value:{name}"]
            continue
        with torch.no_grad():
            r = _attempt(fn)
        if "value" in r:
            value = r.pop("value")
            r["shape"] = list(value.shape)
            out.arrays[f"value:{name}"] = to_numpy(value)
        results[name] = r
        if after_case is not None:
            after_case(out)
    return out


def probe_scale(h: Harness, **_) -> Probe:
    """logits(c h) for c = 2^k across the dtype's exponent range (exact scalings), against c logits(h)."""
    torch = h.torch
    out = Probe()
    info = torch.finfo(h.dtype)
    hid = h.randn(4, h.dim).to(h.dtype)
    with torch.no_grad():
        base = h.logits(hid)
    out.arrays["base"] = to_numpy(base)
    out.arrays["hidden"] = to_numpy(hid)
    lo, hi = int(math.log2(info.tiny)), int(math.log2(info.max))
    exponents = list(range(lo, hi + 1, max(1, (hi - lo) // 40)))
    out.facts["exponents"] = exponents
    out.facts["max"] = float(info.max)
    out.facts["tiny"] = float(info.tiny)
    out.facts["scaled"] = []
    for k in exponents:
        with torch.no_grad():
            r = _attempt(lambda: h.logits(hid * (2.0 ** k)))
        if "value" in r:
            out.arrays[f"scaled:{k}"] = to_numpy(r.pop("value"))
        out.facts["scaled"].append({"exponent": k, **r})
    return out
