"""Outputs of the verbs: validate's --json/--report/--junit checked together before anything runs, its
verdict printed even when a write still fails at the end; `pitcheck --version`. (write_atomic and the path
checks themselves: test_rundir.py; plot: test_report.py; bench: test_bench.py; heads: test_heads.py.)"""
import importlib
import json
import tomllib
from pathlib import Path

import pytest

import pitcheck
from pitcheck import cli
from pitcheck.verbs.validate import CheckResult, ValidationResult

VALIDATE = importlib.import_module("pitcheck.verbs.validate")


def _canned(target, dtype, **kw):
    return ValidationResult(target=target, dtype=dtype, device="cpu", vocab=kw["vocab"], dim=kw["dim"],
                            steps=kw["steps"], seed=kw["seed"], seconds=0.1,
                            checks=[CheckResult("penrose", "pass", value=1.5, threshold=64.0, measured=1e-7)])


def _never(*args, **kw):
    raise AssertionError("the validation ran: the outputs should have been refused first")


@pytest.mark.parametrize("pair", [("--json", "--report"), ("--json", "--junit"), ("--report", "--junit")])
def test_two_validate_outputs_naming_one_file_are_refused_before_running(tmp_path, monkeypatch, capsys, pair):
    monkeypatch.setattr(VALIDATE, "validate", _never)
    (tmp_path / "d").mkdir()
    argv = ["validate", "pitcheck.nn:make", pair[0], str(tmp_path / "r"), pair[1], str(tmp_path / "d" / ".." / "r")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and pair[1] in err[0] and pair[0] in err[0]
    assert not (tmp_path / "r").exists()


def test_validate_outputs_to_one_fifo_are_allowed(tmp_path, monkeypatch, capsys):
    """A device or FIFO (/dev/null, /dev/stdout) is written in place, one output after the other."""
    import os

    monkeypatch.setattr(VALIDATE, "validate", _canned)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        assert cli.main(["validate", "pitcheck.nn:make", "--json", str(fifo), "--report", str(fifo)]) == 0
        data = os.read(reader, 1 << 16).decode()
    finally:
        os.close(reader)
    assert data.startswith("{") and "# pitcheck validate" in data


def test_validate_prints_its_verdict_before_a_late_write_error(tmp_path, monkeypatch, capsys):
    """An output that was writable when checked and is not at the end: the table and summary are
    printed, then the one-line error (exit 2)."""
    late = tmp_path / "r.json"

    def validate_then_block_the_output(target, dtype, **kw):
        late.mkdir()  # e.g. another program made a directory there meanwhile
        return _canned(target, dtype, **kw)

    monkeypatch.setattr(VALIDATE, "validate", validate_then_block_the_output)
    assert cli.main(["validate", "pitcheck.nn:make", "--json", str(late)]) == 2
    captured = capsys.readouterr()
    assert "penrose" in captured.out and "0 of 1 checks failed" in captured.out
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and "r.json" in err[0] and "directory" in err[0]


def test_validate_json_to_a_link_keeps_the_link(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(VALIDATE, "validate", _canned)
    target = tmp_path / "kept.json"
    target.write_text("{}")
    (tmp_path / "link.json").symlink_to(target)
    assert cli.main(["validate", "pitcheck.nn:make", "--json", str(tmp_path / "link.json")]) == 0
    assert (tmp_path / "link.json").is_symlink() and json.loads(target.read_text())["checks"][0]["name"] == "penrose"


def test_version(capsys, monkeypatch):
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    assert pitcheck.__version__ == pyproject["project"]["version"]
    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"pitcheck {cli.package_version()}"
    # a tree that is not installed: the package's own version
    from importlib import metadata

    def not_installed(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", not_installed)
    assert cli.package_version() == pitcheck.__version__


@pytest.mark.parametrize("option", ["--junit", "--json", "--report"])
def test_validate_output_to_dev_stdout_onto_a_pipe_is_written_there(option):
    # /dev/stdout's realpath is /proc/PID/fd/pipe:[N], which names nothing: the output is the pipe itself
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "pitcheck.cli", "validate", "pitcheck.nn:make", "--vocab", "64",
                           "--dim", "4", "--checks", "contract", option, "/dev/stdout"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=240)
    assert done.returncode == 0, done.stderr.decode()
    tail = {"--junit": b"</testsuites>", "--json": b"}", "--report": b"contract"}[option]
    assert tail in done.stdout.strip().splitlines()[-1] or tail in done.stdout, done.stdout[-300:]
