"""Long trajectories of a PIT model under adversarial gradients, written to a run directory.

A run directory (rundir.py) holds manifest.json (config, versions, policy), metrics.csv (one row per
recorded step: log-spaced plus the last), events.jsonl (skipped steps, breakdowns, threshold crossings)
and checkpoint.npz (the state at the last commit). Every recorded step is one commit of all four files,
so a run killed at any instant leaves a consistent directory that `resume=True` continues with
identical results; SIGINT and SIGTERM let the step in progress finish and commit it first. Resuming
checks everything it loads against this run's config and state, and refuses with the reason.
A torch run also steps a float64 numpy shadow on the same gradient stream and reports its distance.
"""
from __future__ import annotations

import functools
import math
import os
import platform
import re
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from . import __version__
from . import lm
from .engine import Engine, StateBreakdown, StepSettings
from .errors import PitcheckError
from .threads import limited_threads
from .events import THRESHOLDS, raised_by, row_events
from .gradients import AdversaryParams, check_adversary_params, parse_adversary
from .heads import HEADS, PIT_ONLY, TableEngine
from .metrics import EXTENDED_BITS, drift_bound
from .policy import get_policy
from .reference import check_shapes, polar_memory, random_memory, spd_with_condition
from .rundir import (CHECKPOINT, CSV_COLUMNS, EVENTS, LOCK, LOSS_COLUMNS, MANIFEST, METRIC_COLUMNS, METRICS, RunDir,
                     csv_bytes, events_bytes, manifest_bytes, npz_bytes, read_events, read_metrics)

__all__ = ["METRIC_COLUMNS", "THRESHOLDS", "RunBreakdown", "RunConfig", "Trajectory", "read_events",
           "read_metrics", "recorded_steps", "run"]

# beyond this T0's smallest eigenvalue is below float64's resolution of its largest (u = 1.1e-16), and
# its Cholesky factorisation can fail (it does at 1e17)
MAX_COND = 1e15
# far past any run, and small enough that the log-spaced grid of recorded steps stays exact
MAX_STEPS = 10**12
# how many float64 V x D arrays a run holds at once, at most: master and stored state, optimizer moments,
# gradients, the embedding, the shadow's copies, the metrics' temporaries and the checkpoint being written
VD_ARRAYS = 32


class RunBreakdown(PitcheckError):
    """The run's state broke down; the run ended at its last good state, which is committed."""


