"""Drift stress tests for CI: scenario files (TOML), budgets on the metrics, a table, JSON and JUnit XML.

A scenario file holds one table per scenario: the options of `pitcheck run` (RunConfig's fields), and
what must hold over the run:

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

Scenario keys besides the run options: why, source, requires ("cuda": skipped without a GPU),
require_events and forbid_events (event names of events.jsonl), adversary_params (a table).
Growth exponents are least-squares slopes of log(metric) against log(step) over the recorded steps
from step 1 (step 0 is the float64 start rounded to the storage format, below any retraction's level),
from at least MIN_GROWTH_POINTS of them: fewer make a growth check INCONCLUSIVE, which fails like a
broken one. A scenario whose recorded steps are too few for its growth checks is refused, and so is
steps = 0 (only the initial state would be judged) unless the scenario says `initial_state = true`:
then it runs no step, its budgets and floors are judged at step 0, and the output says so.

A scenario is named FILE-STEM::NAME (with as many parent folders before the stem as set apart files
of one stem); each runs in OUT/<file>/<name>, the names made plain for the file system ([A-Za-z0-9_.-])
with a hash of the original appended whenever that changed them, so no two scenarios share a directory.

Exit status of `main_stress`: 0 when every budget holds, 1 when any is broken (or a run breaks down),
2 on bad input (a malformed file, an unknown key, a budget on an unknown metric), the file and the
key or line named in a one-line error, before any run starts.
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import hashlib
import json
import os
import math
import re
import shutil
import sys
import tempfile
import time
import tomllib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from xml.etree import ElementTree as ET

from .errors import PitcheckError
from .rundir import check_distinct_outputs, check_out_file, check_out_path, write_atomic

__all__ = ["Check", "Scenario", "ScenarioResult", "StressInputError", "load_scenarios", "run_scenario",
           "run_scenarios", "suite_files", "table", "junit_xml", "add_stress_parser", "main_stress"]

SUITE_DIR = Path(__file__).resolve().parent.parent / "stress"
SOURCES = ("theory", "measured", "user")
EVENTS = ("breakdown", "gradient_overflow", "nonfinite_gradient", "nonfinite_metric", "nonfinite_state",
          "precision_cannot_resolve", "reprojected", "retraction_failed", "threshold_crossed")
SCENARIO_KEYS = ("why", "source", "requires", "require_events", "forbid_events", "budget", "floor", "initial_state")
SHADOW_METRICS = ("shadow_Z", "shadow_T")
# a line through two points fits any two values: three are the fewest that can show a power law
MIN_GROWTH_POINTS = 3


class StressInputError(PitcheckError):
    """Bad scenario input: the message names the file and the key or line."""


def _metric_names() -> list[str]:
    from .rundir import METRIC_COLUMNS

    return [c for c in METRIC_COLUMNS if c != "step"]


def _run_fields() -> dict[str, str]:
    """RunConfig's options that a scenario may set, with their types ('int', 'float', 'str', 'bool')."""
    from .trajectory import RunConfig

    hints = typing.get_type_hints(RunConfig)
    return {f.name: getattr(hints[f.name], "__name__", str(hints[f.name])) for f in dataclasses.fields(RunConfig)}


@dataclass(frozen=True)
class Check:
    metric: str
    kind: str  # "max" (ceiling on the worst value), "growth" (ceiling on the exponent), "floor", "growth_floor"
    limit: float


@dataclass
class Scenario:
    name: str
    file: str
    config: object  # RunConfig
    checks: list[Check]
    why: str = ""
    source: str = "user"
    requires: str = ""
    require_events: list[str] = field(default_factory=list)
    forbid_events: list[str] = field(default_factory=list)
    label: str = ""  # the file's part of the id: its stem, or folders/stem where files share a stem
    initial_state: bool = False  # steps = 0 on purpose: the budgets judge the start alone

    @property
    def file_label(self) -> str:
        return self.label or Path(self.file).stem

    @property
    def id(self) -> str:
        return f"{self.file_label}::{self.name}"


