"""Drift stress tests for CI: scenario files (TOML), budgets on a run's metrics, a table, JSON and JUnit XML.

`stress` is the entry point (the `pitcheck stress` verb). The parts: scenarios (the files, their
refusals and the scenarios' names), budgets (judging a check against a run's rows), runner (one run
directory per scenario, outputs checked before any run) and report (table, JSON, JUnit, plots).
"""
from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ...infra.errors import PitcheckError
from ...infra.rundir import write_atomic
from ...trajectory.config import check_argument
from .budgets import BudgetResult, check_budget, growth_exponent
from .report import describe, json_bytes, junit_bytes, plot_broken, rows_of, table, to_json
from .runner import ScenarioResult, check_outputs, cuda_available, layout, run_scenario, run_scenarios
from .scenarios import (Check, Scenario, StressInputError, load_file, load_scenarios, select_scenarios,
                        suite_files)

__all__ = ["BudgetResult", "Check", "OutputWriteError", "Scenario", "ScenarioResult", "StressInputError",
           "StressResult", "check_budget", "check_outputs", "cuda_available", "describe", "growth_exponent",
           "json_bytes", "junit_bytes", "layout", "load_file", "load_scenarios", "plot_broken", "rows_of",
           "run_scenario", "run_scenarios", "select_scenarios", "stress", "suite_files", "table", "to_json"]


@dataclass
class StressResult:
    """What one `stress` call found: each scenario's result, and the plots drawn of broken budgets."""
    results: list[ScenarioResult]
    plots: list[Path] = field(default_factory=list)

    @property
    def broken(self) -> list[ScenarioResult]:
        return [r for r in self.results if r.broken]

    @property
    def held(self) -> bool:
        """Every scenario run held every budget (skipped ones aside)."""
        return not self.broken

    @property
    def fatal(self) -> list[ScenarioResult]:
        """The scenarios whose target could not be imported, built or run."""
        return [r for r in self.results if r.fatal]

    @property
    def exit_status(self) -> int:
        """As validate's: 0 every budget held, 1 some broken (or not judged), 2 a target could not be run."""
        return 2 if self.fatal else 1 if self.broken else 0


class OutputWriteError(PitcheckError):
    """The scenarios ran, but a plot, the JUnit or the JSON file could not be written; `results` holds
    what was found."""

    def __init__(self, message: str, results: list[ScenarioResult]):
        super().__init__(message)
        self.results = results


def stress_arguments(files, only, out, junit, json, threads) -> tuple[list, list]:
    """stress()'s arguments of their types: a single path (str or Path) is one file, a single str one --only
    name (either would be iterated letter by letter); a PitcheckError naming the argument otherwise."""
    path = (str, os.PathLike)
    files = [files] if isinstance(files, path) else files
    check_argument("stress: files", files, (list, tuple, type(None)), "a path or a list of paths")
    for f in files or ():
        check_argument("stress: each of files", f, path, "a path (str or pathlib.Path)")
    only = [only] if isinstance(only, str) else only
    check_argument("stress: only", only, (list, tuple, set, frozenset), "a scenario name or a list of them")
    for n in only:
        check_argument("stress: each of only", n, (str,), "a scenario name (str)")
    for name, value in (("out", out), ("junit", junit), ("json", json)):
        check_argument(f"stress: {name}", value, (*path, type(None)), "a path (str or pathlib.Path) or None")
    check_argument("stress: threads", threads, (int, type(None)), "an int >= 1 or None")
    return files, list(only)


def stress(files: list[Path | str] | Path | str | None = None, *, only=(), out: Path | str | None = None,
           junit: Path | str | None = None, json: Path | str | None = None, echo=None,
           threads: int | None = None) -> StressResult:
    """Run scenario files (pitcheck's own suite, stress/*.toml, when `files` is empty; one path is one file)
    and judge them.

    only: names of the scenarios to run (bare, or FILE::NAME); all when empty.
    out: the directory that keeps the run directories (out/<file>/<name>) and a PNG of each broken
        budget beside its run; without it the runs go to a temporary directory, removed after.
    junit, json: files to write the results to (JUnit XML for CI, and JSON).
    echo: called with each ScenarioResult as its scenario ends (progress).
    threads: torch and BLAS threads the runs compute with (None: the thread policy's, pitcheck.infra.threads).

    Every input and output is checked before any scenario runs: StressInputError (a PitcheckError)
    names the file and the key or line at fault. A broken budget is a result, not an error: see
    StressResult.held. OutputWriteError when an output cannot be written after the runs.
    """
    files, only = stress_arguments(files, only, out, junit, json, threads)
    scenarios = select_scenarios(load_scenarios(files), only)
    junit, json, _ = check_outputs(scenarios, junit=junit, json=json, out=out)
    root = Path(out) if out is not None else Path(tempfile.mkdtemp(prefix="pitcheck-stress-"))
    try:
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StressInputError(f"cannot create --out {root}: {exc.strerror or exc}") from None
        results = run_scenarios(scenarios, root, echo=echo, threads=threads)
        try:
            # plots only where they are kept
            plots = [p for r in results if r.broken for p in plot_broken(r)] if out is not None else []
            for path, data in ((junit, junit_bytes), (json, json_bytes)):
                if path is not None:
                    write_atomic(path, data(results))
        except PitcheckError as exc:  # write_atomic names the file and the cause
            raise OutputWriteError(str(exc), results) from None
        return StressResult(results, plots)
    finally:
        if out is None:
            shutil.rmtree(root, ignore_errors=True)