def _is_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def available_memory() -> int | None:
    """Bytes of memory available to new allocations (Linux's MemAvailable); None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_memory(vocab: int, dim: int, what: str = "a run") -> None:
    """Refuse a V x D that cannot fit, before anything of that size is allocated."""
    need = vocab * dim * 8 * VD_ARRAYS
    have = available_memory()
    if have is not None and need > have:
        raise PitcheckError(f"V x D = {vocab} x {dim} is too large: {what} needs about {need / 2**30:.3g} GiB "
                            f"({VD_ARRAYS} float64 V x D arrays), and {have / 2**30:.3g} GiB of memory is available")


@dataclass(frozen=True)
class RunConfig:
    backend: str = "numpy"
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
    teacher: str = ""  # FILE.npy or FILE.safetensors:TENSOR: Z0 is the polar factor of this V x D embedding
    seed: int = 0
    device: str = "auto"
    records_per_decade: int = 10
    shadow: bool = True  # torch backend: step a float64 numpy shadow alongside
    adversary_params: AdversaryParams = field(default_factory=AdversaryParams)
    lm: lm.LMParams = field(default_factory=lm.LMParams)  # the lm source's model and batches

    def __post_init__(self):
        # a grid's [fixed.lm] table or a manifest's dict
        object.__setattr__(self, "lm", lm.lm_params(self.lm))

    def validate(self, here: bool = False) -> None:
        """Every value of its type, in range and meaningful with the others; a one-line reason if not.

        here: also that it can run on this machine (the CUDA device it names is present). A stress file
        checks its scenarios without it (a CUDA scenario is skipped, not refused, without a GPU)."""
        for name in ("backend", "precision", "retraction", "adversary", "head", "optimizer", "teacher", "device"):
            if not isinstance(getattr(self, name), str):
                raise PitcheckError(f"{name} must be a string, got {getattr(self, name)!r}")
        if not isinstance(self.shadow, (bool, np.bool_)):
            raise PitcheckError(f"shadow must be true or false, got {self.shadow!r}")
        if not isinstance(self.adversary_params, AdversaryParams):
            raise PitcheckError(f"adversary_params must be a table, got {self.adversary_params!r}")
        for name in ("vocab", "dim", "steps", "seed", "reproject_every", "records_per_decade"):
            if not _is_int(getattr(self, name)):
                raise PitcheckError(f"{name} must be an integer, got {getattr(self, name)!r}")
        for name in ("lr", "cond", "reproject_threshold"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
                raise PitcheckError(f"{name} must be a number, got {value!r}")
        check_shapes(self.vocab, self.dim)
        if self.teacher and teacher_shape(self.teacher) != (self.vocab, self.dim) and not (
                lm.uses_lm(self.adversary) and lm.teacher_fits(self, teacher_shape(self.teacher))):
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
        if self.records_per_decade < 1:
            raise PitcheckError("records_per_decade must be >= 1")
        if self.backend not in ("numpy", "torch"):
            raise PitcheckError(f"unknown backend {self.backend!r}; choose numpy or torch")
        get_policy(self.precision)
        if self.backend == "numpy" and self.precision != "fp64":
            raise PitcheckError(f"the numpy backend is the float64 reference: precision {self.precision} needs "
                                "the torch backend")
        check_device(self.device, self.backend)
        if here:
            check_device_present(self.device)
        names = parse_adversary(self.adversary)
        check_adversary_params(self.adversary_params)
        if self.head not in HEADS:
            raise PitcheckError(f"unknown head {self.head!r}; choose from {', '.join(HEADS)}")
        if self.head != "pit":
            if "adaptive" in names:
                raise PitcheckError("the adaptive adversary probes PIT's drift bound: use it with --head pit")
            # the baselines would ignore these: refuse them rather than record a setting that did nothing
            ignored = [opt for opt, given in (("--retraction", self.retraction != RunConfig.retraction),
                                              ("--reproject-every", self.reproject_every != 0),
                                              ("--reproject-threshold", self.reproject_threshold != 0),
                                              ("--cond", self.cond != 1)) if given]
            if ignored:
                raise PitcheckError(f"--head {self.head} has no retraction, re-projection or T: "
                                    f"{', '.join(ignored)} only make sense with --head pit")
        get_policy(self.precision)
        self.settings()
        if lm.uses_lm(self.adversary):
            lm.check_config(self)

    def settings(self) -> StepSettings:
        return StepSettings(self.retraction, self.optimizer, self.lr, self.reproject_every, self.reproject_threshold)

    def to_json(self) -> dict:
        d = asdict(self)
        if not lm.uses_lm(self.adversary):
            # the lm options change nothing then: left out, a run's config (and a sweep cell's name) is
            # what it was before the lm source existed
            d.pop("lm")
        return d

    @classmethod
    def from_json(cls, d: dict) -> "RunConfig":
        d = dict(d)
        d["adversary_params"] = AdversaryParams(**d.get("adversary_params", {}))
        return cls(**d)


DEVICE = re.compile(r"(auto|cpu|cuda(:[0-9]+)?)\Z", re.ASCII)


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
    import torch

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


def initial_state(config: RunConfig) -> tuple[np.ndarray, np.ndarray]:
    """Z0 (random orthonormal) and L0 (Cholesky factor of T0, T0 = I unless cond > 1), seeded."""
    rng = np.random.default_rng([config.seed, 2**32 - 1])  # a stream apart from the gradients'
    if config.teacher:
        teacher = load_teacher(config.teacher)
        if lm.uses_lm(config.adversary):  # a pretrained model's full table: the rows of the run's tokens
            teacher = lm.teacher_rows(config, teacher)
        Z0 = polar_memory(teacher)
    else:
        Z0 = random_memory(config.vocab, config.dim, rng)
    if config.cond == 1.0:
        L0 = np.eye(config.dim)
    else:
        try:
            L0 = np.linalg.cholesky(spd_with_condition(config.dim, config.cond, rng))
        except np.linalg.LinAlgError:
            raise PitcheckError(f"--cond {config.cond:g}: T0 is not positive definite in float64; "
                                "choose a smaller condition number") from None
    return Z0, L0


# safetensors dtypes a teacher may have (torch reads them all; they are upcast to float64)
SAFETENSORS_FLOATS = ("F16", "BF16", "F32", "F64")


def teacher_source(spec: str) -> tuple[str, str | None]:
    """(file, tensor name): FILE.safetensors:NAME names one tensor of a safetensors file; anything else is a
    .npy file (its name may hold ':')."""
    head, sep, name = spec.rpartition(":")
    if sep and head.endswith(".safetensors"):
        return head, name
    return spec, None


def _is_safetensors(spec: str) -> bool:
    file, name = teacher_source(spec)
    return name is not None or file.endswith(".safetensors")


def _open_safetensors(path: str):
    try:
        from safetensors import safe_open
    except ImportError:
        raise PitcheckError(f"reading the teacher {path} needs the safetensors package: "
                            "pip install 'pitcheck[lm]' (or pip install safetensors)") from None
    p = Path(path)
    if not p.is_file():
        raise PitcheckError(f"cannot read teacher embedding {path}: "
                            f"{'it is a directory' if p.is_dir() else 'no such file'}")
    try:
        return safe_open(str(p), framework="pt")
    except Exception as exc:  # the library raises its own error types for a damaged header
        raise PitcheckError(f"cannot read teacher embedding {path}: not a safetensors file ({exc})") from None


def safetensors_header(spec: str) -> tuple[tuple[int, ...], str]:
    """Shape and dtype of a teacher tensor in a safetensors file, from the file's header alone."""
    path, name = teacher_source(spec)
    with _open_safetensors(path) as f:
        keys = list(f.keys())
        tables = [k for k in keys if len(f.get_slice(k).get_shape()) == 2
                  and f.get_slice(k).get_dtype() in SAFETENSORS_FLOATS]
        listed = ", ".join(tables[:6]) + (", ..." if len(tables) > 6 else "") or "none"
        if not name:
            raise PitcheckError(f"name the teacher's tensor: --teacher {path}:NAME (its 2-D floating-point "
                                f"tensors: {listed})")
        if name not in keys:
            raise PitcheckError(f"teacher {path} has no tensor {name!r} (its 2-D floating-point tensors: {listed})")
        piece = f.get_slice(name)
        shape, dtype = tuple(int(n) for n in piece.get_shape()), piece.get_dtype()
    if dtype not in SAFETENSORS_FLOATS:
        raise PitcheckError(f"teacher {spec} must hold a real floating-point tensor, got dtype {dtype}")
    if len(shape) != 2:
        raise PitcheckError(f"teacher {spec} must be 2-D (V x D), got shape {shape}")
    check_shapes(*shape)
    check_memory(*shape, what=f"teacher {spec}")
    return shape, dtype