@dataclass
class CheckResult:
    check: Check
    value: float  # the worst value, the fitted exponent, or the last value
    step: int | None  # where the worst (or last) value was recorded; None for exponents
    held: bool
    message: str = ""
    inconclusive: bool = False  # the run did not record enough to judge (never held)

    @property
    def status(self) -> str:
        return "held" if self.held else "INCONCLUSIVE" if self.inconclusive else "BROKEN"

    @property
    def headroom(self) -> str:
        c, v = self.check, self.value
        if not math.isfinite(v):
            return "-"
        if c.kind in ("growth", "growth_floor"):
            d = c.limit - v if c.kind == "growth" else v - c.limit
            return f"{d:+.2f}"
        if c.kind == "max":
            return f"{c.limit / v:.3g}x" if v > 0 else "inf"
        return f"{v / c.limit:.3g}x" if c.limit > 0 else "inf"


@dataclass
class ScenarioResult:
    scenario: Scenario
    checks: list[CheckResult] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # breakdowns and event requirements
    skipped: str = ""
    seconds: float = 0.0
    run_dir: str = ""

    @property
    def held(self) -> bool:
        return not self.errors and all(c.held for c in self.checks)


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


def _load_checks(path, text, name, table, key, sub, metrics) -> list[Check]:
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
        if v is None or not (math.isfinite(v) and v > 0):
            raise StressInputError(f"{_where(path, text, base, metric)}: scenario {name!r}: {key}.{metric} must be a "
                                   f"positive finite number, got {limit!r}")
        checks.append(Check(metric, kind_top, v))
    return checks


def load_file(path: Path | str) -> list[Scenario]:
    """The scenarios of one TOML file, every key checked; StressInputError (file and line named) if not."""
    from .trajectory import RunConfig
    from .gradients import AdversaryParams

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
    allowed = set(run_keys) | set(SCENARIO_KEYS) | {"adversary_params"}
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
        for key, value in table.items():
            if key not in allowed:
                raise StressInputError(f"{_where(path, text, here, key)}: scenario {name!r}: unknown key {key!r}"
                                       f"{_suggest(key, allowed)}")
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
                checks += _load_checks(path, text, name, table, key, table[key], metrics)
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
        if not checks and not ev["require_events"] and not ev["forbid_events"]:
            raise StressInputError(f"{_where(path, text, here)}: scenario {name!r} has nothing to check: give a "
                                   "[budget] table (or floor, require_events, forbid_events)")
        # metrics a run of this config never records: a budget on them could never be judged
        never = set()
        if config.backend != "torch" or not config.shadow:
            never |= set(SHADOW_METRICS)
        if config.head != "pit":
            from .heads import PIT_ONLY
            never |= set(PIT_ONLY)
        for c in checks:
            if c.metric in never:
                raise StressInputError(f"{_where(path, text, here)}: scenario {name!r}: budget on {c.metric}, which "
                                       f"this run does not record (backend {config.backend}, shadow {config.shadow}, "
                                       f"head {config.head})")
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
        from .trajectory import recorded_steps

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
                            ev["forbid_events"], initial_state=initial_state))
    return out


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


# ---------------------------------------------------------------- judging a run

def growth_exponent(rows: list[dict], metric: str) -> float:
    """Least-squares slope of log(metric) against log(step) over the rows from step 1 with a positive,
    finite value; NaN with fewer than MIN_GROWTH_POINTS such rows."""
    pts = [(math.log(r["step"]), math.log(r[metric])) for r in rows
           if r["step"] >= 1 and math.isfinite(r[metric]) and r[metric] > 0]
    if len(pts) < MIN_GROWTH_POINTS:
        return float("nan")
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    if sxx == 0:
        return float("nan")
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / sxx


