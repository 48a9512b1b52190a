"""Stress scenarios of sharded runs (stress/sharded.toml): budgets on shard_distance_Z and replica_spread,
the metrics a sharded run's metrics.csv adds; a budget too tight for the bound breaks, one on a metric an
unsharded run never records is refused."""
from __future__ import annotations

from pathlib import Path

import pytest

from pitcheck.verbs import stress as scenarios
from pitcheck.cli import stress as stress_cli
from pitcheck.infra.rundir import read_metrics
from pitcheck.verbs.stress import Check, StressInputError, check_budget
from tests.helpers import stress_args

pytest.importorskip("torch.distributed")

SUITE = Path(__file__).resolve().parents[3] / "stress" / "sharded.toml"
SCENARIO = """
[scenario.{name}]
backend = "torch"
precision = "fp32"
retraction = "cholqr2"
steps = 8
vocab = 47
dim = 4
shards = {shards}
device = "cpu"
[scenario.{name}.{table}]
{metric} = {limit}
"""


def _file(tmp_path, **over):
    values = {**dict(name="s", shards=2, table="budget", metric="shard_distance_Z", limit="128"), **over}
    path = tmp_path / f"{values['name']}.toml"
    path.write_text(SCENARIO.format(**values))
    return path


def test_the_suite_budgets_the_bound_of_the_closing_note():
    loaded = {s.name: s for s in scenarios.load_file(SUITE)}
    for name in ("s2-fp32-cholqr2", "s2-fp32-qr-tsqr"):
        s = loaded[name]
        c = s.config
        assert c.shards == 2 and c.vocab % 2 == 1  # uneven slices
        bound = 4 * c.dim * c.steps  # 4 D k u at the last step, the ceiling on the worst value
        assert {(k.metric, k.kind, k.limit) for k in s.checks} == {("shard_distance_Z", "max", bound),
                                                                   ("replica_spread", "max", 0.0)}
    assert loaded["s2-fp32-cholqr2-bf16-allreduce"].config.allreduce_dtype == "bf16"


@pytest.fixture(scope="module")
def held_run(tmp_path_factory):
    s = next(s for s in scenarios.load_file(SUITE) if s.name == "s2-fp32-cholqr2")
    out = tmp_path_factory.mktemp("stress") / "run"
    return s, scenarios.run_scenario(s, out), read_metrics(out / "metrics.csv")


def test_the_sharded_scenario_holds_and_its_replicas_agree_exactly(held_run):
    s, result, rows = held_run
    assert result.held, [c.message for c in result.checks] + result.errors
    assert all(r["replica_spread"] == 0.0 for r in rows)
    assert 0 < max(r["shard_distance_Z"] for r in rows) <= 4 * s.config.dim * s.config.steps


def test_a_too_tight_budget_breaks_and_a_spread_replica_breaks_a_zero_ceiling(held_run):
    _, _, rows = held_run
    tight = check_budget(Check("shard_distance_Z", "max", 1e-3), rows)  # the sums' order always moves Z
    assert not tight.held and "shard_distance_Z reached" in tight.message
    drifted = [dict(r) for r in rows]
    drifted[-1]["replica_spread"] = 5e-324  # the smallest difference between replicas breaks a ceiling of 0
    assert not check_budget(Check("replica_spread", "max", 0.0), drifted).held
    assert check_budget(Check("replica_spread", "max", 0.0), rows).held


def test_a_too_tight_budget_fails_pitcheck_stress(tmp_path, capsys):
    f = _file(tmp_path, limit="0.001")
    assert stress_cli.main(stress_args([f])) == 1
    assert "shard_distance_Z" in capsys.readouterr().err


@pytest.mark.parametrize("over, message", [
    (dict(shards=1), "budget on shard_distance_Z, which this run does not record"),
    (dict(shards=1, metric="replica_spread", limit="0"), "budget on replica_spread, which this run does not record"),
    (dict(table="floor", limit="0"), "must be a positive finite number, got 0"),
    (dict(limit="-1"), "must be a positive finite number \\(or 0"),
    (dict(metric="shard_distance_Q"), "unknown metric 'shard_distance_Q'"),
])
def test_bad_shard_budgets_are_refused_with_file_and_line(tmp_path, over, message):
    with pytest.raises(StressInputError, match=message) as err:
        scenarios.load_file(_file(tmp_path, **over))
    assert "\n" not in str(err.value) and str(tmp_path) in str(err.value)


def test_a_zero_ceiling_loads(tmp_path):
    [s] = scenarios.load_file(_file(tmp_path, metric="replica_spread", limit="0"))
    assert s.checks == [Check("replica_spread", "max", 0.0)]