def teacher_header(path: str) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype of a teacher .npy (or safetensors tensor) from its header alone: nothing is loaded
    that cannot fit."""
    if _is_safetensors(path):
        return safetensors_header(path)
    p = Path(path)
    zipped = False
    if not p.is_file():
        raise PitcheckError(f"cannot read teacher embedding {path}: "
                            f"{'it is a directory' if p.is_dir() else 'no such file'}")
    try:
        with open(p, "rb") as f:
            zipped = f.read(4) == b"PK\x03\x04"
            f.seek(0)
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, _, dtype = np.lib.format.read_array_header_1_0(f)
            elif version == (2, 0):
                shape, _, dtype = np.lib.format.read_array_header_2_0(f)
            else:
                raise ValueError(f"unsupported .npy format version {version}")
            data_start = f.tell()
    except (OSError, ValueError, EOFError, SyntaxError) as exc:
        what = "it is a zip archive (an .npz?), not an .npy file" if zipped else f"not an .npy file ({exc})"
        raise PitcheckError(f"cannot read teacher embedding {path}: {what}") from None
    if dtype.hasobject or dtype.kind != "f":
        raise PitcheckError(f"teacher embedding {path} must hold a real floating-point array, got dtype {dtype}")
    if len(shape) != 2:
        raise PitcheckError(f"teacher embedding {path} must be 2-D (V x D), got shape {shape}")
    check_shapes(*shape)
    check_memory(*shape, what=f"teacher {path}")
    size = p.stat().st_size
    if size < data_start + math.prod(shape) * dtype.itemsize:
        raise PitcheckError(f"teacher embedding {path} is truncated: its header says {shape} {dtype}, "
                            f"the file holds {size - data_start} bytes of data")
    return tuple(int(n) for n in shape), dtype


@functools.lru_cache(maxsize=1)
def load_teacher(path: str) -> np.ndarray:
    teacher_header(path)
    if _is_safetensors(path):
        import torch

        file, name = teacher_source(path)
        try:
            with _open_safetensors(file) as f:
                teacher = f.get_tensor(name).to(torch.float64).numpy()
        except PitcheckError:
            raise
        except Exception as exc:  # a data section shorter than the header says, say
            raise PitcheckError(f"cannot read teacher embedding {path}: {exc}") from None
    else:
        try:
            teacher = np.load(path, allow_pickle=False)
        except (OSError, ValueError, EOFError) as exc:
            raise PitcheckError(f"cannot read teacher embedding {path}: {exc}") from None
    teacher = teacher.astype(np.float64)
    if not np.isfinite(teacher).all():
        raise PitcheckError(f"teacher embedding {path} has non-finite entries")
    return teacher


def teacher_shape(path: str) -> tuple[int, int]:
    return teacher_header(path)[0]


def versions() -> dict:
    import scipy

    out = {"pitcheck": __version__, "python": platform.python_version(), "numpy": np.__version__}
    out["scipy"] = scipy.__version__
    try:
        import torch

        out["torch"] = torch.__version__
        out["cuda"] = torch.version.cuda
    except ImportError:  # pragma: no cover - torch is a dependency
        out["torch"] = None
    return out


def _sha256(path: str) -> str:
    import hashlib

    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def make_engine(config: RunConfig, backend: str, policy, device: str) -> Engine:
    if config.head == "pit":
        engine = Engine(backend, policy, config.settings(), device)
    else:
        engine = TableEngine(backend, policy, config.settings(), device, head=config.head)
    if lm.uses_lm(config.adversary):
        engine.source = lm.make_source(config, engine)
    return engine


class Progress:
    """A one-line progress bar on stderr, drawn only on a terminal."""

    def __init__(self, total: int, label: str, enabled: bool | None = None):
        self.total, self.label = total, label
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.last = 0.0
        self.finished = False

    def update(self, done: int) -> None:
        now = time.monotonic()
        if not self.enabled or self.finished or (now - self.last < 0.1 and done < self.total):
            return
        self.last = now
        frac = done / self.total if self.total else 1.0
        bar = "#" * int(30 * frac)
        sys.stderr.write(f"\r{self.label} [{bar:<30}] {done}/{self.total}")
        if done >= self.total:
            self.finished = True
            sys.stderr.write("\n")
        sys.stderr.flush()


class Trajectory:
    """A run: build it from a config and an output directory, then call `run()`.

    Building it locks the directory (until `run()` returns) and, to resume, loads and checks it.
    """

    def __init__(self, config: RunConfig, out: Path | str, resume: bool = False, progress: bool | None = None,
                 force: bool = False):
        if resume and force:
            raise PitcheckError("--resume continues a run and --force starts it over: give one of them")
        config.validate(here=True)
        self.config = config
        self.store = RunDir(out)
        self.out = self.store.path
        self.progress_enabled = progress
        self.rows: list[dict] = []
        self.events: list[dict] = []
        self.crossed: set[str] = set()
        self.step = 0
        self.resumed_from = None
        self.broken: dict | None = None  # the breakdown event a resumed run had already ended in
        if resume and not self.out.exists():
            raise PitcheckError(f"nothing to resume: {self.out} does not exist (without --resume a run starts there)")
        # everything that needs no directory is built and checked first: a run refused there creates nothing
        self._build()
        created = [p for p in (self.out, *self.out.parents) if not p.exists()]
        lock_existed = (self.out / LOCK).exists()
        try:
            self.store.open()
            self._prepare(resume, force)
        except BaseException:
            self.store.close()
            _remove_created(self.out, created, lock_existed)
            raise

    def _build(self) -> None:
        """The engines, their initial state and the hashes of the run's input files."""
        config = self.config
        self.policy = get_policy(config.precision)
        self.engine = make_engine(config, config.backend, self.policy, config.device)
        self.shadow = None
        if config.backend == "torch" and config.shadow:
            self.shadow = make_engine(config, "numpy", get_policy("fp64"), "cpu")
        # the initial state is also the template a checkpoint must match
        Z0, L0 = initial_state(config)
        self.engine.initialise(Z0, L0)
        problem = self.engine.degenerate()
        if problem:
            raise PitcheckError(f"the initial state does not fit {config.precision}: {problem}; lower --cond")
        if self.shadow:
            self.shadow.initialise(Z0, L0)
        self.inputs = input_hashes(config)

    def _prepare(self, resume: bool, force: bool) -> None:
        config = self.config
        if force:
            self.store.clear()
        elif self.store.has_run():
            if not resume:
                raise PitcheckError(f"{self.out} already holds a run; pass --resume to continue it, --force to "
                                    "replace it, or choose another --out")
            if self.store.has(CHECKPOINT):
                self._load()
            else:
                self._restart()
        elif self.store.foreign_files():
            names = self.store.foreign_files()
            raise PitcheckError(f"{self.out} is not empty ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''})"
                                " and holds no pitcheck run: choose a new or empty directory, or pass --force to "
                                "write the run beside those files")
        # built once, before the first commit: it imports torch, which takes seconds
        self.manifest_data = self.manifest()
        if self.engine.source:
            # the losses are columns of metrics.csv, beside the interface metrics of their step
            self.manifest_data["lm"] = self.engine.source.describe()
        # columns that are NaN by design: no shadow, no T for the baselines, no second table when tied
        self.not_applicable = set()
        if not self.shadow:
            self.not_applicable |= {"shadow_Z", "shadow_T"}
        if config.head != "pit":
            self.not_applicable |= set(PIT_ONLY)
        if config.head == "tied":
            self.not_applicable.add("shadow_T")

    # ---- persistence -------------------------------------------------------------------------
    def manifest(self) -> dict:
        return {
            "config": self.config.to_json(),
            "policy": self.policy.describe(),
            "device": self.engine.device,
            "emulated": self.engine.emulated,
            "torch_cpu_threads": 1 if self.engine.backend == "torch" and self.engine.device == "cpu" else None,
            "extended_precision_bits": EXTENDED_BITS,
            "versions": versions(),
            "platform": platform.platform(),
            "resumed_from": self.resumed_from,
            **self.inputs,
        }

    def _checkpoint_arrays(self) -> dict:
        Z, L = self.engine.stored()
        arrays = {"step": np.int64(self.step), "Z": Z, "L": L}
        arrays.update({f"engine_{k}": v for k, v in self.engine.state_dict().items()})
        if self.shadow:
            arrays.update({f"shadow_{k}": v for k, v in self.shadow.state_dict().items()})
        return arrays

    def _commit(self) -> None:
        """One commit of the whole directory at the current step."""
        self.store.commit(self.step, {
            CHECKPOINT: npz_bytes(self._checkpoint_arrays()),
            METRICS: csv_bytes(self.rows),
            EVENTS: events_bytes(self.events),
            MANIFEST: manifest_bytes(self.manifest_data),
        })

    def _config_differences(self, manifest: dict, ignore: tuple[str, ...]) -> list[str]:
        mine, theirs = self.config.to_json(), manifest["config"]
        unknown = sorted(set(theirs) - set(mine))
        if unknown:
            raise PitcheckError(f"{self.out}/{MANIFEST} has config keys this pitcheck does not know "
                                f"({', '.join(unknown)}): written by another version? pass --force to start over")
        return [k for k in mine if k not in ignore and mine[k] != theirs.get(k)]

    def _restart(self) -> None:
        """A run directory without a checkpoint (results/ keep none): only the very same run may redo it."""
        differ = self._config_differences(self.store.read_manifest(), ("device",))
        if differ:
            raise PitcheckError(f"cannot resume {self.out}: it holds no checkpoint, and its run differs in "
                                f"{', '.join(differ)}; pass --force to replace it or choose another --out")
        self.store.clear()

    def _refuse(self, why: str) -> PitcheckError:
        return PitcheckError(f"cannot resume {self.out}: {why}; pass --force to start over")

    def _load(self) -> None:
        """Load the checkpoint, rows and events, checking each against this run; refuse on any mismatch."""
        cfg = self.config
        manifest = self.store.read_manifest()
        differ = self._config_differences(manifest, ("steps", "device"))
        if differ:
            raise PitcheckError(f"cannot resume {self.out}: config differs in {', '.join(differ)}")
        for key, digest in self.inputs.items():
            # a directory of an older pitcheck may lack a hash: nothing to compare it with
            if manifest.get(key) is not None and manifest[key] != digest:
                what = INPUT_FILES[key](self.config)
                raise self._refuse(f"{what} changed since the run started (its SHA-256 was {str(manifest[key])[:12]}..., "
                                   f"is {str(digest)[:12]}...): the run would mix two states")
        written_steps = manifest["config"].get("steps")
        if not _is_int(written_steps) or written_steps < 0:
            raise self._refuse(f"{MANIFEST}'s steps is {written_steps!r}")
        ck = self.store.read_checkpoint()
        template = self._checkpoint_arrays()
        if set(ck) != set(template):
            missing, extra = sorted(set(template) - set(ck)), sorted(set(ck) - set(template))
            raise self._refuse(f"{CHECKPOINT} does not hold this run's state (missing {missing or 'nothing'}, "
                               f"unexpected {extra or 'nothing'})")
        for k, want in template.items():
            want, got = np.asarray(want), ck[k]
            if got.shape != want.shape or got.dtype != want.dtype:
                raise self._refuse(f"{CHECKPOINT}'s {k} is {got.dtype} {got.shape}, this run's is "
                                   f"{want.dtype} {want.shape}")
            if got.dtype.kind == "f" and not np.isfinite(got).all():
                raise self._refuse(f"{CHECKPOINT}'s {k} has non-finite entries")
        step = int(ck["step"])
        if step < 0:
            raise self._refuse(f"{CHECKPOINT}'s step is {step}")
        if step > cfg.steps:
            raise PitcheckError(f"cannot resume {self.out} with --steps {cfg.steps}: it holds a run at step {step}; "
                                f"give --steps >= {step}, choose another --out, or pass --force to start over")
        self.engine.load_state_dict({k[7:]: v for k, v in ck.items() if k.startswith("engine_")})
        if self.shadow:
            self.shadow.load_state_dict({k[7:]: v for k, v in ck.items() if k.startswith("shadow_")})
        self.step = step
        # the loaded state re-exports exactly what was saved, unless values lie outside the policy's formats
        # or the stored Z and L do not follow from the master state
        again = self._checkpoint_arrays()
        changed = [k for k in template if not np.array_equal(again[k], ck[k])]
        if changed:
            raise self._refuse(f"{CHECKPOINT}'s {', '.join(changed)} do not match the state they restore "
                               f"(values not representable in {cfg.precision}, or edited)")
        problem = self.engine.degenerate()
        if problem:
            raise self._refuse(f"{CHECKPOINT} holds a state that cannot compute: {problem}")
        rows = self.store.read_metrics(CSV_COLUMNS)
        if not rows or rows[0]["step"] != 0:
            raise self._refuse(f"{METRICS} has no row for step 0 (emptied or truncated)")
        if rows[-1]["step"] > step:
            raise self._refuse(f"{METRICS} has rows after step {step}, the checkpoint's: it mixes two states")
        # a commit record vouches that rows and checkpoint were written together; without one (a directory
        # of an older pitcheck) a checkpoint at a recorded step must have its row
        if (self.store.record is None and step in recorded_steps(written_steps, cfg.records_per_decade)
                and rows[-1]["step"] != step):
            raise self._refuse(f"{METRICS} ends at step {rows[-1]['step']}, before the checkpoint's step {step}: "
                               "rows were lost")
        events = self.store.read_events()
        for n, e in enumerate(events):
            ends_run = e["event"] == "breakdown" and e["step"] == step + 1 and n == len(events) - 1
            if e["step"] > step and not ends_run:
                raise self._refuse(f"{EVENTS} has an event at step {e['step']}, after the checkpoint's {step}")
            if e["event"] == "threshold_crossed" and not (
                    e.get("metric") in THRESHOLDS and isinstance(e.get("level"), (int, float))):
                raise self._refuse(f"{EVENTS} has a threshold event for {e.get('metric')!r} at level "
                                   f"{e.get('level')!r}")
            if e["event"] == "nonfinite_metric" and not isinstance(e.get("metrics"), list):
                raise self._refuse(f"{EVENTS} has a nonfinite_metric event without its metrics")
            if e["event"] == "breakdown" and not isinstance(e.get("reason"), str):
                raise self._refuse(f"{EVENTS} has a breakdown event without its reason")
            if ends_run:
                self.broken = e
        self.rows, self.events = rows, events
        if self.engine.source:
            self._check_losses(manifest, rows)
        self.crossed = raised_by(events)
        self.resumed_from = self.step

    def _check_losses(self, manifest: dict, rows: list[dict]) -> None:
        """Every row of an lm run has its losses: in metrics.csv, or (an older pitcheck's directory) in the
        manifest, whence they are put back on the rows and move to metrics.csv at the next commit."""
        losses = manifest.get("lm", {}).get("losses") if isinstance(manifest.get("lm"), dict) else None
        if losses is not None:
            ok = isinstance(losses, list) and all(
                isinstance(e, dict) and type(e.get("step")) is int
                and all(k in LOSS_COLUMNS and isinstance(v, (int, float)) for k, v in e.items() if k != "step")
                for e in losses)
            if not ok or [e["step"] for e in losses] != [r["step"] for r in rows] or any(
                    k in r for r in rows for k in LOSS_COLUMNS):
                raise self._refuse(f"{MANIFEST}'s lm losses do not match the rows of {METRICS}")
            for entry, row in zip(losses, rows):
                row.update({k: float(v) for k, v in entry.items() if k != "step"})
        want = {"train_loss", "heldout_loss"} | ({"shadow_heldout_loss"} if self.shadow else set())
        lacking = [r["step"] for r in rows if not want <= set(r)]
        if lacking:
            raise self._refuse(f"{METRICS} lacks the lm losses of step {lacking[0]}")

    # ---- recording ---------------------------------------------------------------------------
    def _event(self, step: int, event: dict) -> None:
        self.events.append({"step": step, **event})

    def measure(self) -> dict:
        row = {"step": self.step, **self.engine.interface()}
        row["shadow_Z"], row["shadow_T"] = self.engine.distance(self.shadow) if self.shadow else (np.nan, np.nan)
        row["loss_scale"] = self.engine.loss_scale
        if self.engine.source:
            row.update(self.engine.source.losses(self.engine))
            if self.shadow:
                row["shadow_heldout_loss"] = self.shadow.source.losses(self.shadow)["heldout_loss"]
        return row

    def _measure_row(self) -> None:
        row = self.measure()
        self.rows = [r for r in self.rows if r["step"] < self.step] + [row]
        for event in row_events(row, self.crossed, metrics=METRIC_COLUMNS[1:], not_applicable=self.not_applicable,
                                u=self.policy.u):
            self._event(self.step, event)

    def _record(self) -> None:
        self._measure_row()
        self._commit()

    def _probe(self, GZ, GL) -> float:
        """Trial step for the adaptive adversary: the drift bound after it, state left untouched."""
        saved = self.engine.state_dict()
        try:
            self.engine.step({"Z": GZ, "L": np.tril(GL)}, self.step)
            bound = drift_bound(*self.engine.stored(), self.policy.u)
        except (StateBreakdown, PitcheckError):
            bound = float("inf")  # a step that would break the model is as bad as a step gets
        self.engine.load_state_dict(saved)
        return bound

    def _step(self, grads: dict, shadow_grads=None) -> None:
        """One step of the model and, unless the model skipped it, of its shadow: both or neither.

        shadow_grads: the shadow's own gradients where a stateful source gives each its own (else grads).
        """
        before = self.engine.snapshot()
        shadow_before = self.shadow.snapshot() if self.shadow else None
        try:
            events = self.engine.step(grads, self.step)
            skipped = any(map(skips_step, events))
            if skipped and self.step + 1 == self.config.steps and self._steps_skipped() == self.step:
                # the last step skipped like every one before it: the run's numbers would be its start's
                kinds = skipped_steps_by_event(self.events + [{**e, "step": self.step + 1} for e in events])
                raise StateBreakdown(f"none of the {self.config.steps} steps was applied ("
                                     + ", ".join(f"{n} {name}" for name, n in sorted(kinds.items())) + ")")
            _advance_source(self.engine, skipped)
            # the shadow follows what the model did, so a step the model skipped the shadow skips too
            if self.shadow and not skipped:
                try:
                    shadow_events = self.shadow.step(grads if shadow_grads is None else shadow_grads, self.step)
                    _advance_source(self.shadow, any(map(skips_step, shadow_events)))
                except StateBreakdown as exc:
                    raise StateBreakdown(f"the float64 shadow: {exc}") from None
            elif self.shadow:
                _advance_source(self.shadow, True)
        except StateBreakdown:
            self.engine.restore(before)
            if self.shadow:
                self.shadow.restore(shadow_before)
            raise
        for e in events:
            self._event(self.step + 1, e)

    def _gradients(self, names: list[str], probe) -> tuple[dict, dict | None]:
        """This step's gradients for the model and, where a stateful source gives the shadow its own (its
        body on the same batch), for the shadow; the stateless models' part is the model's for both."""
        cfg, source = self.config, self.engine.source
        if source is None:
            return self.engine.gradients(names, cfg.seed, self.step, cfg.adversary_params, probe), None
        rest = [n for n in names if n != source.name]
        base = self.engine.model_gradients(rest, cfg.seed, self.step, cfg.adversary_params, probe)
        grads = source.add_gradients(self.engine, base, self.step)
        shadow = self.shadow.source.add_gradients(self.shadow, base, self.step) if self.shadow else None
        return grads, shadow

    def _steps_skipped(self) -> int:
        return len({e["step"] for e in self.events if skips_step(e)})

    def _breakdown_error(self, event: dict) -> RunBreakdown:
        return RunBreakdown(f"{self.out} broke down at step {event['step']}: {event['reason']}; the last good "
                            f"state (step {event['step'] - 1}) is checkpointed, and the run cannot go past it")

    def _end_in_breakdown(self, reason: str) -> RunBreakdown:
        """Commit the last good state, its row and the breakdown event together."""
        if not self.rows or self.rows[-1]["step"] != self.step:
            self._measure_row()
        self._event(self.step + 1, {"event": "breakdown", "reason": reason, "action": "run ended"})
        self._commit()
        return self._breakdown_error(self.events[-1])

    # ---- the loop ----------------------------------------------------------------------------
    def run(self) -> list[dict]:
        try:
            if self.engine.source or (self.engine.backend == "torch" and self.engine.device == "cpu"):
                # torch's and OpenBLAS's thread pools spin against each other on shared cores (measured 3x
                # slower on 2 cores with the numpy shadow): torch gets one thread for the run; with the lm
                # source, whose torch work sits between numpy's solves and QRs at every step, the BLAS
                # too (measured 50x faster numpy QR on 2 cores)
                with limited_threads(1, blas=bool(self.engine.source)):
                    return self._run()
            return self._run()
        finally:
            self.store.close()

    def _run(self) -> list[dict]:
        cfg = self.config
        if self.broken:
            raise self._breakdown_error(self.broken)
        # SIGINT and SIGTERM are taken between steps, never inside one: a half-applied step (optimizer
        # state moved, Z not yet stored, shadow behind) would be inconsistent. A commit would survive
        # them (a cut commit leaves the previous one), but a deferred signal also saves the steps since.
        stop: list[int] = []
        previous = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                previous[sig] = signal.signal(sig, lambda signum, _: stop.append(signum))
        marks = [s for s in recorded_steps(cfg.steps, cfg.records_per_decade) if s > self.step]
        progress = Progress(cfg.steps, f"{cfg.backend}/{cfg.precision}/{cfg.retraction}", self.progress_enabled)
        names = parse_adversary(cfg.adversary)
        probe = self._probe if "adaptive" in names else None
        try:
            if self.step == 0 and not self.rows:
                self._record()
            while self.step < cfg.steps:
                if stop:
                    raise KeyboardInterrupt
                grads, shadow_grads = self._gradients(names, probe)
                try:
                    self._step(grads, shadow_grads)
                except StateBreakdown as exc:
                    raise self._end_in_breakdown(str(exc)) from None
                self.step += 1
                if marks and self.step == marks[0]:
                    marks.pop(0)
                    self._record()
                progress.update(self.step)
            if not self.rows or self.rows[-1]["step"] != self.step:
                self._record()
        except KeyboardInterrupt:
            if not self.rows:  # interrupted before the first record: nothing to keep
                raise PitcheckError(f"interrupted before the first step of {self.out}; nothing was written") from None
            # keep the work done: checkpoint this step (metrics rows stay those of the recorded steps)
            self._commit()
            raise PitcheckError(f"interrupted at step {self.step} of {self.out}, checkpoint saved; the same "
                                "command with --resume continues it (pitcheck compare resumes by itself)") from None
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        progress.update(cfg.steps)
        return self.rows


