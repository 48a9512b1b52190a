"""Long trajectories of a PIT model under adversarial gradients, written to a run directory.

A run directory holds manifest.json (config, versions, policy), metrics.csv (one row per recorded step:
log-spaced plus the last), events.jsonl (skipped steps, breakdowns, threshold crossings) and
checkpoint.npz (the state at the last recorded step). Every file is replaced atomically, so an
interrupted run leaves a consistent directory that `resume=True` continues with identical results.
A torch run also steps a float64 numpy shadow on the same gradient stream and reports its distance.
"""
from __future__ import annotations

import csv
import functools
import io
import json
import math
import os
import platform
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from . import __version__
from .engine import Engine, StepSettings
from .errors import PitcheckError
from .gradients import AdversaryParams, parse_adversary
from .heads import HEADS, TableEngine
from .metrics import EXTENDED_BITS, drift_bound
from .policy import get_policy
from .reference import check_shapes, polar_memory, random_memory, spd_with_condition

METRIC_COLUMNS = [
    "step",
    "orthonormality",
    "orthonormality_ratio",
    "cond_T",
    "min_diag_L",
    "breakdown_margin",
    "trisolve_forward",
    "trisolve_forward_ratio",
    "trisolve_backward",
    "trisolve_backward_ratio",
    "pinv_drift",
    "penrose",
    "penrose_1",
    "penrose_2",
    "penrose_3",
    "penrose_4",
    "pinv_error",
    "shadow_Z",
    "shadow_T",
    "loss_scale",
]
# first crossings of these levels are recorded as events
THRESHOLDS = {
    "orthonormality": (1e-12, 1e-8, 1e-6, 1e-4, 1e-2, 1e-1),
    "pinv_drift": (1e-12, 1e-8, 1e-6, 1e-4, 1e-2, 1e-1),
    "cond_T": (1e2, 1e4, 1e8, 1e12),
    "breakdown_margin": (1.0,),
}


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
    teacher: str = ""  # .npy file: Z0 is the polar factor of this V x D embedding; "": random Z0
    seed: int = 0
    device: str = "auto"
    records_per_decade: int = 10
    shadow: bool = True  # torch backend: step a float64 numpy shadow alongside
    adversary_params: AdversaryParams = field(default_factory=AdversaryParams)

    def validate(self) -> None:
        check_shapes(self.vocab, self.dim)
        if self.teacher and teacher_shape(self.teacher) != (self.vocab, self.dim):
            raise PitcheckError(f"teacher {self.teacher} is {teacher_shape(self.teacher)}, "
                                f"not V x D = ({self.vocab}, {self.dim})")
        if self.steps < 0:
            raise PitcheckError(f"--steps must be >= 0, got {self.steps}")
        if not (self.cond >= 1 and math.isfinite(self.cond)):
            raise PitcheckError(f"--cond must be a finite number >= 1, got {self.cond}")
        if self.records_per_decade < 1:
            raise PitcheckError("records_per_decade must be >= 1")
        names = parse_adversary(self.adversary)
        if self.head not in HEADS:
            raise PitcheckError(f"unknown head {self.head!r}; choose from {', '.join(HEADS)}")
        if self.head != "pit" and "adaptive" in names:
            raise PitcheckError("the adaptive adversary probes PIT's drift bound: use it with --head pit")
        get_policy(self.precision)
        self.settings()

    def settings(self) -> StepSettings:
        return StepSettings(self.retraction, self.optimizer, self.lr, self.reproject_every, self.reproject_threshold)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "RunConfig":
        d = dict(d)
        d["adversary_params"] = AdversaryParams(**d.get("adversary_params", {}))
        return cls(**d)


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
        Z0 = polar_memory(load_teacher(config.teacher))
    else:
        Z0 = random_memory(config.vocab, config.dim, rng)
    if config.cond == 1.0:
        L0 = np.eye(config.dim)
    else:
        L0 = np.linalg.cholesky(spd_with_condition(config.dim, config.cond, rng))
    return Z0, L0


@functools.lru_cache(maxsize=1)
def load_teacher(path: str) -> np.ndarray:
    try:
        teacher = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise PitcheckError(f"cannot read teacher embedding {path}: {exc}") from None
    if teacher.ndim != 2 or teacher.dtype.kind not in "fiu":
        raise PitcheckError(f"teacher embedding must be a 2-D numeric array, got {teacher.dtype} {teacher.shape}")
    return teacher.astype(np.float64)


