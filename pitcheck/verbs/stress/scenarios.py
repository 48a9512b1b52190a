"""Scenario files: what `pitcheck stress` runs and what must hold over each run.

A scenario file (TOML) holds one table per scenario: the options of `pitcheck run` (RunConfig's fields),
and what must hold over the run:

    [scenario.qr-fp32]
    backend = "torch"
    precision = "fp32"
    retraction = "qr"
    steps = 2000
    why = "QR re-orthonormalises every step"      # optional: printed with a broken budget
    source = "theory"                              # where the budgets come from: theory, measured or user
    [scenario.qr-fp32.budget]                      # ceilings on the worst (largest) recorded value
    orthonormality = 1e-5
    pinv_drift = 1e-4
    [scenario.qr-fp32.budget.growth]               # ceilings on the fitted exponent p of metric ~ step^p
    orthonormality = 0.25
    [scenario.qr-fp32.floor]                       # the last recorded value must reach at least this
    shadow_Z = 1e-6
    [scenario.qr-fp32.floor.growth]                # the fitted exponent must reach at least this
    shadow_Z = 0.3

A budget may judge any metric of metrics.csv, a sharded run's (shards > 1) shard_distance_Z/T and
replica_spread too; a ceiling of 0 demands exactly 0 (replica_spread = 0: the replicas agree bit for bit).

A scenario on the user's own module names it: `target = "package.module:make"` or `"path/file.py:make"`
(validate's contract; a relative file path is found beside the scenario file first, then in the working
directory), with `dtype` (float32 by default), `timeout` (seconds, 300 by default) and the run options that
apply to a module pitcheck does not build (steps, vocab, dim, seed, device, adversary, adversary_params,
optimizer, lr, records_per_decade: without optimizer or lr, the module's own configure_optimizer or SGD).
Its budgets judge what can be read off the module's maps (target.TARGET_METRICS); orthonormality,
pinv_drift and penrose have default ceilings (target.default_limit) that its [budget] table may replace.

Scenario keys besides the run options: why, source, requires ("cuda": skipped without a GPU),
require_events and forbid_events (event names of events.jsonl), adversary_params (a table).
A scenario whose recorded steps are too few for its growth checks (MIN_GROWTH_POINTS from step 1) is
refused, and so is steps = 0 (only the initial state would be judged) unless the scenario says
`initial_state = true`: then it runs no step and its budgets and floors are judged at step 0.

A scenario is named FILE-STEM::NAME (with as many parent folders before the stem as set apart files
of one stem). Every refusal is a StressInputError naming the file and the key or line.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import re
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

from ...infra.errors import PitcheckError
from ...model.gradients import AdversaryParams
from ...model.heads import PIT_ONLY
from ...infra.rundir import METRIC_COLUMNS, SHARD_COLUMNS
from ...numerics.stats import MIN_GROWTH_POINTS
from ...trajectory import RunConfig, recorded_steps
from ...trajectory.plan import head_named
from .target import (DEFAULT_BUDGET_METRICS, DEFAULT_DTYPE, DEFAULT_TIMEOUT, TARGET_KEYS, TARGET_METRICS,
                     TARGET_RUN_KEYS, default_limit)

SUITE_DIR = Path(__file__).resolve().parents[3] / "stress"  # the shipped suite, in the source tree
SOURCES = ("theory", "measured", "user")
EVENTS = ("breakdown", "gradient_overflow", "nonfinite_gradient", "nonfinite_metric", "nonfinite_state",
          "precision_cannot_resolve", "reprojected", "retraction_failed", "threshold_crossed")
SCENARIO_KEYS = ("why", "source", "requires", "require_events", "forbid_events", "budget", "floor", "initial_state")
SHADOW_METRICS = ("shadow_Z", "shadow_T")


class StressInputError(PitcheckError):
    """Bad scenario input: the message names the file and the key or line."""


def _metric_names() -> list[str]:
    """What a budget may judge: every recorded metric, a sharded run's distances and replica spread too."""
    return [c for c in METRIC_COLUMNS + SHARD_COLUMNS if c != "step"]