def judge(check: Check, rows: list[dict]) -> CheckResult:
    """One check against a run's metric rows. A NaN (a damaged state) breaks a ceiling."""
    if not rows:
        return CheckResult(check, float("nan"), None, False, "no recorded rows")
    m = check.metric
    if check.kind == "max":
        nan = [r for r in rows if math.isnan(r[m])]
        if nan:
            return CheckResult(check, float("nan"), nan[0]["step"], False,
                               f"{m} is NaN at step {nan[0]['step']} (a non-finite state)")
        worst = max(rows, key=lambda r: r[m])
        held = worst[m] <= check.limit
        msg = "" if held else f"{m} reached {worst[m]:.3e} at step {worst['step']}, over its budget {check.limit:.3g}"
        return CheckResult(check, worst[m], worst["step"], held, msg)
    if check.kind == "floor":
        last = rows[-1]
        held = last[m] >= check.limit  # NaN fails
        msg = "" if held else f"{m} ended at {last[m]:.3e} (step {last['step']}), below its floor {check.limit:.3g}"
        return CheckResult(check, last[m], last["step"], held, msg)
    p = growth_exponent(rows, m)
    if math.isnan(p):
        return CheckResult(check, p, None, False, f"{m}: inconclusive: fewer than {MIN_GROWTH_POINTS} positive, "
                           "finite recorded values from step 1, so its growth cannot be measured", inconclusive=True)
    held = p <= check.limit if check.kind == "growth" else p >= check.limit
    what = "ceiling" if check.kind == "growth" else "floor"
    msg = "" if held else f"{m} grows like step^{p:.2f}, against a growth exponent {what} of {check.limit:g}"
    return CheckResult(check, p, None, held, msg)


def cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # pragma: no cover - torch is a dependency
        return False


def run_scenario(scenario: Scenario, out: Path | str) -> ScenarioResult:
    """Run one scenario into `out` (replaced if it holds an earlier run) and judge it."""
    from .trajectory import RunBreakdown, read_events, read_metrics, run

    res = ScenarioResult(scenario, run_dir=str(out))
    if scenario.requires == "cuda" and not cuda_available():
        res.skipped = "needs CUDA"
        return res
    t0 = time.perf_counter()
    try:
        rows = run(scenario.config, out, progress=False, force=True)
    except RunBreakdown as exc:
        res.errors.append(f"run broke down: {exc}")
        rows = read_metrics(Path(out) / "metrics.csv")
    res.seconds = time.perf_counter() - t0
    events = read_events(Path(out) / "events.jsonl")
    res.checks = [judge(c, rows) for c in scenario.checks]
    names = {e.get("event") for e in events}
    for n in scenario.require_events:
        if n not in names:
            res.errors.append(f"no {n} event was recorded")
    for n in scenario.forbid_events:
        if n in names:
            first = next(e for e in events if e.get("event") == n)
            res.errors.append(f"{n} event recorded at step {first.get('step')}")
    return res


MAX_PLAIN_NAME = 100  # characters of a name kept in its directory name (a file system allows 255 bytes)


def _safe(name: str) -> str:
    """A file or directory name for `name`: the name itself when it is plain ([A-Za-z0-9_.-], not made of
    dots alone, short); otherwise its plain characters and 8 hex digits of its SHA-256, so that names
    that differ ('a b' and 'a_b'; 'qr-ü' and 'qr-é'; '..') never map to one directory, nor out of it."""
    plain = re.sub(r"[^A-Za-z0-9_.-]", "_", name)
    if plain.strip(".") == "":
        plain = plain.replace(".", "_")
    if plain == name and len(plain) <= MAX_PLAIN_NAME:
        return plain
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{plain[:MAX_PLAIN_NAME]}-{digest}"


def plot_name(run_dir: str | Path, metric: str) -> Path:
    """Where the plot of a broken budget goes: beside its run directory."""
    run_dir = Path(run_dir)
    return run_dir.parent / f"{run_dir.name}-{metric}.png"


