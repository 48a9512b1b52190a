"""The test tiers, for tests/ and stress/ alike."""
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


def pytest_configure(config):
    config.addinivalue_line("markers", "e2e: the end-to-end tier (conftest.py E2E_MODULES); -m 'not e2e' is the "
                                       "fast tier")


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