def _run_fields() -> dict[str, str]:
    """RunConfig's options that a scenario may set, with their types ('int', 'float', 'str', 'bool')."""
    hints = typing.get_type_hints(RunConfig)

    def kind(hint) -> str:
        # an optional field (backend: str | None, None meaning 'inferred') takes its type's values in a file
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        hint = args[0] if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 1 else hint
        return getattr(hint, "__name__", str(hint))

    return {f.name: kind(hints[f.name]) for f in dataclasses.fields(RunConfig)}


@dataclass(frozen=True)
class Check:
    """One budget (a ceiling) or floor on one metric of a run."""
    metric: str
    kind: str  # "max" (ceiling on the worst value), "growth" (ceiling on the exponent), "floor", "growth_floor"
    limit: float
    origin: str = ""  # where the limit comes from when not the scenario's source: "default" for a target's


@dataclass
class Scenario:
    """One run (its RunConfig) and what must hold over it, as a scenario file gives them."""
    name: str
    file: str
    config: RunConfig
    checks: list[Check]
    why: str = ""
    source: str = "user"
    requires: str = ""
    require_events: list[str] = field(default_factory=list)
    forbid_events: list[str] = field(default_factory=list)
    label: str = ""  # the file's part of the id: its stem, or folders/stem where files share a stem
    initial_state: bool = False  # steps = 0 on purpose: the budgets judge the start alone
    target: str = ""  # the user's module (module:factory or path/file.py:factory); '' for pitcheck's heads
    dtype: str = DEFAULT_DTYPE  # a target's dtype
    timeout: float = DEFAULT_TIMEOUT  # a target's process's time limit, seconds
    own_optimizer: bool = True  # a target stepped by its own optimizer (the scenario gave no optimizer or lr)

    @property
    def file_label(self) -> str:
        return self.label or Path(self.file).stem

    @property
    def id(self) -> str:
        return f"{self.file_label}::{self.name}"


# ---------------------------------------------------------------- loading and validating scenario files

def _key_parts(key_text: str) -> list[str] | None:
    """The parts of a TOML (dotted) key as TOML reads them (quotes and escapes decoded); None if not a key."""
    try:
        doc = tomllib.loads(f"{key_text} = 0")
    except tomllib.TOMLDecodeError:
        return None
    parts = []
    while isinstance(doc, dict) and len(doc) == 1:
        [(k, doc)] = doc.items()
        parts.append(k)
    return parts


def _line_of(text: str, table: list[str], key: str | None = None) -> int | None:
    """Line number (1-based) of `key` inside the TOML table `table` (or of the table's header)."""
    header = re.compile(r"^\s*\[\s*([^\[\]]+?)\s*\]\s*(#.*)?$")
    current = None
    for i, line in enumerate(text.splitlines(), 1):
        m = header.match(line)
        if m:
            current = _key_parts(m.group(1))
            if key is None and current is not None and current[:len(table)] == table:
                return i
            continue
        if key is not None and current == table:
            k = re.match(r"^\s*(\"(?:[^\"\\]|\\.)*\"|'[^']*'|[A-Za-z0-9_-]+)\s*=", line)
            if k and _key_parts(k.group(1)) == [key]:
                return i
    return None


def _where(path: Path, text: str, table: list[str], key: str | None = None) -> str:
    line = _line_of(text, table, key)
    return f"{path}:{line}" if line else str(path)