def layout(scenarios: list[Scenario]) -> list[Path]:
    """Each scenario's run directory relative to --out (<file>/<name>), checked to be the only user of
    it and of its plots' paths; StressInputError naming both scenarios otherwise (a plain name can
    still equal another's hashed one, or another's plot: 'y-orthonormality.png')."""
    file_dirs: dict[str, str] = {}
    for s in scenarios:
        d = _safe(s.file_label)
        if file_dirs.setdefault(d, s.file_label) != s.file_label:
            raise StressInputError(f"scenario files {file_dirs[d]!r} and {s.file_label!r} would share the "
                                   f"directory {d}; rename one")
    owner: dict[Path, Scenario] = {}
    dirs = []
    for s in scenarios:
        run_dir = Path(_safe(s.file_label)) / _safe(s.name)
        dirs.append(run_dir)
        for path in [run_dir, *(plot_name(run_dir, m) for m in dict.fromkeys(c.metric for c in s.checks))]:
            other = owner.setdefault(path, s)
            if other is not s:
                raise StressInputError(f"scenarios {other.id!r} and {s.id!r} would both write {path} under "
                                       "--out; rename one")
    return dirs


def run_scenarios(scenarios: list[Scenario], out: Path | str, echo=None, threads: int = 1) -> list[ScenarioResult]:
    """Run each scenario into out/<file>/<name> (see `layout`), one after another; `echo(result)` after each.

    torch and numpy's BLAS are pinned to `threads` first: an unpinned BLAS on a loaded CI machine
    oversubscribes the cores and made small runs 30x slower here."""
    from .threads import pin_threads

    dirs = layout(scenarios)
    pin_threads(threads)
    results = []
    for s, run_dir in zip(scenarios, dirs):
        r = run_scenario(s, Path(out) / run_dir)
        results.append(r)
        if echo:
            echo(r)
    return results


# ---------------------------------------------------------------- output

def _fmt(v) -> str:
    return "-" if v is None else (f"{v:.3e}" if isinstance(v, float) and math.isfinite(v) else str(v))


def rows_of(results: list[ScenarioResult]) -> list[dict]:
    """One row per check (and per breakdown or event requirement), for the table and the JSON."""
    out = []
    for r in results:
        s = r.scenario
        if r.skipped:
            out.append(dict(scenario=s.id, file=s.file, metric="-", kind="-", worst=None, step=None, budget=None,
                            headroom="-", status="skipped", source=s.source, message=r.skipped))
            continue
        for c in r.checks:
            label = {"max": c.check.metric, "floor": f"{c.check.metric} (floor)",
                     "growth": f"{c.check.metric} growth", "growth_floor": f"{c.check.metric} growth (floor)"}
            out.append(dict(scenario=s.id, file=s.file, metric=label[c.check.kind], kind=c.check.kind,
                            worst=c.value, step=c.step, budget=c.check.limit, headroom=c.headroom,
                            status=c.status, source=s.source, message=c.message))
        for e in r.errors:
            out.append(dict(scenario=s.id, file=s.file, metric="events", kind="events", worst=None, step=None,
                            budget=None, headroom="-", status="BROKEN", source=s.source, message=e))
        for n in s.require_events + s.forbid_events:
            if not any(n in e for e in r.errors):
                out.append(dict(scenario=s.id, file=s.file, metric=f"event {n}", kind="events", worst=None,
                                step=None, budget=("required" if n in s.require_events else "forbidden"),
                                headroom="-", status="held", source=s.source, message=""))
    return out


def table(results: list[ScenarioResult]) -> str:
    head = ["scenario", "metric", "worst", "step", "budget", "headroom", "status", "source"]
    body = [[r["scenario"], r["metric"], _fmt(r["worst"]), _fmt(r["step"]),
             r["budget"] if isinstance(r["budget"], str) else _fmt(r["budget"]) if r["budget"] is None
             else f"{r['budget']:.3g}", r["headroom"], r["status"], r["source"]] for r in rows_of(results)]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
    lines = ["  ".join(str(x).ljust(w) for x, w in zip(line, widths)).rstrip() for line in [head, *body]]
    return "\n".join(lines)


_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _xml_text(text: str) -> str:
    """`text` with every character XML 1.0 cannot hold written as its Python escape (\\x01), so the file parses."""
    return _NOT_XML.sub(lambda m: ascii(m.group())[1:-1], text)


