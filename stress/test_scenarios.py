import pytest

from pitcheck.trajectory import read_events, run
from stress.scenarios import SCENARIOS


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_scenario(scenario, tmp_path):
    rows = run(scenario.config, tmp_path)
    failures = scenario.check(rows, read_events(tmp_path / "events.jsonl"))
    assert not failures, f"{scenario.name}: {'; '.join(failures)} ({scenario.why})"


def test_checks_fail_on_the_opposite_run(tmp_path):
    # each kind of check must be able to fail: feed the flat check a growing run and vice versa
    by_name = {s.name: s for s in SCENARIOS}
    grows, flat = by_name["fp32-cayley-accumulates"], by_name["fp32-qr-flat"]
    rising = [{"step": s, "orthonormality": v, "orthonormality_ratio": 1.0} for s, v in ((1, 1e-7), (2, 1e-5))]
    level = [{"step": s, "orthonormality": v, "orthonormality_ratio": 1.0} for s, v in ((1, 1e-7), (2, 1.1e-7))]
    off_the_scale = [{**r, "orthonormality_ratio": 100.0} for r in level]
    assert flat.check(rising, []) and not flat.check(level, []) and flat.check(off_the_scale, [])
    assert grows.check(level, []) and not grows.check(rising, [])
    assert by_name["bf16-conditioning-attack-unresolved"].check(level, [])
    assert by_name["fp64-none-drifts"].check([{"orthonormality": 1e-15}], [])
    still = [{"step": s, "shadow_Z": 1e-7} for s in (1, 1000)]
    assert by_name["fp32-qr-wanders-from-fp64"].check(still, [])
    assert by_name["bf16-storage-floor"].check([{"orthonormality": 1e-7}], [])
