"""The test tiers, for tests/ and stress/ alike."""
import pytest

# The end-to-end tier (`-m e2e`): modules that start processes (the validator's workers, gloo ranks, the CLI),
# kill and resume runs, load the real model or run the stress suite. The rest is the fast tier
# (`-m "not e2e"`), run first; a module is named here, not marked in itself, so the tiers are read in one place.
E2E_MODULES = {
    "test_validate", "test_validate_sharded", "test_validate_cuda_context", "test_validate_isolation",
    "test_validate_cuda_zoo", "test_smollm2", "test_kills", "test_mutation_subset", "test_executors",
    "test_sharded", "test_sharded_run", "test_nn_sharded", "test_stress_sharded", "test_threads_policy",
    "test_shadow_device", "test_lm", "test_gpu_scripts", "test_scenarios", "test_examples", "test_stress_target",
}


def pytest_configure(config):
    config.addinivalue_line("markers", "e2e: the end-to-end tier (conftest.py E2E_MODULES); -m 'not e2e' is the "
                                       "fast tier")


def pytest_collection_modifyitems(config, items):
    for item in items:
        module = getattr(item, "module", None)
        if module is not None and module.__name__.rsplit(".", 1)[-1] in E2E_MODULES:
            item.add_marker(pytest.mark.e2e)
