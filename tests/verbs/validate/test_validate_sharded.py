"""`pitcheck validate --world-size N`: the reference vocabulary-parallel module passes on 2 and 4 gloo ranks,
each sharding bug of tests/sharded_zoo fails with the check its docstring names, a rank that raises, hangs or
dies is named within the time limit with every rank gone, and bad input is one line.

Sizes are tiny (V = 67: an uneven last slice; D = 8) so that the file stays within CI's budget on 2 cores."""
import os
import subprocess
import sys
import time

import pytest

from pitcheck.cli import main
from pitcheck.infra.errors import PitcheckError
from pitcheck.verbs.validate import validate

pytest.importorskip("torch.distributed")

TINY = dict(vocab=67, dim=8, steps=5, timeout=120)
REFERENCE = "pitcheck.nn_sharded:make_sharded"


def test_the_reference_passes_every_check_on_two_ranks():
    result = validate(REFERENCE, world_size=2, **TINY)
    assert not result.fatal, result.fatal
    names = [c.name for c in result.checks]
    assert names[:2] == ["shards", "replicas"] and "retraction" in names and "trajectory" in names
    assert result.ok, result.table()
    assert result.by_name()["replicas"].measured == 0.0  # bit-identical replicas, not merely close
    assert "2 ranks" in result.summary()


@pytest.mark.slow  # 11 s on 2 cores; the two-rank test runs every check in the default suite
def test_the_reference_passes_on_four_ranks_through_the_cli(capsys):
    status = main(["validate", "--world-size", "4", REFERENCE, "--vocab", "67", "--dim", "8", "--steps", "5",
                   "--checks", "shards,replicas,penrose,retraction"])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "0 of 4 checks failed" in out and "4 ranks" in out


# each bug module fails with the check named in its docstring (and the checks listed pass or are beside it)
@pytest.mark.parametrize("module,checks,failing", [
    ("copy_padding", "shards,retraction", {"shards", "retraction"}),  # padding copies mixed into the real rows
    ("floor_slices", "shards,penrose", {"shards", "penrose"}),  # ids V - V mod n.. on no rank: nothing to judge
    ("local_retraction", "shards,replicas,penrose,retraction", {"penrose", "retraction"}),  # Z^T Z = n I
    ("unsynced_grad", "shards,replicas", {"replicas"}),  # the replicas of T drift apart
])
def test_each_sharding_bug_fails_with_its_check(module, checks, failing):
    result = validate(f"tests.sharded_zoo.{module}:make", world_size=2, checks=checks, **TINY)
    assert not result.fatal, result.fatal
    assert set(result.failed()) == failing, result.table()
    if module == "floor_slices":
        assert "[66, 67) belong to no rank" in result.by_name()["shards"].reason
        assert result.by_name()["penrose"].reason.startswith("not run:")


@pytest.mark.parametrize("module,words", [("copy_padding", "V=61: post_step with padding zeroed"),
                                          ("floor_slices", "V=61: tiling: ids [60, 61) belong to no rank")])
def test_layout_bugs_that_an_even_vocabulary_hides_fail_at_the_prime_one(module, words):
    """At V = 64 on 2 ranks the slices divide evenly and nothing is padded: `shards` also builds the target
    at the largest prime V <= 64 (61), where each bug shows; the reference passes both."""
    small = {**TINY, "vocab": 64}
    result = validate(f"tests.sharded_zoo.{module}:make", world_size=2, checks="shards", **small)
    assert result.failed() == ["shards"] and words in result.by_name()["shards"].reason, result.table()
    assert validate(REFERENCE, world_size=2, checks="shards", **small).ok


def test_the_prime_vocabulary_of_the_layout_check():
    from pitcheck.verbs.validate.shard_probes import uneven_vocab

    assert [uneven_vocab(v, 2) for v in (2048, 67, 64, 3, 2)] == [2039, 67, 61, 3, 2]
    assert uneven_vocab(7, 7) == 7 and uneven_vocab(12, 4) == 11


@pytest.mark.parametrize("factory,words", [("make_raising", "rank 1 raised ValueError during check penrose"),
                                           ("make_hanging", "rank 1 hung during check penrose"),
                                           ("make_dying", "rank 1 died during check penrose (exit status 7)")])
def test_a_failing_rank_is_named_within_the_time_limit(factory, words):
    # the peers' collectives time out at half the limit: generous, so that a loaded machine's slow but
    # healthy rank is not mistaken for a hung one
    limit = 20.0
    start = time.monotonic()
    result = validate(f"tests.sharded_zoo.faults:{factory}", world_size=2, checks="penrose",
                      **{**TINY, "timeout": limit})
    elapsed = time.monotonic() - start
    assert words in result.fatal and "\n" not in result.fatal, result.fatal
    assert result.exit_status == 2
    assert elapsed < 120 + limit, elapsed  # start-up allowance plus the limit, never waited out
    children = subprocess.run(["pgrep", "-a", "-P", str(os.getpid())], capture_output=True, text=True).stdout
    ranks = [line for line in children.splitlines() if "resource_tracker" not in line]  # the tracker is spawn's own
    assert not ranks, ranks  # every rank is gone


@pytest.mark.parametrize("kwargs,message", [
    (dict(world_size=0), "--world-size must be an integer >= 1"),
    (dict(world_size=2, checks="shards", target="pitcheck.nn:make"), "takes no rank and world_size argument"),
    (dict(world_size=None, checks="shards"), "needs a sharded target"),
])
def test_bad_input_is_one_line(kwargs, message):
    target = kwargs.pop("target", REFERENCE)
    try:
        result = validate(target, **{**TINY, **kwargs})
    except PitcheckError as exc:
        text = str(exc)
    else:
        text = result.fatal
        assert result.exit_status == 2
    assert message in text and "\n" not in text, text


def test_the_cli_refuses_a_bad_world_size_in_one_line(capsys):
    assert main(["validate", "--world-size", "-1", REFERENCE]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pitcheck: error: --world-size must be") and err.count("\n") == 1


def test_the_pytest_plugin_takes_a_world_size(tmp_path):
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "pitcheck", "-rA",
           "--pitcheck", "tests.sharded_zoo.unsynced_grad:make", "--pitcheck-world-size", "2",
           "--pitcheck-checks", "replicas", "--pitcheck-vocab", "67", "--pitcheck-dim", "8",
           __file__]  # collect this module only (deselected by -m pitcheck), not all of tests/ and stress/
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    out = proc.stdout
    assert proc.returncode == 1, out + proc.stderr
    assert "pitcheck[tests.sharded_zoo.unsynced_grad:make-float32-replicas]" in out and "1 failed" in out