def junit_xml(results: list[ScenarioResult]) -> bytes:
    """JUnit XML: one testsuite per scenario file, one testcase per check (and per event requirement)."""
    root = ET.Element("testsuites", name="pitcheck stress")
    by_file: dict[str, list[ScenarioResult]] = {}
    for r in results:
        by_file.setdefault(r.scenario.file, []).append(r)
    total = {"tests": 0, "failures": 0, "skipped": 0}
    for file, rs in by_file.items():
        suite = ET.SubElement(root, "testsuite", name=_xml_text(rs[0].scenario.file_label), file=_xml_text(file))
        counts = {"tests": 0, "failures": 0, "skipped": 0}
        t = 0.0
        for r in rs:
            t += r.seconds
            cls = _xml_text(f"{r.scenario.file_label}.{r.scenario.name}")
            rows = [x for x in rows_of([r])]
            for x in rows:
                case = ET.SubElement(suite, "testcase", classname=cls, name=_xml_text(x["metric"]),
                                     time=f"{r.seconds / max(1, len(rows)):.3f}")
                counts["tests"] += 1
                if x["status"] == "skipped":
                    ET.SubElement(case, "skipped", message=_xml_text(x["message"]))
                    counts["skipped"] += 1
                elif x["status"] in ("BROKEN", "INCONCLUSIVE"):
                    f = ET.SubElement(case, "failure", message=_xml_text(x["message"]),
                                      type="BudgetBroken" if x["status"] == "BROKEN" else "Inconclusive")
                    f.text = _xml_text(f"{x['message']}\nbudget from: {x['source']}"
                                       + (f"\nwhy: {r.scenario.why}" if r.scenario.why else ""))
                    counts["failures"] += 1
        for k, v in counts.items():
            suite.set(k, str(v))
            total[k] += v
        suite.set("errors", "0")
        suite.set("time", f"{t:.3f}")
    for k, v in total.items():
        root.set(k, str(v))
    root.set("errors", "0")
    return ET.tostring(root, encoding="utf-8", xml_declaration=True)


def to_json(results: list[ScenarioResult]) -> dict:
    def clean(v):
        return None if isinstance(v, float) and not math.isfinite(v) else v

    return {"held": all(r.held for r in results),
            "scenarios": [{"scenario": r.scenario.name, "id": r.scenario.id, "file": r.scenario.file,
                           "source": r.scenario.source,
                           "why": r.scenario.why, "skipped": r.skipped or None, "seconds": round(r.seconds, 3),
                           "held": r.held if not r.skipped else None, "errors": r.errors,
                           "initial_state": r.scenario.initial_state,
                           "config": r.scenario.config.to_json(),
                           "checks": [{"metric": c.check.metric, "kind": c.check.kind, "limit": c.check.limit,
                                       "value": clean(c.value), "step": c.step, "held": c.held,
                                       "status": c.status, "message": c.message} for c in r.checks]}
                          for r in results]}


def plot_broken(result: ScenarioResult) -> list[Path]:
    """A PNG per broken metric: its trajectory against its budget, beside the run (<run dir>-<metric>.png)."""
    from .plotting import draw_metric as _draw, pyplot as _pyplot, save_figure as _save_figure
    from .trajectory import read_metrics

    broken = [c for c in result.checks if not c.held and c.check.kind in ("max", "floor", "growth", "growth_floor")]
    if not broken:
        return []
    try:
        rows = read_metrics(Path(result.run_dir) / "metrics.csv")
    except (OSError, PitcheckError):
        return []
    plt = _pyplot()
    paths = []
    for metric in dict.fromkeys(c.check.metric for c in broken):
        fig, ax = plt.subplots(figsize=(6, 4))
        _draw(ax, rows, metric, metric)
        for c in (c for c in broken if c.check.metric == metric):
            if c.check.kind in ("max", "floor"):
                ax.axhline(c.check.limit, color="red", ls="--", label=f"{c.check.kind} {c.check.limit:.3g}")
                continue
            # a line of the budget's slope through the first positive value from step 1
            first = next((r for r in rows if r["step"] >= 1 and r[metric] > 0), None)
            if first:
                steps = [r["step"] for r in rows if r["step"] >= 1]
                ax.loglog(steps, [first[metric] * (s / first["step"]) ** c.check.limit for s in steps], "m:",
                          label=f"growth {'ceiling' if c.check.kind == 'growth' else 'floor'} step^{c.check.limit:g}")
        ax.set_title(f"{result.scenario.name}: {metric} (BROKEN)", fontsize=9)
        ax.set_xlabel("step (0 drawn at 1)")
        ax.legend(fontsize=8)
        paths.append(_save_figure(plt, fig, plot_name(result.run_dir, metric)))
    return paths


