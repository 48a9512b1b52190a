"""JUnit XML, the report CI systems read: suites of test cases, each passed, failed, skipped or in error.

The verbs describe their results as Suites of Cases; `junit_xml` counts and writes them. Any text may
go in (a user's scenario name, a target's error message): characters XML 1.0 cannot hold are written
as their Python escapes, so the file always parses.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from xml.etree import ElementTree as ET

FAILURE, SKIPPED, ERROR = "failure", "skipped", "error"
# the count attribute of each outcome, in the order they are written
COUNTED = ((FAILURE, "failures"), (SKIPPED, "skipped"), (ERROR, "errors"))

_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def xml_text(text: str) -> str:
    """`text` with every character XML 1.0 cannot hold written as its Python escape (\\x01), so the file parses."""
    return _NOT_XML.sub(lambda m: ascii(m.group())[1:-1], text)


@dataclass(frozen=True)
class Outcome:
    """Why a case did not pass: its element (FAILURE, SKIPPED or ERROR), message, type and body text."""
    kind: str
    message: str
    type: str | None = None
    text: str | None = None


@dataclass
class Case:
    """One test case; no outcome: it passed."""
    classname: str
    name: str
    seconds: float | None = None
    outcome: Outcome | None = None


@dataclass
class Suite:
    """A named group of cases (`file`: where they come from, if anything)."""
    name: str
    cases: list[Case] = field(default_factory=list)
    seconds: float = 0.0
    file: str | None = None


def _counts(cases: list[Case]) -> dict[str, int]:
    counts = {"tests": len(cases)}
    for kind, attribute in COUNTED:
        counts[attribute] = sum(1 for c in cases if c.outcome is not None and c.outcome.kind == kind)
    return counts


def junit_xml(suites: list[Suite], name: str | None = None) -> bytes:
    """The suites as one JUnit XML document (UTF-8, with its declaration); counts on each suite and in
    all on the root `testsuites` (named `name` if given); times in seconds to the millisecond."""
    root = ET.Element("testsuites")
    if name is not None:
        root.set("name", xml_text(name))
    total = dict.fromkeys(("tests", *(a for _, a in COUNTED)), 0)
    for suite in suites:
        element = ET.SubElement(root, "testsuite", name=xml_text(suite.name))
        if suite.file is not None:
            element.set("file", xml_text(suite.file))
        for case in suite.cases:
            attributes = {"classname": xml_text(case.classname), "name": xml_text(case.name)}
            if case.seconds is not None:
                attributes["time"] = f"{case.seconds:.3f}"
            case_element = ET.SubElement(element, "testcase", attributes)
            if case.outcome is not None:
                o = case.outcome
                outcome = ET.SubElement(case_element, o.kind, message=xml_text(o.message))
                if o.type is not None:
                    outcome.set("type", xml_text(o.type))
                if o.text is not None:
                    outcome.text = xml_text(o.text)
        for attribute, count in _counts(suite.cases).items():
            element.set(attribute, str(count))
            total[attribute] += count
        element.set("time", f"{suite.seconds:.3f}")
    for attribute, count in total.items():
        root.set(attribute, str(count))
    return ET.tostring(root, encoding="utf-8", xml_declaration=True)
