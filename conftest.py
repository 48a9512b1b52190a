"""The test tiers, for tests/ and stress/ alike, and how pytest-xdist's workers share the machine."""
import fcntl
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent

# The end-to-end tier (`-m e2e`): modules that start processes (the validator's workers, gloo ranks, the CLI),
# kill and resume runs, load the real model or run the stress suite. The rest is the fast tier
# (`-m "not e2e"`), run first; a module is named here by its path from the repository root, not marked in
# itself, so the tiers are read in one place.
E2E_MODULES = {
    "tests/test_examples.py",
    "tests/hostile/test_kills.py",
    "tests/infra/test_executors.py", "tests/infra/test_threads_policy.py",
    "tests/model/sharded/test_sharded.py", "tests/model/sharded/test_nn_sharded.py",
    "tests/scripts/test_gpu_scripts.py", "tests/scripts/test_mutation_subset.py",
    "tests/scripts/test_validate_cuda_zoo.py",
    "tests/sources/test_lm.py", "tests/sources/test_smollm2.py",
    "tests/trajectory/test_shadow_device.py", "tests/trajectory/test_sharded_run.py",
    "tests/verbs/stress/test_stress_sharded.py", "tests/verbs/stress/test_stress_target.py",
    "tests/verbs/validate/test_validate.py", "tests/verbs/validate/test_validate_cuda_context.py",
    "tests/verbs/validate/test_validate_isolation.py", "tests/verbs/validate/test_validate_sharded.py",
    "stress/test_scenarios.py",
}
_E2E_FILES = {ROOT / m for m in E2E_MODULES}

# Under pytest-xdist (`-n N`), tests that hold a process to a wall-clock limit of a few seconds, or that
# occupy both cores themselves under a time budget, run alone: while one runs, no other worker runs a test
# (it waits for the running ones to end, and the others wait for it), so that it sees the machine a serial
# run gives it. Node ids or their prefixes (a module: all its tests).
EXCLUSIVE = (
    "tests/scripts/test_mutation_subset.py::test_a_fixed_sample_of_mutants_is_killed",  # --jobs 2, a 60 s budget
    "tests/scripts/test_validate_cuda_zoo.py::test_validate_zoo_runs_targets_at_once_on_a_device",  # 2 jobs, 8 s each
    "tests/verbs/validate/test_validate_cuda_context.py::test_a_hang_names_how_long_its_phases_took",  # 8 s limit
    "tests/verbs/validate/test_validate_cuda_context.py::test_a_fresh_worker_shares_the_time_limit",  # 20 s + 5 s
)


def pytest_configure(config):
    config.addinivalue_line("markers", "e2e: the end-to-end tier (conftest.py E2E_MODULES); -m 'not e2e' is the "
                                       "fast tier")
    config.addinivalue_line("markers", "xdist_group(name): tests that pytest-xdist's --dist loadgroup keeps on one "
                                       "worker")


def _shared_fixture_scope(item):
    """Where the first module-, package- or session-scoped fixture of this project that the item uses is
    defined (its module or conftest directory), or None. Under `-n N --dist loadgroup` the items of one such
    scope go to one worker, so that the fixture is computed once, as in a serial run, not once per worker."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    for name in info.names_closure:
        defs = info.name2fixturedefs.get(name)
        if defs and defs[-1].scope in ("module", "package", "session") and defs[-1].baseid:
            return defs[-1].baseid
    return None


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    e2e = {}  # module file -> in the end-to-end tier
    for item in items:
        module = getattr(item, "module", None)
        if module is None or not getattr(module, "__file__", None):
            continue
        if module.__file__ not in e2e:
            e2e[module.__file__] = Path(module.__file__).resolve() in _E2E_FILES
        if e2e[module.__file__]:
            item.add_marker(pytest.mark.e2e)
        shared = _shared_fixture_scope(item)
        if shared is not None and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(shared))


class _Turnstile:
    """A readers-writer lock across the xdist workers of one run (flock on two files in the run's shared
    basetemp): every test holds `main` shared, an EXCLUSIVE one holds it alone. `gate` is taken briefly
    before `main`, and held by an exclusive test while it waits, so that the other workers' next tests
    queue behind it instead of starving it."""

    def __init__(self, folder: Path):
        self.gate = open(folder / "xdist-gate.lock", "a")
        self.main = open(folder / "xdist-main.lock", "a")

    def acquire(self, alone: bool) -> None:
        fcntl.flock(self.gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(self.main, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            fcntl.flock(self.gate, fcntl.LOCK_UN)

    def release(self) -> None:
        fcntl.flock(self.main, fcntl.LOCK_UN)


_turnstile = None


def _worker_turnstile(config):
    """This worker's turnstile; None outside xdist (a serial run needs none)."""
    global _turnstile
    if not hasattr(config, "workerinput"):
        return None
    if _turnstile is None:
        _turnstile = _Turnstile(config._tmp_path_factory.getbasetemp().parent)  # popen-gwN's parent: the run's
    return _turnstile


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Setup, call and teardown of each test under the turnstile (module fixtures included)."""
    turnstile = _worker_turnstile(item.config)
    if turnstile is None:
        yield
        return
    turnstile.acquire(alone=item.nodeid.startswith(EXCLUSIVE))
    try:
        yield
    finally:
        turnstile.release()