# the input files a run reads besides its config, by the manifest key of their SHA-256, and their names
INPUT_FILES = {
    "teacher_sha256": lambda config: f"the teacher {teacher_source(config.teacher)[0]}",
    "vocabulary_sha256": lambda config: f"the WordPiece vocabulary {config.lm.vocabulary.partition(':')[2]}",
}


def input_hashes(config: RunConfig) -> dict:
    """SHA-256 of the teacher file and the WordPiece vocabulary file (None where the run has none): a resumed
    run refuses files that changed since it started."""
    vocabulary = None
    if lm.uses_lm(config.adversary) and config.lm.vocabulary != "bpe":
        vocabulary = _sha256(config.lm.vocabulary.partition(":")[2])
    return {"teacher_sha256": _sha256(teacher_source(config.teacher)[0]) if config.teacher else None,
            "vocabulary_sha256": vocabulary}


def _remove_created(out: Path, created: list[Path], lock_existed: bool) -> None:
    """Undo what a refused run made: its lock file, and the directories it created (left when not empty).
    A directory that was there before keeps everything but a lock this run added."""
    try:
        if out in created or not lock_existed:
            (out / LOCK).unlink(missing_ok=True)
        for d in created:  # deepest first
            d.rmdir()
    except OSError:
        pass


def _advance_source(engine, skipped: bool) -> None:
    """Step (or, with the interface step skipped, drop) the body update of the engine's stateful source."""
    if engine.source:
        engine.source.discard() if skipped else engine.source.advance()


def skips_step(event: dict) -> bool:
    """Whether the event records a step the model did not take."""
    return "step skipped" in str(event.get("action", ""))


def skipped_steps_by_event(events: list[dict]) -> dict[str, int]:
    """How many steps were skipped, by the event that skipped them."""
    counts: dict[str, int] = {}
    for e in events:
        if skips_step(e):
            counts[e["event"]] = counts.get(e["event"], 0) + 1
    return counts


def skipped_steps(out: Path | str) -> dict[str, int]:
    """skipped_steps_by_event of the run in `out`."""
    return skipped_steps_by_event(read_events(Path(out) / EVENTS))


def run(config: RunConfig, out: Path | str, resume: bool = False, progress: bool | None = None,
        force: bool = False) -> list[dict]:
    """Run (or resume) a trajectory; returns the metric rows, also written to out/metrics.csv.

    Raises PitcheckError for bad input or a directory it must not touch, and RunBreakdown (a
    PitcheckError) when the state breaks down; either way the directory holds its last commit, whole.
    """
    return Trajectory(config, out, resume=resume, progress=progress, force=force).run()
