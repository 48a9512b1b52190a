"""The validator's registry: one record per check, each with a probe and a judge; the views callers use
(CHECKS, SHARDED_CHECKS) agreeing with it."""
from __future__ import annotations

import inspect

import pytest

from pitcheck.infra.errors import PitcheckError
from pitcheck.verbs.validate import CHECKS, checks, probes, shard_checks
from pitcheck.verbs.validate.api import parse_checks
from pitcheck.verbs.validate.registry import CHECK_RECORDS, Check, register

ONE_PROCESS = ["contract", "penrose", "reference", "conditioning", "gradients", "trajectory", "retraction",
               "checkpoint", "bad_input", "scale"]
SHARDED = ["shards", "replicas"]


def test_every_check_has_a_probe_and_a_judge():
    assert list(CHECK_RECORDS) == ONE_PROCESS + SHARDED
    for name, check in CHECK_RECORDS.items():
        assert check.name == name
        assert callable(check.probe) and callable(check.judge)
        assert list(inspect.signature(check.judge).parameters) == ["probe", "ctx"]
    for name in ONE_PROCESS:
        # a one-process check's probe and judge are probes.py's and checks.py's functions of its name
        assert CHECK_RECORDS[name].probe is getattr(probes, f"probe_{name}")
        assert CHECK_RECORDS[name].judge is getattr(checks, f"check_{name}")
        assert not CHECK_RECORDS[name].sharded
    for name in SHARDED:
        assert CHECK_RECORDS[name].sharded and CHECK_RECORDS[name].probe.name == f"probe_{name}"
        assert CHECK_RECORDS[name].judge is getattr(shard_checks, f"check_{name}")


def test_the_views_are_the_records():
    assert CHECKS == {n: CHECK_RECORDS[n].judge for n in ONE_PROCESS}
    assert shard_checks.SHARDED_CHECKS == {n: CHECK_RECORDS[n].judge for n in SHARDED}
    assert parse_checks(None) == ONE_PROCESS
    assert parse_checks(None, sharded=True) == SHARDED + ONE_PROCESS


def test_the_sharded_probes_are_the_ranks_functions():
    pytest.importorskip("torch")
    from pitcheck.verbs.validate import shard_probes

    for name in SHARDED:
        assert callable(getattr(shard_probes, CHECK_RECORDS[name].probe.name))


def test_a_second_check_under_one_name_is_refused():
    with pytest.raises(PitcheckError, match="'scale' is registered twice"):
        register(Check("scale", probes.probe_scale, checks.check_scale))
    assert CHECK_RECORDS["scale"].judge is checks.check_scale