# ---------------------------------------------------------------- command line

def add_stress_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("stress", help="run drift stress scenarios (TOML) and check their budgets",
                              description="Run scenario files and check their budgets: exit 0 when every budget "
                                          "holds, 1 when any is broken, 2 on bad input. With no file, runs "
                                          "pitcheck's own suite (stress/*.toml).")
    p.add_argument("files", nargs="*", metavar="FILE.toml", help="scenario files (default: pitcheck's suite)")
    p.add_argument("--junit", metavar="FILE.xml", help="write JUnit XML for CI")
    p.add_argument("--json", metavar="FILE", help="write the results as JSON")
    p.add_argument("--out", metavar="DIR", help="keep the run directories and the plots of broken budgets here "
                                                "(default: a temporary directory, removed)")
    p.add_argument("--only", metavar="NAME", action="append", default=[],
                   help="run only the scenarios of this name (repeatable)")
    p.add_argument("--list", action="store_true", help="list the scenarios and their budgets, run nothing")
    p.set_defaults(func=main_stress)
    return p


def _writable_file(path: str, flag: str) -> Path:
    try:
        path = check_out_file(path, flag)
    except PitcheckError as exc:
        raise StressInputError(str(exc)) from None
    if path.exists() and not os.access(path, os.W_OK):
        raise StressInputError(f"{flag} {path} is not writable")
    return path


def _inside(path: Path, folder: Path) -> bool:
    path, folder = path.resolve(), folder.resolve()
    return path == folder or folder in path.parents


def check_outputs(args, scenarios: list[Scenario]) -> tuple[Path | None, Path | None, Path | None]:
    """--junit, --json and --out checked before any scenario runs: each can be created, no two name one
    file, none is a scenario file given, and neither file lies where the runs go (OUT/<file>/...).
    The scenarios' run directories are checked to be distinct (`layout`) even without --out."""
    dirs = layout(scenarios)
    junit = _writable_file(args.junit, "--junit") if args.junit is not None else None
    jpath = _writable_file(args.json, "--json") if args.json is not None else None
    out = None
    if args.out is not None:
        try:
            out = check_out_path(args.out, "--out")
        except PitcheckError as exc:
            raise StressInputError(str(exc)) from None
    files = [("--junit", junit), ("--json", jpath)]
    given = [(f"scenario file {f}", Path(f)) for f in dict.fromkeys(s.file for s in scenarios)]
    try:
        check_distinct_outputs([*given, *files])
    except PitcheckError as exc:
        raise StressInputError(str(exc)) from None
    if out is not None:
        run_roots = {out / d.parts[0] for d in dirs}
        for what, path in files:
            if path is None:
                continue
            if _inside(out, path):
                raise StressInputError(f"{what} {path} is the --out directory {out} (or holds it); name a file")
            for root in run_roots:
                if _inside(path, root):
                    raise StressInputError(f"{what} {path} lies in {root}, where --out keeps the runs of "
                                           "scenario files; name a file outside it")
        for d in dirs:
            try:
                check_out_path(out / d, "--out")
            except PitcheckError as exc:
                raise StressInputError(str(exc)) from None
    return junit, jpath, out


