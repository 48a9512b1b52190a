"""A run's plan: the names of its config resolved, once, into the objects that step it.

A RunConfig carries names (a precision, a head, an adversary, a device) because a manifest and a cell's name
record them. `RunConfig.resolve()` turns them into objects here, and everything that steps a run takes the
plan: the lockstep and its engines, the loop, a batch of runs, the sharded ranks, compare's cells and bench.
This is the one module that looks a run's names up in the registries of precisions, heads, gradient models
and stateful sources, and the one that decides where 'auto' puts a run.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from ..model.engine import StepSettings
from ..model.gradients import parse_adversary
from ..model.heads import get_head
from ..numerics.policy import Policy, get_policy
from ..sources.stateful import StatefulSource, stateful_source
from .teacher import start_mode

# 'auto' puts a run on CUDA only from this many entries of Z (V x D) up: below it a GPU step is kernel launches
# and synchronisations. Measured on an H100 machine (scripts/measurements/device_crossover.py, results/gpu/h100/crossover.json;
# torch fp32 qr, the CPU at one thread as compare's pool pins it), ms a whole run step CPU / CUDA: 128 x 8
# 1.97 / 6.89, 512 x 16 2.60 / 5.71, 2048 x 64 19.2 / 14.4, 8192 x 128 262 / 72.3: the ratio crosses 1 near 2^16.
GPU_MIN_ELEMENTS = 2 ** 16


def run_device(config) -> str:
    """The device a run's arithmetic runs on: its device as given (cpu, cuda, cuda:N); 'auto' is CUDA where torch
    sees one and Z has at least GPU_MIN_ELEMENTS entries, else the CPU. The numpy backend's is the CPU."""
    if config.backend == "numpy":
        return "cpu"
    if config.device != "auto":
        return config.device
    if config.vocab * config.dim < GPU_MIN_ELEMENTS:
        return "cpu"
    import torch  # deferred: seconds to import, and only a large torch run needs it here

    return "cuda" if torch.cuda.is_available() else "cpu"


@dataclass(frozen=True)
class Sharding:
    """How Z is split over ranks: the options only a sharded run reads, together."""
    shards: int = 1  # > 1: Z row-sharded over this many gloo ranks
    pad_multiple: int = 0  # pad the vocabulary with zero rows to a multiple of this times shards (0: none)
    allreduce_dtype: str = ""  # the dtype sums cross the ranks in ("": the tensors' own)

    @property
    def sharded(self) -> bool:
        return self.shards > 1


@dataclass(frozen=True)
class Plan:
    config: object  # the RunConfig it resolves (its plain values: seed, steps, shapes)
    policy: Policy  # the run's precision
    reference_policy: Policy  # fp64: the float64 shadow's
    head: type  # the head's class (heads.HEAD_TYPES): has_retraction, not_applicable
    adversaries: tuple[str, ...]  # the gradient models the adversary sums
    source: StatefulSource | None  # the stateful gradient source the adversary names, if any
    settings: StepSettings  # retraction, optimizer, learning rate, re-projection
    sharding: Sharding
    # the conversion mode the teacher's start is (teacher.start_mode), None: no teacher, or a table's polar
    # factor with the run's own T0
    teacher_mode: str | None = None

    @property
    def adaptive(self) -> bool:
        """The adaptive adversary probes a trial step before each real one."""
        return "adaptive" in self.adversaries

    @cached_property
    def device(self) -> str:
        # on first use only: 'auto' at a large V x D imports torch to ask for a GPU, which a plan read for its
        # policy or head (compare's report, a stress file's checks) never needs
        return run_device(self.config)


def policy_named(precision: str) -> Policy:
    """A precision's policy: a run's, or a recorded run's (a summary row names its precision)."""
    return get_policy(precision)


def head_named(head: str) -> type:
    """A head's class: a run's, or a recorded run's (a summary row names its head)."""
    return get_head(head)


def resolve(config) -> Plan:
    """The plan of a config whose fields have their types (RunConfig.validate checks them first); a one-line
    PitcheckError for a name no registry holds."""
    head = head_named(config.head)
    return Plan(config=config, policy=policy_named(config.precision), reference_policy=policy_named("fp64"),
                head=head, adversaries=tuple(parse_adversary(config.adversary)),
                source=stateful_source(config.adversary), settings=config.settings(),
                sharding=Sharding(config.shards, config.pad_multiple, config.allreduce_dtype),
                # the baselines start from the teacher's polar factor alone: they have no T to convert into
                teacher_mode=start_mode(config.teacher, config.teacher_mode, config.cond) if head.has_retraction
                else None)
