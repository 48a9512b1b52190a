"""Running scenarios: one run directory each, OUT/<file>/<name>, judged as it ends.

The names are made plain for the file system ([A-Za-z0-9_.-]) with a hash of the original appended
whenever that changed them, so no two scenarios share a directory, and every output is checked before
any scenario runs.
"""
from __future__ import annotations

import hashlib
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from ...infra.errors import PitcheckError
from ...infra.rundir import (check_distinct_outputs, check_out_file, check_out_path, check_outputs_spare_inputs,
                             read_events, read_metrics)
from ...infra.threads import thread_policy
from ...trajectory import RunBreakdown, run
from ...trajectory.loop import mostly_skipped, skipped_steps
from .budgets import BudgetResult, check_budget
from ..validate.target import target_source
from .scenarios import Scenario, StressInputError
from .target import run_target


@dataclass
class ScenarioResult:
    """A scenario's run judged: each check, and the breakdowns and event requirements broken."""
    scenario: Scenario
    checks: list[BudgetResult] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # breakdowns and event requirements
    skipped: str = ""
    seconds: float = 0.0
    run_dir: str = ""
    fatal: str = ""  # why a target could not be imported, built or run (exit status 2)

    @property
    def held(self) -> bool:
        return not self.fatal and not self.errors and all(c.held for c in self.checks)

    @property
    def broken(self) -> bool:
        """Run and not held (a skipped scenario is neither held nor broken)."""
        return not self.skipped and not self.held


def cuda_available() -> bool:
    try:
        import torch  # deferred: a list or a dry check of scenarios needs no torch

        return bool(torch.cuda.is_available())
    except Exception:  # pragma: no cover - torch is a dependency
        return False


def run_target_scenario(res: ScenarioResult, out: Path | str, threads: int | None = None) -> ScenarioResult:
    """A scenario on the user's module (target.py): stepped in its own process, its maps' metrics judged.
    A target that cannot be imported, built or run leaves `fatal` set and its budgets unjudged."""
    t0 = time.perf_counter()
    rows, res.errors, res.fatal = run_target(res.scenario, out, threads)
    res.seconds = time.perf_counter() - t0
    if not res.fatal:
        res.checks = [check_budget(c, rows) for c in res.scenario.checks]
    return res


def run_scenario(scenario: Scenario, out: Path | str, threads: int | None = None) -> ScenarioResult:
    """Run one scenario into `out` (replaced if it holds an earlier run) and judge it."""
    res = ScenarioResult(scenario, run_dir=str(out))
    if scenario.requires == "cuda" and not cuda_available():
        res.skipped = "needs CUDA"
        return res
    if scenario.target:
        return run_target_scenario(res, out, threads)
    t0 = time.perf_counter()
    try:
        rows = run(scenario.config, out, progress=False, force=True)
    except RunBreakdown as exc:
        res.errors.append(f"run broke down: {exc}")
        rows = read_metrics(Path(out) / "metrics.csv")
    res.seconds = time.perf_counter() - t0
    if rows:
        # budgets read off a run that never applied most of its steps would hold on its start's numbers
        why = mostly_skipped(skipped_steps(out), rows[-1]["step"])
        if why:
            res.errors.append(f"the run is no trajectory: {why}")
    events = read_events(Path(out) / "events.jsonl")
    res.checks = [check_budget(c, rows) for c in scenario.checks]
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


def run_scenarios(scenarios: list[Scenario], out: Path | str, echo=None, threads: int | None = None) -> list[ScenarioResult]:
    """Run each scenario into out/<file>/<name> (see `layout`), one after another; `echo(result)` after each.

    torch and numpy's BLAS compute with `threads` (None: the thread policy's count, pitcheck.infra.threads): an
    unpinned BLAS on a loaded CI machine oversubscribes the cores and made small runs 30x slower here."""
    dirs = layout(scenarios)
    results = []
    with thread_policy(threads):
        for s, run_dir in zip(scenarios, dirs):
            r = run_scenario(s, Path(out) / run_dir, threads)
            results.append(r)
            if echo:
                echo(r)
    return results


def _writable_file(path: Path | str, option: str) -> Path:
    try:
        path = check_out_file(path, option)
    except PitcheckError as exc:
        raise StressInputError(str(exc)) from None
    if path.exists() and not os.access(path, os.W_OK):
        raise StressInputError(f"{option} {path} is not writable")
    return path


def _inside(path: Path, folder: Path) -> bool:
    path, folder = path.resolve(), folder.resolve()
    return path == folder or folder in path.parents


def check_outputs(scenarios: list[Scenario], junit: Path | str | None = None, json: Path | str | None = None,
                  out: Path | str | None = None) -> tuple[Path | None, Path | None, Path | None]:
    """The JUnit and JSON files and the run directory (--junit, --json, --out) checked before any scenario
    runs: each can be created, no two name one file, none is a scenario file given, and neither file lies
    where the runs go (OUT/<file>/...). The scenarios' run directories are checked to be distinct
    (`layout`) even without `out`. Returns the three as paths (None where not given)."""
    dirs = layout(scenarios)
    junit = _writable_file(junit, "--junit") if junit is not None else None
    json = _writable_file(json, "--json") if json is not None else None
    if out is not None:
        try:
            out = check_out_path(out, "--out")
        except PitcheckError as exc:
            raise StressInputError(str(exc)) from None
    files = [("--junit", junit), ("--json", json)]
    given = [("the scenario file", Path(f)) for f in dict.fromkeys(s.file for s in scenarios)]
    targets = [(f"the target source of scenario {s.name!r}", target_source(s.target))
               for s in scenarios if s.target]
    try:
        check_distinct_outputs(files)
        check_outputs_spare_inputs(files, [*given, *targets])
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
    return junit, json, out