def teacher_shape(path: str) -> tuple[int, int]:
    return tuple(load_teacher(path).shape)


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


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _save_npz_atomic(path: Path, arrays: dict) -> None:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    _write_atomic(path, buf.getvalue())


def _csv_bytes(rows: list[dict]) -> bytes:
    out = io.StringIO()
    w = csv.DictWriter(out, fieldnames=METRIC_COLUMNS, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: (repr(float(r[k])) if k != "step" else int(r[k])) for k in METRIC_COLUMNS})
    return out.getvalue().encode()


def read_metrics(path: Path | str) -> list[dict]:
    with open(path, newline="") as f:
        return [{k: (int(v) if k == "step" else float(v)) for k, v in row.items()} for row in csv.DictReader(f)]


def read_events(path: Path | str) -> list[dict]:
    p = Path(path)
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]


def make_engine(config: RunConfig, backend: str, policy, device: str) -> Engine:
    if config.head == "pit":
        return Engine(backend, policy, config.settings(), device)
    return TableEngine(backend, policy, config.settings(), device, head=config.head)


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
    """A run: build it from a config and an output directory, then call `run()`."""

    def __init__(self, config: RunConfig, out: Path | str, resume: bool = False, progress: bool | None = None):
        config.validate()
        self.config, self.out = config, Path(out)
        self.policy = get_policy(config.precision)
        self.engine = make_engine(config, config.backend, self.policy, config.device)
        self.shadow = None
        if config.backend == "torch" and config.shadow:
            self.shadow = make_engine(config, "numpy", get_policy("fp64"), "cpu")
        self.progress_enabled = progress
        self.rows: list[dict] = []
        self.events: list[dict] = []
        self.crossed: set[str] = set()
        self.step = 0
        self.resumed_from = None
        if resume and (self.out / "checkpoint.npz").exists():
            self._load()
        else:
            if not resume and (self.out / "manifest.json").exists():
                raise PitcheckError(f"{self.out} already holds a run; pass --resume or choose another --out")
            self.out.mkdir(parents=True, exist_ok=True)
            Z0, L0 = initial_state(config)
            self.engine.initialise(Z0, L0)
            if self.shadow:
                self.shadow.initialise(Z0, L0)

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
            "teacher_sha256": _sha256(self.config.teacher) if self.config.teacher else None,
        }

    def _load(self) -> None:
        manifest = json.loads((self.out / "manifest.json").read_text())
        old = RunConfig.from_json(manifest["config"])
        mine = self.config.to_json()
        theirs = old.to_json()
        differ = [k for k in mine if k not in ("steps", "device") and mine[k] != theirs[k]]
        if differ:
            raise PitcheckError(f"cannot resume {self.out}: config differs in {', '.join(differ)}")
        with np.load(self.out / "checkpoint.npz") as ck:
            ck = {k: ck[k] for k in ck.files}
        self.step = int(ck["step"])
        self.engine.load_state_dict({k[7:]: v for k, v in ck.items() if k.startswith("engine_")})
        if self.shadow:
            self.shadow.load_state_dict({k[7:]: v for k, v in ck.items() if k.startswith("shadow_")})
        self.rows = [r for r in read_metrics(self.out / "metrics.csv") if r["step"] <= self.step]
        self.events = [e for e in read_events(self.out / "events.jsonl") if e["step"] <= self.step]
        self.crossed = {
            f"{e['metric']}>{lv:g}"
            for e in self.events
            if e["event"] == "threshold_crossed"
            for lv in THRESHOLDS[e["metric"]]
            if lv <= e["level"]
        }
        if any(e["event"] == "precision_cannot_resolve" for e in self.events):
            self.crossed.add("unresolved")
        self.resumed_from = self.step

    def _save(self) -> None:
        Z, L = self.engine.stored()
        arrays = {"step": np.int64(self.step), "Z": Z, "L": L}
        arrays.update({f"engine_{k}": v for k, v in self.engine.state_dict().items()})
        if self.shadow:
            arrays.update({f"shadow_{k}": v for k, v in self.shadow.state_dict().items()})
        # checkpoint first: a crash between the writes leaves rows no later than the checkpoint
        _save_npz_atomic(self.out / "checkpoint.npz", arrays)
        _write_atomic(self.out / "metrics.csv", _csv_bytes(self.rows))
        events = "".join(json.dumps(e, sort_keys=True) + "\n" for e in self.events)
        _write_atomic(self.out / "events.jsonl", events.encode())
        _write_atomic(self.out / "manifest.json", (json.dumps(self.manifest(), indent=2) + "\n").encode())

    # ---- recording ---------------------------------------------------------------------------
    def _event(self, step: int, event: dict) -> None:
        self.events.append({"step": step, **event})

    def measure(self) -> dict:
        row = {"step": self.step, **self.engine.interface()}
        row["shadow_Z"], row["shadow_T"] = self.engine.distance(self.shadow) if self.shadow else (np.nan, np.nan)
        row["loss_scale"] = self.engine.loss_scale
        return row

    def _record(self) -> None:
        row = self.measure()
        self.rows = [r for r in self.rows if r["step"] < self.step] + [row]
        for metric, levels in THRESHOLDS.items():
            # one event per metric and record: the highest level crossed for the first time
            new = [lv for lv in levels if row[metric] > lv and f"{metric}>{lv:g}" not in self.crossed]
            if new:
                self.crossed.update(f"{metric}>{lv:g}" for lv in levels if row[metric] > lv)
                self._event(self.step, {"event": "threshold_crossed", "metric": metric, "level": max(new),
                                        "value": row[metric]})
        # baseline heads have no solve: nothing to resolve
        if not row.get("trisolve_resolved", True) and "unresolved" not in self.crossed:
            self.crossed.add("unresolved")
            self._event(self.step, {"event": "precision_cannot_resolve", "metric": "trisolve_forward",
                                    "bound": row["cond_T"] * self.policy.u})
        self._save()

    def _probe(self, GZ, GL) -> float:
        """Trial step for the adaptive adversary: the drift bound after it, state left untouched."""
        saved = self.engine.state_dict()
        self.engine.step({"Z": GZ, "L": np.tril(GL)}, self.step)
        bound = drift_bound(*self.engine.stored(), self.policy.u)
        self.engine.load_state_dict(saved)
        return bound

    # ---- the loop ----------------------------------------------------------------------------
    def run(self) -> list[dict]:
        if self.engine.backend == "torch" and self.engine.device == "cpu":
            # torch's and OpenBLAS's thread pools spin against each other on shared cores (measured 3x
            # slower on 2 cores with the numpy shadow), so torch gets one thread for the run
            import torch

            threads = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                return self._run()
            finally:
                torch.set_num_threads(threads)
        return self._run()

    def _run(self) -> list[dict]:
        cfg = self.config
        # Ctrl-C is taken between steps, never inside one: a half-applied step (optimizer state moved,
        # Z not yet stored, shadow behind) or a half-written run directory would be inconsistent
        interrupted: list[int] = []
        in_main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGINT, lambda *_: interrupted.append(1)) if in_main else None
        marks = [s for s in recorded_steps(cfg.steps, cfg.records_per_decade) if s > self.step]
        progress = Progress(cfg.steps, f"{cfg.backend}/{cfg.precision}/{cfg.retraction}", self.progress_enabled)
        names = parse_adversary(cfg.adversary)
        probe = self._probe if "adaptive" in names else None
        try:
            if self.step == 0 and not self.rows:
                self._record()
            while self.step < cfg.steps:
                if interrupted:
                    raise KeyboardInterrupt
                grads = self.engine.gradients(names, cfg.seed, self.step, cfg.adversary_params, probe)
                for e in self.engine.step(grads, self.step):
                    self._event(self.step + 1, e)
                if self.shadow:
                    self.shadow.step(grads, self.step)
                self.step += 1
                if marks and self.step == marks[0]:
                    marks.pop(0)
                    self._record()
                progress.update(self.step)
        except KeyboardInterrupt:
            # keep the work done: checkpoint this step (metrics rows stay those of the recorded steps)
            self._save()
            raise PitcheckError(f"interrupted at step {self.step} of {self.out}, checkpoint saved; the same "
                                "command with --resume continues it (pitcheck compare resumes by itself)") from None
        finally:
            if in_main:
                signal.signal(signal.SIGINT, previous)
        if not self.rows or self.rows[-1]["step"] != self.step:
            self._record()
        progress.update(cfg.steps)
        return self.rows


def run(config: RunConfig, out: Path | str, resume: bool = False, progress: bool | None = None) -> list[dict]:
    """Run (or resume) a trajectory; returns the metric rows, also written to out/metrics.csv."""
    return Trajectory(config, out, resume=resume, progress=progress).run()