def _suggest(word: str, choices) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _typed(value, kind: str):
    """value if it has RunConfig's type `kind` (an int is a float too), else None."""
    if kind == "bool":
        return value if isinstance(value, bool) else None
    if isinstance(value, bool):
        return None
    if kind == "int":
        return value if isinstance(value, int) else None
    if kind == "float":
        return float(value) if isinstance(value, (int, float)) else None
    if kind == "str":
        return value if isinstance(value, str) else None
    return None


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _load_checks(path, text, name, key, sub, metrics) -> list[Check]:
    kind_top, kind_growth = ("max", "growth") if key == "budget" else ("floor", "growth_floor")
    checks = []
    base = ["scenario", name, key]
    if not isinstance(sub, dict):
        raise StressInputError(f"{_where(path, text, ['scenario', name], key)}: scenario {name!r}: {key} must be "
                               f"a table of metric = number")
    for metric, limit in sub.items():
        if metric == "growth":
            if not isinstance(limit, dict):
                raise StressInputError(f"{_where(path, text, base, 'growth')}: scenario {name!r}: {key}.growth must "
                                       "be a table of metric = exponent")
            for gm, gl in limit.items():
                if gm not in metrics:
                    raise StressInputError(f"{_where(path, text, base + ['growth'], gm)}: scenario {name!r}: "
                                           f"{key}.growth on unknown metric {gm!r}{_suggest(gm, metrics)}")
                v = _number(gl)
                if v is None or not math.isfinite(v):
                    raise StressInputError(f"{_where(path, text, base + ['growth'], gm)}: scenario {name!r}: "
                                           f"{key}.growth.{gm} must be a finite number, got {gl!r}")
                checks.append(Check(gm, kind_growth, v))
            continue
        if metric not in metrics:
            raise StressInputError(f"{_where(path, text, base, metric)}: scenario {name!r}: {key} on unknown metric "
                                   f"{metric!r}{_suggest(metric, metrics)}")
        v = _number(limit)
        # a ceiling of 0 demands exactly 0 (replica_spread: the replicas agree bit for bit); a floor of 0
        # would hold whatever the run did
        if v is None or not (math.isfinite(v) and (v > 0 or (v == 0 and key == "budget"))):
            zero = " (or 0: a ceiling of exactly zero)" if key == "budget" else ""
            raise StressInputError(f"{_where(path, text, base, metric)}: scenario {name!r}: {key}.{metric} must be a "
                                   f"positive finite number{zero}, got {limit!r}")
        checks.append(Check(metric, kind_top, v))
    return checks


