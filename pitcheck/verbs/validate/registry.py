"""One record per validate check: the probe that reads the target off (in the target's process, or on every
rank of a sharded target), the judge that gives its verdict (in pitcheck's own process), and whether only a
sharded target has it.

checks.py registers the checks every target has, shard_checks.py the two only a sharded target has;
importing pitcheck.verbs.validate (which any of its modules does first) imports both, so the registry is
complete wherever a check is looked up.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ...infra.errors import PitcheckError


@dataclass(frozen=True)
class Check:
    """A named check: `probe(harness, **arguments) -> Probe` in the target's process (for a sharded target,
    on every rank), `judge(probe, context) -> CheckResult` in pitcheck's; `sharded`: only a sharded target
    has it (its probe needs the ranks)."""
    name: str
    probe: Callable
    judge: Callable
    sharded: bool = False


# name -> record, in registration order (the order the checks run and are listed in)
CHECK_RECORDS: dict[str, Check] = {}


def register(*checks: Check) -> None:
    for check in checks:
        if check.name in CHECK_RECORDS:
            raise PitcheckError(f"check {check.name!r} is registered twice")
        CHECK_RECORDS[check.name] = check
