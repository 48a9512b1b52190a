"""Temporary: stress/test_scenarios.py imports pin_threads from here. pitcheck.bench became
pitcheck.benchmark (the public API exports a function named bench); delete this file once that test
imports `from pitcheck.threads import pin_threads`."""
from .threads import pin_threads  # noqa: F401
