"""`pitcheck stress`: run scenario files and check their budgets.

Exit status 0 when every budget holds, 1 when any is broken (or a run breaks down, or a growth cannot
be judged), 2 when a scenario's target (the user's module) cannot be imported, built or run, and on bad input (a malformed file, an unknown key, a budget on an unknown metric, an output
that cannot be written), the file and the key or line named in a one-line error before any run starts.
"""
from __future__ import annotations

import argparse
import sys

from ..infra.errors import PitcheckError
from .common import check_writable

NEEDS_TORCH = True


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("stress", help="run drift stress scenarios (TOML) and check their budgets",
                       description="Run scenario files and check their budgets: exit 0 when every budget "
                                   "holds, 1 when any is broken, 2 on bad input or a target (target = "
                                   "\"module:factory\" in a scenario: your own PIT module) that cannot be "
                                   "imported, built or run. With no file, runs pitcheck's own suite "
                                   "(stress/*.toml).")
    p.add_argument("files", nargs="*", metavar="FILE.toml", help="scenario files (default: pitcheck's suite)")
    p.add_argument("--junit", metavar="FILE.xml", help="write JUnit XML for CI")
    p.add_argument("--json", metavar="FILE", help="write the results as JSON")
    p.add_argument("--out", metavar="DIR", help="keep the run directories and the plots of broken budgets here "
                                                "(default: a temporary directory, removed)")
    p.add_argument("--only", metavar="NAME", action="append", default=[],
                   help="run only the scenarios of this name (repeatable)")
    p.add_argument("--list", action="store_true", help="list the scenarios and their budgets, run nothing")
    return p


def _error(message: str) -> int:
    print(f"pitcheck stress: error: {message}", file=sys.stderr)
    return 2


def _echo(r) -> None:
    status = ("skipped (" + r.skipped + ")" if r.skipped else "ERROR (the target could not be run)" if r.fatal
              else "held" if r.held else "BROKEN")
    if r.scenario.initial_state and not r.skipped:
        status += " (initial state only: no step run)"
    print(f"{r.scenario.id}: {status}  {r.seconds:.1f} s", file=sys.stderr, flush=True)


def _list(args) -> int:
    from ..verbs import stress as sc

    scenarios = sc.select_scenarios(sc.load_scenarios(args.files), args.only)
    sc.check_outputs(scenarios, junit=args.junit, json=args.json, out=args.out)
    for s in scenarios:
        print(sc.describe(s))
    return 0


def _report_broken(outcome) -> None:
    for r in outcome.fatal:
        print(f"ERROR {r.scenario.id}: {r.fatal}", file=sys.stderr)
    for r in outcome.broken:
        for c in r.checks:
            if not c.held:
                print(f"{c.status} {r.scenario.id}: {c.message} (budget from {c.check.origin or r.scenario.source}"
                      + (f"; {r.scenario.why}" if r.scenario.why else "") + ")", file=sys.stderr)
        for e in r.errors:
            print(f"BROKEN {r.scenario.id}: {e}", file=sys.stderr)
    for p in outcome.plots:
        print(f"plot: {p}", file=sys.stderr)
    unjudged = sum(1 for r in outcome.broken if any(c.inconclusive for c in r.checks))
    if outcome.fatal:
        print(f"{len(outcome.fatal)} of {len(outcome.results)} scenarios could not run their target", file=sys.stderr)
    print(f"{len(outcome.broken) - len(outcome.fatal)} of {len(outcome.results)} scenarios broke a budget"
          + (f" or could not be judged ({unjudged} inconclusive)" if unjudged else ""), file=sys.stderr)


def _report_held(outcome) -> None:
    results = outcome.results
    n_checks = sum(len(r.checks) for r in results)
    skipped = sum(1 for r in results if r.skipped)
    at_start = sum(1 for r in results if not r.skipped and r.scenario.initial_state)
    notes = [n for n, count in ((f"{skipped} skipped", skipped),
                                (f"{at_start} judged at step 0 only (initial_state)", at_start)) if count]
    print(f"all {n_checks} budgets held in {len(results) - skipped} scenarios"
          + (f" ({'; '.join(notes)})" if notes else ""), file=sys.stderr)


def main(args) -> int:
    # deferred: the dispatcher imports torch (holding Ctrl-C) before main runs, not when parsers are built
    from ..verbs import stress as sc

    try:
        if args.list:
            return _list(args)
        check_writable(files=[("--junit", args.junit), ("--json", args.json)], dirs=[("--out", args.out)])
        outcome = sc.stress(args.files, only=args.only, out=args.out, junit=args.junit, json=args.json,
                            echo=_echo)
    except sc.OutputWriteError as exc:
        print(sc.table(exc.results))  # the runs were judged: show them before the error
        return _error(str(exc))
    except PitcheckError as exc:
        return _error(str(exc))
    print(sc.table(outcome.results))
    if not outcome.held:
        _report_broken(outcome)
        return outcome.exit_status
    _report_held(outcome)
    return 0

