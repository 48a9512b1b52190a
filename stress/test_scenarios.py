"""pitcheck's own drift stress suite (stress/*.toml), run through the same code as `pitcheck stress`."""
import pytest

from pitcheck.verbs.stress import cuda_available, load_scenarios, run_scenario
from pitcheck.infra.threads import pin_threads

SCENARIOS = load_scenarios()


@pytest.fixture(scope="module", autouse=True)
def _pinned():
    pin_threads(1)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.id)
def test_scenario(scenario, tmp_path):
    if scenario.requires == "cuda" and not cuda_available():
        pytest.skip("needs CUDA")
    result = run_scenario(scenario, tmp_path / "run")
    broken = [c.message for c in result.checks if not c.held] + result.errors
    assert not broken, f"{scenario.id}: {'; '.join(broken)} (budget from {scenario.source}: {scenario.why})"


def test_suite_covers_every_retraction_policy_and_adversary():
    from pitcheck.model.gradients import GRADIENT_MODELS, parse_adversary
    from pitcheck.numerics.policy import POLICIES
    from pitcheck.model.retractions import RETRACTIONS

    configs = [s.config for s in SCENARIOS]
    assert set(RETRACTIONS) <= {c.retraction for c in configs if c.head == "pit" and c.steps > 0}
    assert set(POLICIES) <= {c.precision for c in configs}
    assert set(GRADIENT_MODELS) <= {n for c in configs for n in parse_adversary(c.adversary)}
    assert {"sgd", "momentum", "adam"} <= {c.optimizer for c in configs}
    assert {"pit", "tied", "untied"} <= {c.head for c in configs}


def test_every_suite_budget_says_where_it_comes_from():
    for s in SCENARIOS:
        assert s.source in ("theory", "measured") and s.why, s.id
