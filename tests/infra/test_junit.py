"""pitcheck.infra.junit: the one JUnit XML writer (stress uses it; any verb may)."""
from xml.etree import ElementTree as ET

from pitcheck.infra.junit import ERROR, FAILURE, SKIPPED, Case, Outcome, Suite, junit_xml, xml_text


def test_counts_on_each_suite_and_in_all_on_the_root():
    suites = [Suite("a", [Case("a.x", "m", 0.5), Case("a.x", "n", 0.25, Outcome(FAILURE, "over", "BudgetBroken", "body"))],
                    seconds=0.75, file="a.toml"),
              Suite("b", [Case("b.y", "-", outcome=Outcome(SKIPPED, "needs CUDA")),
                          Case("b.y", "t", outcome=Outcome(ERROR, "raised"))])]
    root = ET.fromstring(junit_xml(suites, name="pitcheck stress"))
    assert root.tag == "testsuites" and root.get("name") == "pitcheck stress"
    assert [root.get(k) for k in ("tests", "failures", "skipped", "errors")] == ["4", "1", "1", "1"]
    a, b = root.findall("testsuite")
    assert (a.get("file"), a.get("time"), a.get("tests"), a.get("failures")) == ("a.toml", "0.750", "2", "1")
    failure = a.find("testcase[@name='n']/failure")
    assert (failure.get("message"), failure.get("type"), failure.text) == ("over", "BudgetBroken", "body")
    assert a.find("testcase[@name='m']").get("time") == "0.500" and b.find("testcase").get("time") is None
    assert b.get("file") is None and b.find("testcase/skipped").get("message") == "needs CUDA"


def test_the_stress_layout_bytes():
    # the bytes `pitcheck stress --junit` has always written (attribute order, declaration, no line breaks)
    xml = junit_xml([Suite("s", [Case("s.a", "m", 0.0)], file="s.toml")], name="pitcheck stress")
    assert xml == (b"<?xml version='1.0' encoding='utf-8'?>\n"
                   b'<testsuites name="pitcheck stress" tests="1" failures="0" skipped="0" errors="0">'
                   b'<testsuite name="s" file="s.toml" tests="1" failures="0" skipped="0" errors="0" time="0.000">'
                   b'<testcase classname="s.a" name="m" time="0.000" /></testsuite></testsuites>')


def test_text_xml_cannot_hold_is_escaped_so_the_file_parses():
    assert xml_text("a\x00b\x1b\ufffe\tc\n") == "a\\x00b\\x1b\\ufffe\tc\n"
    odd = "bad \x01 \x0b name"
    root = ET.fromstring(junit_xml([Suite(odd, [Case(odd, odd, outcome=Outcome(FAILURE, odd, text=odd))])]))
    assert root.find("testsuite/testcase/failure").text == "bad \\x01 \\x0b name"


def test_validate_junit_goes_through_the_one_writer_and_parses_with_control_characters():
    """validate's JUnit is the shared writer's (it wrote its own before, which put a target's control
    characters into the file raw: a document no XML parser reads)."""
    import xml.etree.ElementTree as ET

    from pitcheck.verbs.validate.checks import CheckResult
    from pitcheck.verbs.validate.result import ValidationResult

    result = ValidationResult("m:f", "float32", "cpu", 8, 2, 3, 0, seconds=1.5, checks=[
        CheckResult("penrose", "pass"), CheckResult("contract", "fail", 3.0, 1.0, reason="bad\x02 <y>"),
        CheckResult("shadow", "inconclusive", reason="why"), CheckResult("retraction", "error", reason="boom\x1b")])
    root = ET.fromstring(result.junit().encode())
    suite = root.find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped"), suite.get("errors")) == ("4", "1", "1", "1")
    failure = suite.find("testcase[@name='contract']/failure")
    assert failure.get("message") == "bad\\x02 <y> (ratio 3, threshold 1)"
    assert suite.find("testcase[@name='retraction']/error").get("message") == "boom\\x1b"
    assert suite.find("testcase[@name='shadow']/skipped").get("message") == "inconclusive: why"
