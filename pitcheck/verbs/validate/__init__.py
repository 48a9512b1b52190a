"""Validation of a third-party PIT implementation against the float64 reference.

target.py finds and builds the target; isolation.py runs it in a child process with a time limit
(lifeline.py ties that process to this one, worker.py is its main); probes.py (in that process) reads off
what it computes; checks.py judges it in float64, one function per named check, in the units of
dtypes.py (read off pitcheck.numerics.formats); registry.py holds one record per check (its probe, its judge,
sharded or not), registered by checks.py and shard_checks.py; result.py renders the verdicts;
pytest_plugin.py turns them into test items.
"""
import sys
import types

from .api import validate
from .checks import CHECKS, TAU, CheckResult
from .shard_checks import SHARDED_CHECKS  # noqa: F401 (its import registers the checks only a sharded target has)
from .result import ValidationResult

__all__ = ["validate", "CHECKS", "TAU", "CheckResult", "ValidationResult"]


class _CallableModule(types.ModuleType):
    """`pitcheck.verbs.validate` is this subpackage and, called, the function: pitcheck.validate(target, ...)."""

    def __call__(self, *args, **kwargs) -> ValidationResult:
        return validate(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
