"""Outputs that pass the permission bits but cannot be created (root in /proc): validate, stress and bench
refuse them in one line before the work, not after it, when the work's results would be lost."""
from pathlib import Path

import pytest

import pitcheck.verbs.bench.benchmark
from pitcheck import cli
from pitcheck.cli import stress as stress_cli
from pitcheck.cli.common import check_writable
from tests.helpers import TINY_SCENARIO, stress_args

pytestmark = pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")



def _not_called(*args, **kwargs):
    raise AssertionError("the work started before its outputs were checked")


def test_stress_refuses_an_output_that_cannot_be_created_before_any_run(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("pitcheck.verbs.stress.run_scenarios", _not_called)
    f = tmp_path / "s.toml"
    f.write_text(TINY_SCENARIO, encoding="utf-8")
    for option in ({"json": "/proc/x"}, {"junit": "/proc/x.xml"}, {"out": "/proc/x/runs"}):
        assert stress_cli.main(stress_args([f], **option)) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and "cannot create a file in /proc" in err, err


def test_bench_refuses_an_output_that_cannot_be_created_before_timing(capsys, monkeypatch):
    monkeypatch.setattr(pitcheck.verbs.bench.benchmark, "run_bench", _not_called)
    for option in (["--json", "/proc/x"], ["--out", "/proc/x/bench"]):
        assert cli.main(["bench", "--shape", "64x8", "--rounds", "1", *option]) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and "cannot create a file in /proc" in err, err


def test_validate_refuses_an_output_that_cannot_be_created_before_judging(capsys, monkeypatch):
    import pitcheck.verbs.validate

    monkeypatch.setattr(pitcheck.verbs.validate, "validate", _not_called)
    for option in ("--json", "--report", "--junit"):
        assert cli.main(["validate", "tests/zoo/abort.py:make", option, "/proc/x"]) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and f"{option} /proc/x: cannot create a file in /proc" in err, err


def test_a_writable_place_passes_and_keeps_nothing_of_the_probe(tmp_path):
    check_writable(files=[("--json", tmp_path / "r.json"), ("--junit", None)], dirs=[("--out", tmp_path / "a" / "b")])
    assert list(tmp_path.iterdir()) == []
    check_writable(files=[("--json", "/dev/null")])  # a device is written in place: nothing to create
