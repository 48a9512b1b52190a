"""A run's configuration (RunConfig) and its refusals: every value of its type, in range and meaningful
with the others, checked before anything is built."""
from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..model.engine import StepSettings
from ..infra.errors import PitcheckError
from ..model.gradients import AdversaryParams, check_adversary_params, check_stream
from ..sources import builtin  # noqa: F401  (registers the built-in stateful sources)
from ..numerics.reference import check_shapes
from ..sources.stateful import STATEFUL_SOURCES, adversary_names
from .memory import check_memory
from .plan import GPU_MIN_ELEMENTS, Plan, resolve, run_device  # noqa: F401  (GPU_MIN_ELEMENTS, run_device: this module's API)
from .teacher import teacher_shape

# beyond this T0's smallest eigenvalue is below float64's resolution of its largest (u = 1.1e-16), and
# its Cholesky factorisation can fail (it does at 1e17)
MAX_COND = 1e15
# far past any run, and small enough that the log-spaced grid of recorded steps stays exact
MAX_STEPS = 10**12


def is_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def check_argument(name: str, value, types: tuple, expected: str) -> None:
    """A Python API argument of one of `types` (bool counts only where named: it is an int to isinstance),
    else a one-line PitcheckError naming the argument, what it takes and what it got."""
    if isinstance(value, types) and (bool in types or not isinstance(value, bool)):
        return
    shown = repr(value)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    raise PitcheckError(f"{name} must be {expected}, got {type(value).__name__} {shown}")


