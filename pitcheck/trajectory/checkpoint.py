"""The run directory's contents: the manifest, the checkpoint's arrays, one commit of all four files, and
resuming: everything loaded is checked against this run's config and state, with the reason for a refusal."""
from __future__ import annotations

import functools
import hashlib
import platform
from dataclasses import MISSING, dataclass
from pathlib import Path

import numpy as np

from .. import __version__
from ..infra.errors import PitcheckError
from .events import ends_run, malformed
from ..numerics.metrics import EXTENDED_BITS
from ..infra.rundir import (CHECKPOINT, EVENTS, LOSS_COLUMNS, MANIFEST, METRIC_COLUMNS, METRICS, SHARD_COLUMNS, EventLines,
                      LaterBytes, RunDir, csv_bytes, events_bytes, manifest_bytes, npz_bytes)
from ..sources.stateful import STATEFUL_SOURCES
from .config import RunConfig, is_int, recorded_steps
from .plan import Plan
from .step import Lockstep
from .teacher import teacher_source


def _sha256(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def input_hashes(plan: Plan) -> dict:
    """SHA-256 of the teacher file and of each stateful source's input files (None where the run has none):
    a resumed run refuses files that changed since it started."""
    config, used = plan.config, plan.source
    out = {"teacher_sha256": _sha256(teacher_source(config.teacher)[0]) if config.teacher else None}
    for source in STATEFUL_SOURCES.values():
        for key, (_, path_of) in source.input_files.items():
            path = path_of(config) if source is used else None
            out[key] = _sha256(path) if path else None
    return out


def input_file(key: str, config: RunConfig) -> str:
    """The input file whose SHA-256 the manifest holds under `key`, in words."""
    if key == "teacher_sha256":
        return f"the teacher {teacher_source(config.teacher)[0]}"
    return next(s.input_files[key][0](config) for s in STATEFUL_SOURCES.values() if key in s.input_files)


def versions() -> dict:
    import scipy  # only for its version: the run itself does not use it

    out = {"pitcheck": __version__, "python": platform.python_version(), "numpy": np.__version__}
    out["scipy"] = scipy.__version__
    try:
        import torch  # deferred: seconds to import, and a numpy run needs it only here

        out["torch"] = torch.__version__
        out["cuda"] = torch.version.cuda
    except ImportError:  # pragma: no cover - torch is a dependency
        out["torch"] = None
    return out


def manifest(config: RunConfig, pair: Lockstep, resumed_from: int | None, inputs: dict) -> dict:
    engine = pair.engine
    return {
        "config": config.to_json(),
        "policy": pair.policy.describe(),
        "device": engine.device,
        "emulated": engine.emulated,
        # where the float64 shadow ran: numpy on the CPU, torch on the model's CUDA device (None: no shadow)
        "shadow": pair.shadow_description,
        "torch_cpu_threads": engine.arrays.torch.get_num_threads() if engine.backend == "torch" and engine.device == "cpu" else None,
        "extended_precision_bits": EXTENDED_BITS,
        "versions": versions(),
        "platform": platform.platform(),
        "resumed_from": resumed_from,
        **inputs,
        # a teacher run's start: its conversion mode and certificate (teacher.start_certificate); None without
        # a teacher, or from a table's polar factor with the run's own T0
        **({"conversion": pair.start_certificate} if config.teacher else {}),
    }


def commit(store: RunDir, step: int, pair: Lockstep, rows: list[dict], events: list[dict], manifest: dict,
           later: bool = False, event_lines: EventLines | None = None, with_checkpoint: bool = True) -> LaterBytes | None:
    """One commit of the whole directory at `step` (later: written by the commit thread, RunDir.commit, which
    also makes the checkpoint's bytes from the state's arrays, their copies off a device started here; the
    checkpoint's LaterBytes is returned; event_lines: the run's events encoded so far, extended with the new
    ones). Without with_checkpoint the last commit's checkpoint stays, and the record names its step
    (`checkpoint_step`): a resume goes on from there and recomputes the rows and events after it, which the
    same stream gives again bit for bit."""
    checkpoint_step = step if with_checkpoint else checkpoint_step_of(store.record)
    checkpoint = None
    if with_checkpoint:
        checkpoint = (LaterBytes(functools.partial(npz_bytes, pair.arrays(step, later=True))) if later
                      else npz_bytes(pair.arrays(step)))
    store.commit(step, {
        CHECKPOINT: checkpoint,
        METRICS: csv_bytes(rows),
        EVENTS: event_lines.encode(events) if event_lines is not None else events_bytes(events),
        MANIFEST: manifest_bytes(manifest),
    }, later=later, **({} if checkpoint_step == step else {"checkpoint_step": checkpoint_step}))
    return checkpoint if isinstance(checkpoint, LaterBytes) else None


def checkpoint_step_of(record: dict | None) -> int | None:
    """The step of the checkpoint a commit record holds (its own step unless it kept an earlier one)."""
    return None if record is None else record.get("checkpoint_step", record["step"])


# the run's options (pitcheck run) of config fields, where a field's name spelled with dashes is not its option
OPTION_OF = {"shadow": None, "records_per_decade": None, "adversary_params": None, "lm": None}


def config_differences(config: RunConfig, manifest: dict, ignore: tuple[str, ...], out: Path) -> list[str]:
    mine, theirs = config.to_json(), manifest["config"]
    # to_json leaves out fields at their defaults (an unsharded run's sharding, an unused source's options):
    # a manifest holding them is this pitcheck's, and they are compared with this run's values
    unknown = sorted(set(theirs) - set(RunConfig.__dataclass_fields__))
    if unknown:
        raise PitcheckError(f"{out}/{MANIFEST} has config keys this pitcheck does not know "
                            f"({', '.join(unknown)}): written by another version? pass --force to start over")
    full = {k: mine.get(k, getattr(config, k)) for k in RunConfig.__dataclass_fields__}
    differ = [k for k in full if k not in ignore and k != "teacher_mode" and (k in mine or k in theirs)
              and full[k] != _written(theirs, k)]
    # the teacher's mode, as the start it resolves to: a mode given or its default, and an older pitcheck's start
    if "teacher_mode" not in ignore and written_start_mode(manifest) != config.resolve().teacher_mode:
        differ.append("teacher_mode")
    return differ


def written_start_mode(manifest: dict) -> str | None:
    """The conversion mode a run directory's start was (None: no teacher, or no conversion): its manifest's
    certificate says; a manifest from before certificates had every teacher, a GGUF one too, start at the
    table's polar factor with the run's own T0, which is balanced's start at cond 1."""
    if "conversion" in manifest:
        return manifest["conversion"]["mode"] if manifest["conversion"] else None
    theirs = manifest["config"]
    if not theirs.get("teacher") or theirs.get("head", RunConfig.head) != "pit":
        return None
    return "balanced" if theirs.get("cond", RunConfig.cond) == 1 else None


def _written(theirs: dict, name: str):
    """A manifest's config value; a field to_json left out had its default there (None: one without a plain
    default, such as an unused source's options)."""
    default = RunConfig.__dataclass_fields__[name].default
    return theirs[name] if name in theirs else (None if default is MISSING else default)


def _as_given(name: str, value) -> str:
    """A config value as the option that gives it to `pitcheck run` ('' if no option does)."""
    option = OPTION_OF.get(name, "--" + name.replace("_", "-"))
    if option is None:
        return "--no-shadow" if name == "shadow" and value is False else ""
    return f"without {option}" if value in ("", None) else f"{option} {value}"


def differences_told(differ: list[str], config: RunConfig, manifest: dict) -> str:
    """What the run directory was written with where this run differs, and the options that resume it."""
    theirs = manifest["config"]

    def values(k):  # (written, asked): a teacher's mode as the start each resolves to
        if k == "teacher_mode":
            return written_start_mode(manifest) or "", config.resolve().teacher_mode or ""
        return _written(theirs, k), getattr(config, k)

    written = ", ".join(f"{k}={values(k)[0]!r}" for k in differ)
    asked = ", ".join(f"{k}={values(k)[1]!r}" for k in differ)
    options = [_as_given(k, values(k)[0]) for k in differ]
    given = [o for o in options if o and not o.startswith("without ")]
    absent = [o for o in options if o.startswith("without ")]
    how = ("; resume it " + " and ".join(filter(None, [f"with {' '.join(given)}" if given else "", " ".join(absent)]))
           if all(options) else "")
    return (f"config differs in {', '.join(differ)}: the run was written with {written}, this run asks "
            f"{asked}{how}")


def check_restart(store: RunDir, config: RunConfig) -> None:
    """A run directory without a checkpoint (results/ keep none): only the very same run may redo it."""
    manifest = store.read_manifest()
    differ = config_differences(config, manifest, ("device",), store.path)
    if differ:
        raise PitcheckError(f"cannot resume {store.path}: it holds no checkpoint, and its "
                            f"{differences_told(differ, config, manifest)}; pass --force to replace it or choose "
                            f"another --out")


@dataclass
class Resumed:
    """What a resumed run goes on from: its step, rows and events, and the breakdown it had ended in."""
    step: int
    rows: list[dict]
    events: list[dict]
    broken: dict | None


class Resume:
    """Loads a run directory into `pair`, checking each file against the run; refuses on any mismatch."""

    def __init__(self, store: RunDir, config: RunConfig, pair: Lockstep, inputs: dict):
        self.store, self.config, self.pair, self.inputs = store, config, pair, inputs

    def refuse(self, why: str) -> PitcheckError:
        return PitcheckError(f"cannot resume {self.store.path}: {why}; pass --force to start over")

    def load(self) -> Resumed:
        manifest = self.store.read_manifest()
        written_steps = self._check_manifest(manifest)
        step = self._load_checkpoint()
        rows = self._check_rows(step, written_steps)
        events = self.store.read_events()
        if self._kept_checkpoint(step):  # the rows and events after the checkpoint come again as the run goes on
            rows = [r for r in rows if r["step"] <= step]
            events = [e for e in events if e["step"] <= step]
        broken = None
        for n, e in enumerate(events):
            if e["step"] > step and not ends_run(events, n, step):
                raise self.refuse(f"{EVENTS} has an event at step {e['step']}, after the checkpoint's {step}")
            problem = malformed(e)
            if problem:
                raise self.refuse(f"{EVENTS} has {problem}")
            if ends_run(events, n, step):
                broken = e
        if self.pair.engine.source:
            self._check_losses(manifest, rows)
        return Resumed(step, rows, events, broken)

    def _check_manifest(self, manifest: dict) -> int:
        """The manifest's config and input files are this run's; returns the steps it was written for."""
        differ = config_differences(self.config, manifest, ("steps", "device"), self.store.path)
        if differ:
            raise PitcheckError(f"cannot resume {self.store.path}: {differences_told(differ, self.config, manifest)}")
        for key, digest in self.inputs.items():
            # a directory of an older pitcheck may lack a hash: nothing to compare it with
            if manifest.get(key) is not None and manifest[key] != digest:
                raise self.refuse(f"{input_file(key, self.config)} changed since the run started (its SHA-256 "
                                  f"was {str(manifest[key])[:12]}..., is {str(digest)[:12]}...): the run would mix "
                                  "two states")
        written_steps = manifest["config"].get("steps")
        if not is_int(written_steps) or written_steps < 0:
            raise self.refuse(f"{MANIFEST}'s steps is {written_steps!r}")
        return written_steps

    def _load_checkpoint(self) -> int:
        """Load the checkpoint's state into the engines; returns its step."""
        cfg, pair = self.config, self.pair
        ck = self.store.read_checkpoint()
        template = pair.arrays(0)
        if set(ck) != set(template):
            missing, extra = sorted(set(template) - set(ck)), sorted(set(ck) - set(template))
            raise self.refuse(f"{CHECKPOINT} does not hold this run's state (missing {missing or 'nothing'}, "
                              f"unexpected {extra or 'nothing'})")
        for k, want in template.items():
            want, got = np.asarray(want), ck[k]
            if got.shape != want.shape or got.dtype != want.dtype:
                raise self.refuse(f"{CHECKPOINT}'s {k} is {got.dtype} {got.shape}, this run's is "
                                  f"{want.dtype} {want.shape}")
            if got.dtype.kind == "f" and not np.isfinite(got).all():
                raise self.refuse(f"{CHECKPOINT}'s {k} has non-finite entries")
        step = int(ck["step"])
        if step < 0:
            raise self.refuse(f"{CHECKPOINT}'s step is {step}")
        # a commit that kept an earlier checkpoint holds rows up to its own step
        held = max(step, self.store.record["step"]) if self._kept_checkpoint(step) else step
        if held > cfg.steps:
            raise PitcheckError(f"cannot resume {self.store.path} with --steps {cfg.steps}: it holds a run at step "
                                f"{held}; give --steps >= {held}, choose another --out, or pass --force to start over")
        pair.load(ck)
        # the loaded state re-exports exactly what was saved, unless values lie outside the policy's formats
        # or the stored Z and L do not follow from the master state
        again = pair.arrays(step)
        changed = [k for k in template if not np.array_equal(again[k], ck[k])]
        if changed:
            raise self.refuse(f"{CHECKPOINT}'s {', '.join(changed)} do not match the state they restore "
                              f"(values not representable in {cfg.precision}, or edited)")
        problem = pair.engine.degenerate()
        if problem:
            raise self.refuse(f"{CHECKPOINT} holds a state that cannot compute: {problem}")
        return step

    def _kept_checkpoint(self, step: int) -> bool:
        """The last commit recorded rows past its checkpoint, which it kept from the commit at `step`."""
        record = self.store.record
        return record is not None and "checkpoint_step" in record and record["checkpoint_step"] == step

    def _check_rows(self, step: int, written_steps: int) -> list[dict]:
        rows = self.store.read_metrics()
        if not rows or rows[0]["step"] != 0:
            raise self.refuse(f"{METRICS} has no row for step 0 (emptied or truncated)")
        want = set(METRIC_COLUMNS) | (set(SHARD_COLUMNS) if self.config.shards > 1 else set())
        if set(rows[0]) - set(LOSS_COLUMNS) != want:
            raise self.refuse(f"{METRICS} does not have this run's columns")
        if rows[-1]["step"] > step and not (self._kept_checkpoint(step) and rows[-1]["step"] <= self.store.record["step"]):
            raise self.refuse(f"{METRICS} has rows after step {step}, the checkpoint's: it mixes two states")
        # a commit record vouches that rows and checkpoint were written together; without one (a directory
        # of an older pitcheck) a checkpoint at a recorded step must have its row
        if (self.store.record is None and step in recorded_steps(written_steps, self.config.records_per_decade)
                and rows[-1]["step"] != step):
            raise self.refuse(f"{METRICS} ends at step {rows[-1]['step']}, before the checkpoint's step {step}: "
                              "rows were lost")
        return rows

    def _check_losses(self, manifest: dict, rows: list[dict]) -> None:
        """Every row of a run with a stateful source has its losses: in metrics.csv, or (an older pitcheck's
        directory) in the source's manifest entry, whence they are put back on the rows and move to
        metrics.csv at the next commit."""
        source = self.pair.engine.source
        entry = manifest.get(source.name)
        losses = entry.get("losses") if isinstance(entry, dict) else None
        if losses is not None:
            ok = isinstance(losses, list) and all(
                isinstance(e, dict) and type(e.get("step")) is int
                and all(k in LOSS_COLUMNS and isinstance(v, (int, float)) for k, v in e.items() if k != "step")
                for e in losses)
            if not ok or [e["step"] for e in losses] != [r["step"] for r in rows] or any(
                    k in r for r in rows for k in LOSS_COLUMNS):
                raise self.refuse(f"{MANIFEST}'s {source.name} losses do not match the rows of {METRICS}")
            for e, row in zip(losses, rows):
                row.update({k: float(v) for k, v in e.items() if k != "step"})
        want = source.loss_columns(self.pair.shadow is not None)
        lacking = [r["step"] for r in rows if not want <= set(r)]
        if lacking:
            raise self.refuse(f"{METRICS} lacks the {source.name} losses of step {lacking[0]}")