def load_file(path: Path | str) -> list[Scenario]:
    """The scenarios of one TOML file, every key checked; StressInputError (file and line named) if not."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise StressInputError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise StressInputError(f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        msg = str(exc)
        m = re.search(r"at line (\d+)", msg)
        where = f"{path}:{m.group(1)}" if m else str(path)
        raise StressInputError(f"{where}: malformed TOML: {msg}") from None
    for top in doc:
        if top != "scenario":
            raise StressInputError(f"{_where(path, text, [top]) if isinstance(doc[top], dict) else _where(path, text, [], top)}"
                                   f": unknown top-level key {top!r} (a scenario file holds [scenario.NAME] tables)")
    scenarios = doc.get("scenario", {})
    if not isinstance(scenarios, dict) or not scenarios:
        raise StressInputError(f"{path}: no scenarios (a scenario file holds [scenario.NAME] tables)")
    fields = _run_fields()
    run_keys = {k: v for k, v in fields.items() if k != "adversary_params"}
    param_fields = {f.name: f.type if isinstance(f.type, str) else f.type.__name__
                    for f in dataclasses.fields(AdversaryParams)}
    allowed = set(run_keys) | set(SCENARIO_KEYS) | {"adversary_params"} | set(TARGET_KEYS)
    metrics = _metric_names()
    out = []
    for name, table in scenarios.items():
        here = ["scenario", name]
        if not name.strip() or not name.isprintable():
            # a control character breaks the table, the one-line messages and the JUnit XML
            raise StressInputError(f"{_where(path, text, here)}: scenario {name!r}: a scenario name must be "
                                   "printable text, not blank (no control, line-break or invisible characters)")
        if not isinstance(table, dict):
            raise StressInputError(f"{_where(path, text, [], 'scenario')}: scenario {name!r} must be a table")
        kwargs = {}
        is_target = "target" in table
        for key, value in table.items():
            if key not in allowed:
                raise StressInputError(f"{_where(path, text, here, key)}: scenario {name!r}: unknown key {key!r}"
                                       f"{_suggest(key, allowed)}")
            _check_target_key(path, text, name, key, is_target)
            if key in run_keys:
                v = _typed(value, run_keys[key])
                if v is None:
                    raise StressInputError(f"{_where(path, text, here, key)}: scenario {name!r}: {key} must be "
                                           f"{'a' if run_keys[key] != 'int' else 'an'} {run_keys[key]}, got {value!r}")
                kwargs[key] = v
        params = table.get("adversary_params", {})
        if not isinstance(params, dict):
            raise StressInputError(f"{_where(path, text, here, 'adversary_params')}: scenario {name!r}: "
                                   "adversary_params must be a table")
        pkw = {}
        for key, value in params.items():
            if key not in param_fields:
                raise StressInputError(f"{_where(path, text, here + ['adversary_params'], key)}: scenario {name!r}: "
                                       f"unknown adversary_params key {key!r}{_suggest(key, param_fields)}")
            v = _typed(value, param_fields[key])
            if v is None:
                raise StressInputError(f"{_where(path, text, here + ['adversary_params'], key)}: scenario {name!r}: "
                                       f"adversary_params.{key} must be a {param_fields[key]}, got {value!r}")
            pkw[key] = v
        if pkw:
            kwargs["adversary_params"] = AdversaryParams(**pkw)
        config = RunConfig(**kwargs)
        checks = []
        for key in ("budget", "floor"):
            if key in table:
                checks += _load_checks(path, text, name, key, table[key], metrics)
        why = table.get("why", "")
        source = table.get("source", "user")
        requires = table.get("requires", "cuda" if config.device == "cuda" else "")
        for key, value, ok in (("why", why, isinstance(why, str)),
                               ("source", source, source in SOURCES),
                               ("requires", requires, requires in ("", "cuda"))):
            if not ok:
                choices = {"why": "a string", "source": "one of " + ", ".join(SOURCES), "requires": '"cuda"'}[key]
                raise StressInputError(f"{_where(path, text, here, key)}: scenario {name!r}: {key} must be {choices}, "
                                       f"got {value!r}")
        ev = {}
        for key in ("require_events", "forbid_events"):
            names = table.get(key, [])
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise StressInputError(f"{_where(path, text, here, key)}: scenario {name!r}: {key} must be a list of "
                                       "event names")
            for n in names:
                if n not in EVENTS:
                    raise StressInputError(f"{_where(path, text, here, key)}: scenario {name!r}: {key}: unknown event "
                                           f"{n!r}{_suggest(n, EVENTS)}; events are {', '.join(EVENTS)}")
            ev[key] = names
        target = _target_fields(path, text, name, table, config, checks) if is_target else {}
        if is_target:
            checks = target.pop("checks")
        if not checks and not ev["require_events"] and not ev["forbid_events"]:
            raise StressInputError(f"{_where(path, text, here)}: scenario {name!r} has nothing to check: give a "
                                   "[budget] table (or floor, require_events, forbid_events)")
        # metrics a run of this config never records: a budget on them could never be judged
        never = set()
        if is_target:
            pass  # the target's own metrics were checked by _target_fields
        elif config.backend != "torch" or not config.shadow:
            never |= set(SHADOW_METRICS)
        if not head_named(config.head).has_retraction:
            never |= set(PIT_ONLY)
        if config.shards == 1:
            never |= set(SHARD_COLUMNS)
        for c in checks:
            if c.metric in never:
                raise StressInputError(f"{_where(path, text, here)}: scenario {name!r}: budget on {c.metric}, which "
                                       f"this run does not record (backend {config.backend}, shadow {config.shadow}, "
                                       f"head {config.head}, shards {config.shards})")
        try:
            config.validate()
        except PitcheckError as exc:
            raise StressInputError(f"{_where(path, text, here)}: scenario {name!r}: {exc}") from None
        initial_state = table.get("initial_state", False)
        if not isinstance(initial_state, bool):
            raise StressInputError(f"{_where(path, text, here, 'initial_state')}: scenario {name!r}: initial_state "
                                   f"must be true or false, got {initial_state!r}")
        if config.steps == 0 and not initial_state:
            raise StressInputError(f"{_where(path, text, here, 'steps')}: scenario {name!r}: steps = 0 runs no step, "
                                   "so only the initial state would be judged; give steps >= 1, or "
                                   "initial_state = true to judge the start alone")
        if initial_state and config.steps != 0:
            raise StressInputError(f"{_where(path, text, here, 'initial_state')}: scenario {name!r}: initial_state = "
                                   f"true judges the start alone, but steps = {config.steps}; give steps = 0")
        points = sum(1 for st in recorded_steps(config.steps, config.records_per_decade) if st >= 1)
        for c in checks:
            if c.kind in ("growth", "growth_floor") and points < MIN_GROWTH_POINTS:
                key = "budget" if c.kind == "growth" else "floor"
                raise StressInputError(
                    f"{_where(path, text, here + [key, 'growth'], c.metric)}: scenario {name!r}: {key}.growth."
                    f"{c.metric} needs at least {MIN_GROWTH_POINTS} recorded steps from step 1 to fit an exponent; "
                    f"steps = {config.steps} (records_per_decade = {config.records_per_decade}) records {points}: "
                    "raise steps")
        out.append(Scenario(name, str(path), config, checks, why, source, requires, ev["require_events"],
                            ev["forbid_events"], initial_state=initial_state, **target))
    return out


def _check_target_key(path, text, name, key, is_target) -> None:
    """A key that a target scenario does not take (pitcheck's head's options, events), or a target's key in a
    scenario without a target: StressInputError naming it."""
    here = ["scenario", name]
    if is_target and key not in (*TARGET_RUN_KEYS, *TARGET_KEYS, *SCENARIO_KEYS):
        raise StressInputError(f"{_where(path, text, here, key)}: scenario {name!r}: {key} does not apply to a "
                               "target scenario (the module is its own head); it takes "
                               f"{', '.join(TARGET_KEYS + TARGET_RUN_KEYS)}")
    if is_target and key in ("require_events", "forbid_events"):
        raise StressInputError(f"{_where(path, text, here, key)}: scenario {name!r}: {key} does not apply to a "
                               "target scenario: a module records no events; give budgets")
    if not is_target and key in ("dtype", "timeout"):
        raise StressInputError(f"{_where(path, text, here, key)}: scenario {name!r}: {key} applies to a target "
                               "scenario only (one with target = \"module:factory\")")


def _target_fields(path, text, name, table, config, checks) -> dict:
    """A target scenario's own fields (target, dtype, timeout, own_optimizer) and its checks with the
    default ceilings added where its budget table sets none; StressInputError naming the key at fault."""
    from ..validate.dtypes import DTYPES
    from ..validate.target import TargetError, split_target
    from .target_worker import LOSS_CHANNELS

    here = ["scenario", name]
    target = table["target"]
    try:
        split_target(target)
    except TargetError as exc:
        raise StressInputError(f"{_where(path, text, here, 'target')}: scenario {name!r}: {exc}") from None
    where, _, factory = target.rpartition(":")
    if where.endswith(".py") and not Path(where).is_absolute() and (path.parent / where).is_file():
        target = f"{path.parent / where}:{factory}"  # beside the scenario file first
    dtype = table.get("dtype", DEFAULT_DTYPE)
    if dtype not in DTYPES:
        raise StressInputError(f"{_where(path, text, here, 'dtype')}: scenario {name!r}: dtype must be one of "
                               f"{', '.join(DTYPES)}, got {dtype!r}")
    timeout = _number(table.get("timeout", DEFAULT_TIMEOUT))
    if timeout is None or not (math.isfinite(timeout) and timeout > 0):
        raise StressInputError(f"{_where(path, text, here, 'timeout')}: scenario {name!r}: timeout must be a "
                               f"positive number of seconds, got {table['timeout']!r}")
    unusable = [c for c in config.adversary.split(",") if c.strip() and c.strip() not in LOSS_CHANNELS]
    if unusable:
        raise StressInputError(f"{_where(path, text, here, 'adversary')}: scenario {name!r}: gradient model "
                               f"{unusable[0].strip()!r} has no form as a loss on a module's outputs; a target "
                               f"scenario takes {', '.join(LOSS_CHANNELS)}")
    for c in checks:
        if c.metric not in TARGET_METRICS:
            key = "budget" if c.kind in ("max", "growth") else "floor"
            table_of = here + [key] + (["growth"] if c.kind in ("growth", "growth_floor") else [])
            raise StressInputError(f"{_where(path, text, table_of, c.metric)}: scenario {name!r}: {key} on {c.metric}, "
                                   "which a target's maps do not show; a target scenario judges "
                                   f"{', '.join(TARGET_METRICS)}")
    given = {c.metric for c in checks if c.kind == "max"}
    defaults = [Check(m, "max", default_limit(dtype, config.dim, m), origin="default")
                for m in DEFAULT_BUDGET_METRICS if m not in given]
    return {"target": target, "dtype": dtype, "timeout": timeout, "checks": defaults + checks,
            "own_optimizer": "optimizer" not in table and "lr" not in table}


def suite_files() -> list[Path]:
    """pitcheck's own scenario files (stress/*.toml in the source tree)."""
    files = sorted(SUITE_DIR.glob("*.toml"))
    if not files:
        raise StressInputError(f"pitcheck's own suite is not here ({SUITE_DIR}/*.toml: none); name scenario files")
    return files


