"""What `pitcheck validate` shows in the terminal: progress per check, reasons wrapped in full (or a pointer
to --report), a one-line note where a small size leaves a check inconclusive; the pytest plugin's JUnit
classnames."""
import argparse
import subprocess
import sys
from xml.etree import ElementTree as ET

from pitcheck.verbs.validate.checks import CheckResult
from pitcheck.verbs.validate.result import ValidationResult

TARGET = "tests.zoo.broken_one_solve:make"


def _result(*checks, vocab=2048, dim=32):
    return ValidationResult(TARGET, "float32", "cpu", vocab, dim, 5, 0, checks=list(checks))


def _args(*argv):
    from pitcheck.cli import validate as cli

    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["validate", *argv])


def test_a_long_reason_is_wrapped_in_full_under_its_column():
    reason = " ".join(f"state{i}: penrose residual 0.00{i} is {i}e+03 x its unit (threshold 16);" for i in range(5))
    table = _result(CheckResult("penrose", "fail", 1e3, 16, 0.1, reason)).table(width=100)
    lines = table.splitlines()
    assert all(len(line) <= 100 for line in lines)
    column = lines[0].index("reason")
    assert " ".join(line[column:] for line in lines[1:]) == reason
    assert "cut" not in table


def test_a_reason_too_long_for_the_terminal_points_to_the_report():
    reason = "; ".join(f"step {i}: penrose residual 0.001 is 4.1e+03 x its unit (threshold 16)" for i in range(40))
    table = _result(CheckResult("trajectory", "fail", 1e3, 16, 0.1, reason)).table(width=100, report="out.md")
    assert "[cut: the full reason is in --report out.md]" in table
    assert len(table.splitlines()) < 12


def test_an_inconclusive_check_at_a_small_size_names_the_size_that_resolves_it():
    unresolved = CheckResult("gradients", "inconclusive", reason="autograd vs finite differences: the differences' "
                             "measured noise (0.02) cannot resolve directional derivative error (threshold 0.3)")
    no_post_step = CheckResult("retraction", "inconclusive", reason="post_step: the module has no post_step")
    small = _result(unresolved, no_post_step, vocab=64, dim=8)
    [note] = small.size_notes("--pitcheck-vocab", "--pitcheck-dim")
    assert note.startswith("gradients: inconclusive at V=64, D=8") and "--pitcheck-vocab 2048 --pitcheck-dim 32" in note
    assert "\n" not in note
    assert _result(unresolved, no_post_step).size_notes() == []  # at the size the checks are set for: nothing


def test_the_cli_prints_a_line_per_check_as_it_is_measured(capsys):
    from pitcheck.cli import validate as cli

    code = cli.main(_args(TARGET, "--checks", "contract,penrose", "--vocab", "128", "--dim", "8", "--steps", "5"))
    out = capsys.readouterr().out
    assert code == 1
    assert "validating tests.zoo.broken_one_solve:make" in out
    assert "[1] contract measured" in out and "[2] penrose measured" in out
    assert out.index("contract measured") < out.index("penrose measured") < out.index("check  ")


def test_the_library_prints_nothing_without_a_watcher(capsys):
    from pitcheck.verbs.validate import validate

    validate(TARGET, "float32", vocab=128, dim=8, steps=5, checks="contract")
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err == ""


def test_the_pytest_plugins_junit_items_have_a_classname(tmp_path):
    junit = tmp_path / "j.xml"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "pitcheck",
           "--pitcheck", TARGET, "--pitcheck-checks", "contract,reference", "--pitcheck-vocab", "128",
           "--pitcheck-dim", "8", "--pitcheck-steps", "5", "--junitxml", str(junit), __file__]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    cases = {c.get("name"): c.get("classname") for c in ET.parse(junit).getroot().iter("testcase")}
    name = f"pitcheck[{TARGET}-float32-contract]"
    assert cases[name] == "pitcheck.tests.zoo.broken_one_solve.make.float32"
