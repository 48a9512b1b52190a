"""Validation of a third-party PIT implementation against the float64 reference.

target.py finds and builds the target; isolation.py runs it in a child process with a time limit;
probes.py (in that process) reads off what it computes; checks.py judges it in float64, one function
per named check; result.py renders the verdicts; pytest_plugin.py turns them into test items.
"""
from .api import validate
from .checks import CHECKS, TAU, CheckResult
from .result import ValidationResult

__all__ = ["validate", "CHECKS", "TAU", "CheckResult", "ValidationResult"]