def _file_identity(path: Path) -> tuple:
    """What makes two paths one file: its device and inode when it exists (links, '..'), else its resolved path."""
    try:
        st = path.stat()
        return ("inode", st.st_dev, st.st_ino)
    except OSError:
        return ("path", str(path.resolve()))


def file_labels(files: list[Path]) -> list[str]:
    """The files' parts of the scenario ids: the stem, or, for files sharing a stem, as many of their
    folders before it as tell them apart ('team1/ci', 'team2/ci'). StressInputError if nothing does."""
    resolved = [f.resolve().with_suffix("") for f in files]
    labels = [r.name for r in resolved]
    for stem in {x for x in labels if labels.count(x) > 1}:
        group = [i for i, x in enumerate(labels) if x == stem]
        for k in range(2, max(len(resolved[i].parts) for i in group) + 1):
            cand = {i: "/".join(resolved[i].parts[-k:]).lstrip("/") for i in group}
            if len(set(cand.values())) == len(group):
                break
        else:
            a, b = next((files[i], files[j]) for i in group for j in group if i < j and cand[i] == cand[j])
            raise StressInputError(f"{a} and {b}: two scenario files whose names cannot be told apart "
                                   f"(both {stem}::...); rename one")
        for i in group:
            labels[i] = cand[i]
    return labels