def main_stress(args) -> int:
    def err(msg: str) -> int:
        print(f"pitcheck stress: error: {msg}", file=sys.stderr)
        return 2

    try:
        scenarios = load_scenarios(args.files)
        if args.only:
            # a bare name picks it in every file; a qualified one (ci::name) picks one scenario
            known = {s.name for s in scenarios} | {s.id for s in scenarios}
            unknown = [n for n in args.only if n not in known]
            if unknown:
                return err(f"--only {unknown[0]!r}: no such scenario{_suggest(unknown[0], known)}")
            scenarios = [s for s in scenarios if s.name in args.only or s.id in args.only]
        junit, jpath, _ = check_outputs(args, scenarios)
    except PitcheckError as exc:
        return err(str(exc))
    if args.list:
        for s in scenarios:
            checks = ", ".join(f"{c.metric} {'<=' if c.kind in ('max', 'growth') else '>='} {c.limit:g}"
                               + (" (exponent)" if c.kind.startswith("growth") else "") for c in s.checks)
            events = [f"event {n} required" for n in s.require_events] + [f"no {n}" for n in s.forbid_events]
            print(f"{s.id}  [{s.source}]  {', '.join(x for x in [checks, *events] if x)}"
                  + ("  (initial state only)" if s.initial_state else "")
                  + ("  (needs CUDA)" if s.requires == "cuda" else ""))
        return 0
    tmp = None
    out = Path(args.out) if args.out is not None else Path(tmp := tempfile.mkdtemp(prefix="pitcheck-stress-"))
    try:
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            return err(f"cannot create --out {out}: {exc.strerror or exc}")

        def echo(r: ScenarioResult) -> None:
            status = "skipped (" + r.skipped + ")" if r.skipped else ("held" if r.held else "BROKEN")
            if r.scenario.initial_state and not r.skipped:
                status += " (initial state only: no step run)"
            print(f"{r.scenario.id}: {status}  {r.seconds:.1f} s", file=sys.stderr, flush=True)

        try:
            results = run_scenarios(scenarios, out, echo=echo)
        except PitcheckError as exc:
            return err(str(exc))
        print(table(results))
        broken = [r for r in results if not r.skipped and not r.held]
        plots = []
        if args.out is not None:
            for r in broken:
                plots += plot_broken(r)
        for path, data in ((junit, lambda: junit_xml(results)),
                           (jpath, lambda: (json.dumps(to_json(results), indent=2) + "\n").encode())):
            if path is not None:
                try:
                    write_atomic(path, data())
                except PitcheckError as exc:  # write_atomic names the file and the cause
                    return err(str(exc))
        n_checks = sum(len(r.checks) for r in results)
        if broken:
            for r in broken:
                for c in r.checks:
                    if not c.held:
                        print(f"{c.status} {r.scenario.id}: {c.message} (budget from {r.scenario.source}"
                              + (f"; {r.scenario.why}" if r.scenario.why else "") + ")", file=sys.stderr)
                for e in r.errors:
                    print(f"BROKEN {r.scenario.id}: {e}", file=sys.stderr)
            for p in plots:
                print(f"plot: {p}", file=sys.stderr)
            unjudged = sum(1 for r in broken if any(c.inconclusive for c in r.checks))
            print(f"{len(broken)} of {len(results)} scenarios broke a budget"
                  + (f" or could not be judged ({unjudged} inconclusive)" if unjudged else ""), file=sys.stderr)
            return 1
        skipped = sum(1 for r in results if r.skipped)
        at_start = sum(1 for r in results if not r.skipped and r.scenario.initial_state)
        notes = [n for n, count in ((f"{skipped} skipped", skipped),
                                    (f"{at_start} judged at step 0 only (initial_state)", at_start)) if count]
        print(f"all {n_checks} budgets held in {len(results) - skipped} scenarios"
              + (f" ({'; '.join(notes)})" if notes else ""), file=sys.stderr)
        return 0
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="pitcheck")
    sub = parser.add_subparsers(dest="command", required=True)
    add_stress_parser(sub)
    args = parser.parse_args(["stress", *(sys.argv[1:] if argv is None else argv)])
    return main_stress(args)


if __name__ == "__main__":
    sys.exit(main())
