"""A run whose arithmetic overflows: numpy's warnings inside a step are not printed (the step's event records
the overflow), and a run that skipped most of its steps on non-finite values says so and exits as a breakdown
does, not 0 with numbers that are mostly its start's."""
import subprocess
import sys
import warnings

from pitcheck.trajectory import RunConfig, run, skipped_steps
from pitcheck.trajectory.loop import mostly_skipped

# Adam's second moment overflows (g * g) within a few steps, and the gradients at the state after are infinite
OVERFLOWING = ["--adversary", "sparse_input", "--optimizer", "adam", "--lr", "100", "--vocab", "64", "--dim", "8",
               "--steps", "50", "--no-progress"]


def test_a_run_that_skipped_most_of_its_steps_exits_as_a_breakdown_without_raw_warnings(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "pitcheck.cli", "run", *OVERFLOWING, "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "RuntimeWarning" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    err = proc.stderr.strip()
    assert err.startswith("pitcheck: breakdown: ") and "\n" not in err, err
    skipped = sum(skipped_steps(out).values())
    assert skipped > 25 and f"{skipped} of 50 steps were skipped on non-finite values" in err, err
    assert f"{skipped} of 50 steps skipped, most of the run" in proc.stdout, proc.stdout


def test_the_engine_step_warns_nothing_where_its_events_record_the_overflow(tmp_path):
    cfg = RunConfig(adversary="sparse_input", optimizer="adam", lr=100.0, vocab=64, dim=8, steps=50)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run(cfg, tmp_path / "run", progress=False)
    assert not [w for w in caught if issubclass(w.category, RuntimeWarning)], [str(w.message) for w in caught]
    assert sum(skipped_steps(tmp_path / "run").values()) > 25


def test_mostly_skipped_counts_non_finite_skips_only_and_needs_more_than_half():
    assert mostly_skipped({"nonfinite_state": 5}, 10) is None
    assert "6 of 10 steps" in mostly_skipped({"nonfinite_state": 4, "gradient_overflow": 2}, 10)
    assert mostly_skipped({"retraction_failed": 9}, 10) is None  # another failure than a non-finite value
    assert mostly_skipped({}, 0) is None


def test_a_stress_scenario_whose_run_skipped_most_steps_is_broken_not_held(tmp_path):
    # the budgets would hold on numbers that are mostly the start's: the scenario is broken, saying why
    from pitcheck.verbs.stress import load_scenarios
    from pitcheck.verbs.stress.runner import run_scenario

    path = tmp_path / "s.toml"
    path.write_text('[scenario.overflow]\nadversary = "sparse_input"\noptimizer = "adam"\nlr = 100.0\n'
                    'vocab = 64\ndim = 8\nsteps = 50\n[scenario.overflow.budget]\northonormality_ratio = 1e30\n')
    (scenario,) = load_scenarios([path])
    result = run_scenario(scenario, tmp_path / "run")
    assert all(c.held for c in result.checks)  # the budget alone holds
    assert result.broken and any("the run is no trajectory" in e and "skipped on non-finite values" in e
                                 for e in result.errors), result.errors
