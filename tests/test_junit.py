"""pitcheck.junit: the one JUnit XML writer (stress uses it; any verb may)."""
from xml.etree import ElementTree as ET

from pitcheck.junit import ERROR, FAILURE, SKIPPED, Case, Outcome, Suite, junit_xml, xml_text


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