@dataclass(frozen=True)
class RunConfig:
    backend: str | None = None  # None: default_backend(precision), the numpy reference for fp64, else torch
    precision: str = "fp64"
    retraction: str = "qr"
    reproject_every: int = 0
    reproject_threshold: float = 0.0
    adversary: str = "gaussian"
    head: str = "pit"  # pit, or the baselines tied (W = E^T) and untied (two tables)
    optimizer: str = "sgd"
    lr: float = 1e-2
    steps: int = 300
    vocab: int = 1024
    dim: int = 32
    cond: float = 1.0  # condition number of the initial T (1: T = I as in the paper)
    teacher: str = ""  # a V x D embedding table the run starts from (teacher.py: FILE.npy, FILE.gguf:TENSOR, ...)
    teacher_mode: str = ""  # the conversion of the teacher's start ("": teacher.start_mode's default)
    gradient_stream: str = "numpy"  # where the stateless models draw: numpy (host) or counter (the run's device)
    seed: int = 0
    device: str = "auto"
    records_per_decade: int = 10
    shadow: bool = True  # torch backend: step a float64 shadow alongside (numpy; torch float64 on CUDA)
    shards: int = 1  # > 1: Z row-sharded over this many gloo ranks (trajectory/sharded.py)
    pad_multiple: int = 0  # sharded: pad the vocabulary with zero rows to a multiple of this times shards
    allreduce_dtype: str = ""  # sharded: the dtype sums cross the ranks in ("": the tensors' own)
    adversary_params: AdversaryParams = field(default_factory=AdversaryParams)
    lm: Any = None  # the lm source's options (its model and batches), as its registry record parses them

    def __post_init__(self):
        # whether the backend was given (not a field: the manifest and a cell's name stay as they were); a
        # refusal of it then names the option given, or the default that chose it
        object.__setattr__(self, "backend_given", self.backend is not None)
        if self.backend is None:  # the Python API infers it as the CLI and compare do
            object.__setattr__(self, "backend", default_backend(self.precision))
        # a grid's [fixed.lm] table or a manifest's dict
        for source in STATEFUL_SOURCES.values():
            object.__setattr__(self, source.config_field, source.options(getattr(self, source.config_field)))

    def validate(self, here: bool = False) -> Plan:
        """Every value of its type, in range and meaningful with the others; a one-line reason if not. Returns
        its plan (resolve), which the checks resolved.

        here: also that it can run on this machine (the CUDA device it names is present). A stress file
        checks its scenarios without it (a CUDA scenario is skipped, not refused, without a GPU)."""
        for name in ("backend", "precision", "retraction", "adversary", "head", "optimizer", "teacher", "teacher_mode",
                     "gradient_stream", "device"):
            if not isinstance(getattr(self, name), str):
                raise PitcheckError(f"{name} must be a string, got {getattr(self, name)!r}")
        if not isinstance(self.shadow, (bool, np.bool_)):
            raise PitcheckError(f"shadow must be true or false, got {self.shadow!r}")
        if not isinstance(self.adversary_params, AdversaryParams):
            raise PitcheckError(f"adversary_params must be a table, got {self.adversary_params!r}")
        for name in ("vocab", "dim", "steps", "seed", "reproject_every", "records_per_decade"):
            if not is_int(getattr(self, name)):
                raise PitcheckError(f"{name} must be an integer, got {getattr(self, name)!r}")
        for name in ("lr", "cond", "reproject_threshold"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
                raise PitcheckError(f"{name} must be a number, got {value!r}")
        check_shapes(self.vocab, self.dim)
        if self.teacher_mode and not self.teacher:
            raise PitcheckError(f"--teacher-mode {self.teacher_mode} converts a teacher: give --teacher")
        if self.backend not in ("numpy", "torch"):
            raise PitcheckError(f"unknown backend {self.backend!r}; choose numpy or torch")
        plan = self.resolve()
        source = plan.source
        if self.teacher and teacher_shape(self.teacher) != (self.vocab, self.dim) and not (
                source and source.teacher_fits(self, teacher_shape(self.teacher))):
            raise PitcheckError(f"teacher {self.teacher} is {teacher_shape(self.teacher)}, "
                                f"not V x D = ({self.vocab}, {self.dim})")
        check_memory(self.vocab, self.dim)
        if not 0 <= self.steps <= MAX_STEPS:
            raise PitcheckError(f"--steps must be in [0, {MAX_STEPS:.0e}], got {self.steps}")
        if self.seed < 0:
            raise PitcheckError(f"--seed must be >= 0, got {self.seed}")
        if not (math.isfinite(self.cond) and 1 <= self.cond <= MAX_COND):
            raise PitcheckError(f"--cond must be a number in [1, {MAX_COND:.0e}] (float64 cannot hold a more "
                                f"ill-conditioned T0), got {self.cond}")
        if plan.teacher_mode and self.cond != 1:
            raise PitcheckError(f"--cond {self.cond:g} sets T0, which the teacher's conversion "
                                f"({plan.teacher_mode}) fixes; drop --cond, or give a .npy or safetensors "
                                "teacher, whose start is its polar factor with any T0")
        if self.records_per_decade < 1:
            raise PitcheckError("records_per_decade must be >= 1")
        if self.backend == "numpy" and self.precision != "fp64":
            raise PitcheckError(f"the numpy backend is the float64 reference: precision {self.precision} needs "
                                "the torch backend")
        check_device(self.device, self.backend)
        if here:
            check_device_present(self.device)
        check_adversary_params(self.adversary_params)
        if not plan.head.has_retraction:
            if plan.adaptive:
                raise PitcheckError("the adaptive adversary probes PIT's drift bound: use it with --head pit")
            # the baselines would ignore these: refuse them rather than record a setting that did nothing
            ignored = [opt for opt, given in (("--retraction", self.retraction != RunConfig.retraction),
                                              ("--reproject-every", self.reproject_every != 0),
                                              ("--reproject-threshold", self.reproject_threshold != 0),
                                              ("--cond", self.cond != 1),
                                              ("--teacher-mode", bool(self.teacher_mode))) if given]
            if ignored:
                raise PitcheckError(f"--head {self.head} has no retraction, re-projection or T: "
                                    f"{', '.join(ignored)} only make sense with --head pit")
        if source:
            source.check_config(self)
        check_stream(self.gradient_stream, list(plan.adversaries))
        if self.gradient_stream == "counter" and self.seed >= 2**32:
            raise PitcheckError(f"--seed must be below 2^32 with --gradient-stream counter (the generator's key is a "
                                f"32-bit word), got {self.seed}")
        if self.gradient_stream != "numpy" and self.shards > 1:
            raise PitcheckError(f"--gradient-stream {self.gradient_stream} is drawn by one process: a sharded run "
                                "draws --gradient-stream numpy")
        check_placement(self, plan)
        check_sharding(self, plan)
        return plan

    def settings(self) -> StepSettings:
        return StepSettings(self.retraction, self.optimizer, self.lr, self.reproject_every, self.reproject_threshold)

    def resolve(self) -> Plan:
        """The objects its names stand for (trajectory.plan): what every part of a run takes."""
        return resolve(self)

    def to_json(self) -> dict:
        d = asdict(self)
        # at their defaults, a run's config (and a cell's name) is what it was before these options existed
        if not self.teacher_mode:
            d.pop("teacher_mode")
        if self.gradient_stream == "numpy":
            d.pop("gradient_stream")
        if self.shards == 1:  # an unsharded run's config (and a sweep cell's name) is what it was before
            for name in SHARDING_FIELDS:
                d.pop(name)
        for source in STATEFUL_SOURCES.values():
            if source.name not in adversary_names(self.adversary):
                # its options change nothing then: left out, a run's config (and a sweep cell's name) is
                # what it was before the source existed
                d.pop(source.config_field)
        return d

    @classmethod
    def from_json(cls, d: dict) -> "RunConfig":
        d = dict(d)
        d["adversary_params"] = AdversaryParams(**d.get("adversary_params", {}))
        return cls(**d)


# optimizers that keep no moments: a placement of the moments has nothing to quantise under them
MOMENTLESS_OPTIMIZERS = ("sgd",)


def check_placement(cfg: RunConfig, plan: Plan) -> None:
    """A placement that touches none of the run's tensors is refused, as a sharded run refuses one: it would be
    recorded in the manifest but never applied, and the run's numbers would be its plain precision's."""
    placement = plan.policy.placement
    if placement is None:
        return
    inert = {"moments"} if cfg.optimizer in MOMENTLESS_OPTIMIZERS else set()
    if placement.roles() <= inert:
        raise PitcheckError(f"--precision {cfg.precision} quantises only the optimizer's moments, and --optimizer "
                            f"{cfg.optimizer} keeps none: the placement would never apply; use --optimizer adam "
                            f"or momentum, or --precision fp32")


SHARDING_FIELDS = ("shards", "pad_multiple", "allreduce_dtype")
ALLREDUCE_DTYPES = ("fp64", "fp32", "bf16")


def check_sharding(cfg: RunConfig, plan: Plan) -> None:
    """--shards, --pad-multiple and --allreduce-dtype: in range, and only where a sharded run can run."""
    for name in ("shards", "pad_multiple"):
        if not is_int(getattr(cfg, name)):
            raise PitcheckError(f"{name} must be an integer, got {getattr(cfg, name)!r}")
    if not isinstance(cfg.allreduce_dtype, str):
        raise PitcheckError(f"allreduce_dtype must be a string, got {cfg.allreduce_dtype!r}")
    if not 1 <= cfg.shards <= cfg.vocab:
        raise PitcheckError(f"--shards must be in [1, V = {cfg.vocab}] (every rank owns at least one row), "
                            f"got {cfg.shards}")
    if cfg.pad_multiple < 0:
        raise PitcheckError(f"--pad-multiple must be >= 0 (0: no padding), got {cfg.pad_multiple}")
    if cfg.allreduce_dtype not in ("",) + ALLREDUCE_DTYPES:
        raise PitcheckError(f"unknown --allreduce-dtype {cfg.allreduce_dtype!r}; choose {', '.join(ALLREDUCE_DTYPES)}")
    if cfg.shards == 1:
        given = [opt for opt, on in (("--pad-multiple", cfg.pad_multiple), ("--allreduce-dtype", cfg.allreduce_dtype))
                 if on]
        if given:
            raise PitcheckError(f"{', '.join(given)} only make sense with --shards N > 1")
        return
    policy = plan.policy
    refusals = [
        (cfg.backend != "torch", "runs on the torch backend (torch.distributed): " + (
            f"not --backend {cfg.backend}; give --backend torch" if cfg.backend_given else
            f"precision {cfg.precision} runs on {cfg.backend} by default; give --backend torch")),
        (cfg.device.startswith("cuda"), "runs its ranks on the CPU (gloo): use --device cpu"),
        (cfg.head != "pit", "shards PIT's Z: use --head pit"),
        (bool(plan.source), f"takes the stateless adversaries, not {cfg.adversary}"),
        (bool(cfg.reproject_every or cfg.reproject_threshold), "has no distributed re-projection: drop --reproject-*"),
        # the ranks step the plain policy: a placement would be recorded in the manifest but never applied
        (bool(policy.placement), f"applies no placement (8- or 4-bit copies, moments, gradients) on its ranks: "
                                 f"{cfg.precision} runs unsharded"),
        (policy.matmul != policy.factor, f"needs a precision whose matmuls run in the factor dtype (the distributed "
                                         f"retractions do not emulate {policy.matmul} matmuls), not {cfg.precision}"),
    ]
    for refused, why in refusals:
        if refused:
            raise PitcheckError(f"--shards {cfg.shards} {why}")
    from ..model.sharded import SHARDED_RETRACTIONS  # deferred: it imports torch, which only a sharded run needs

    if cfg.retraction not in SHARDED_RETRACTIONS:
        raise PitcheckError(f"--shards {cfg.shards}: no distributed retraction {cfg.retraction!r}; choose from "
                            f"{', '.join(SHARDED_RETRACTIONS)}")


DEVICE = re.compile(r"(auto|cpu|cuda(:[0-9]+)?)\Z", re.ASCII)


def default_backend(precision: str) -> str:
    """The backend a precision runs on when none is given: fp64 on the numpy reference, every other
    precision on torch (compare's cells and `pitcheck run` alike)."""
    return "numpy" if precision == "fp64" else "torch"


def check_device(device: str, backend: str) -> None:
    """auto, cpu or cuda[:N], and CUDA only on the torch backend."""
    if not DEVICE.match(device):
        raise PitcheckError(f"unknown device {device!r}; choose auto, cpu, cuda or cuda:N")
    if device.startswith("cuda") and backend == "numpy":
        # the float64 reference computes with numpy on the CPU: a run recorded as on CUDA would be false
        raise PitcheckError(f"device {device}: the numpy backend runs on the CPU only (use --backend torch)")


def check_device_present(device: str) -> None:
    """A CUDA device asked for is one torch sees on this machine."""
    if not device.startswith("cuda"):
        return
    import torch  # deferred: seconds to import, and only a CUDA device needs it here

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    index = int(device.partition(":")[2] or 0)
    if index >= count:
        raise PitcheckError(f"device {device} asked for, but torch sees "
                            f"{'no CUDA device' if not count else f'{count} CUDA device(s)'}")


def recorded_steps(steps: int, per_decade: int) -> list[int]:
    """0, then log-spaced steps, then the last: dense early, where drift starts."""
    if steps == 0:
        return [0]
    n = max(2, int(math.ceil(per_decade * math.log10(max(steps, 10)))) + 1)
    grid = np.unique(np.round(np.logspace(0, math.log10(steps), n)).astype(int))
    return sorted({0, *grid.tolist(), steps})