def load_scenarios(paths: list[Path | str] | None = None) -> list[Scenario]:
    """Every scenario of the files (pitcheck's suite when none), with ids unique across the files.
    One file given twice (under any spelling or link) is refused."""
    files = [Path(p) for p in paths] if paths else suite_files()
    seen: dict[tuple, Path] = {}
    for f in files:
        key = _file_identity(f)
        if key in seen:
            also = f" (as {seen[key]} and {f})" if str(seen[key]) != str(f) else ""
            raise StressInputError(f"{f}: scenario file given twice{also}")
        seen[key] = f
    out = []
    for f, label in zip(files, file_labels(files)):
        for s in load_file(f):
            s.label = label
            out.append(s)
    return out




def _shared_stem(name: str, scenarios: list[Scenario]) -> str:
    """Where `name` is STEM::NAME and files sharing that stem named their scenarios by folders too, which ids
    it could mean and why ('' otherwise)."""
    stem, sep, bare = name.partition("::")
    ids = sorted({s.id for s in scenarios if s.name == bare and s.file_label != stem
                  and s.file_label.rsplit("/", 1)[-1] == stem})
    if not sep or len(ids) < 2:
        return ""
    files = sorted({str(s.file) for s in scenarios if s.id in ids})
    return (f": the files {' and '.join(files)} share the stem {stem!r}, so their scenarios are named by their "
            f"folders too ({', '.join(ids)}); give one of those, or the bare name {bare!r} for every file's")


def select_scenarios(scenarios: list[Scenario], only) -> list[Scenario]:
    """The scenarios named in `only` (all when it is empty): a bare name picks it in every file, a
    qualified one (ci::name) one scenario. StressInputError for a name that matches none."""
    if not only:
        return scenarios
    known = {s.name for s in scenarios} | {s.id for s in scenarios}
    unknown = [n for n in only if n not in known]
    if unknown:
        why = _shared_stem(unknown[0], scenarios) or _suggest(unknown[0], known)
        raise StressInputError(f"--only {unknown[0]!r}: no such scenario{why}")
    return [s for s in scenarios if s.name in only or s.id in only]
