"""scripts/studies/frontier_landing.py measures what it says: landing's distance after each update against
tau^2 / (2 lambda eta), with the registry left as it was; a map that does not pull back fails the bound."""
import importlib.util
from pathlib import Path

import numpy as np
import pytest

from pitcheck.model import retractions as R
from pitcheck.trajectory.config import RunConfig

pytest.importorskip("torch")
_spec = importlib.util.spec_from_file_location(
    "frontier_landing", Path(__file__).parents[2] / "scripts" / "studies" / "frontier_landing.py")
frontier_landing = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(frontier_landing)

MU = R.LANDING_ATTRACTION * R.LANDING_STEP


def _config():
    return RunConfig(backend="torch", precision="fp32", retraction="landing", steps=40, vocab=64, dim=4, seed=0,
                     shadow=False)


def test_landing_run_stays_below_its_bound_and_the_registry_is_restored():
    xi2, dist = frontier_landing.measure(_config())
    assert len(xi2) == len(dist) == 39 and np.all(xi2 > 0)
    assert np.all(dist <= frontier_landing.bound_so_far(xi2, MU)), dist / frontier_landing.bound_so_far(xi2, MU)
    assert dist.min() > 0  # never on the manifold
    assert R.RETRACTIONS["landing"] is R.retract_landing


def test_a_map_without_the_pull_back_exceeds_the_bound(monkeypatch):
    # the plain step Z + xi registered as landing: the distance accumulates xi^T xi (about k tau^2)
    monkeypatch.setitem(R.RETRACTIONS, "landing", R.retract_none)
    xi2, dist = frontier_landing.measure(_config())
    assert dist.max() > 5 * frontier_landing.bound_so_far(xi2, MU)[-1]


def test_bound_so_far_is_the_running_maximum_over_two_mu():
    np.testing.assert_array_equal(frontier_landing.bound_so_far(np.array([1.0, 3.0, 2.0, 4.0]), 0.5),
                                  [1.0, 3.0, 3.0, 4.0])
    np.testing.assert_array_equal(frontier_landing.bound_so_far(np.array([2.0, 1.0]), 0.25), [4.0, 4.0])
