"""pytest plugin: `pytest --pitcheck mypkg.pit:make` adds one test item per validator check.

Inert unless --pitcheck is given. Item names are `pitcheck[TARGET-DTYPE-CHECK]`, so -k, --junitxml and
expected failures work as users know them from array-api-tests and scikit-learn's check_estimator; the
items sit under one node per target and dtype, `pitcheck.TARGET.DTYPE`, which JUnit XML reports as their
classname.
An xfail file (--pitcheck-xfail) holds one entry per line: a check name or a full item id, then an
optional `# reason`. The target is validated once per (target, dtype), in a child process.
"""
from __future__ import annotations

import pytest

from ...infra.errors import PitcheckError
from .api import DEFAULT_DIM, DEFAULT_STEPS, DEFAULT_TIMEOUT, DEFAULT_VOCAB, check_options, parse_checks, validate
from .dtypes import DTYPES
from .shard_run import check_world_size


def pytest_addoption(parser) -> None:
    group = parser.getgroup("pitcheck", "PIT implementation validation (pitcheck validate)")
    group.addoption("--pitcheck", action="append", default=[], metavar="TARGET",
                    help="validate this PIT implementation (module:factory or path/file.py:factory); repeatable")
    group.addoption("--pitcheck-dtype", default="float32",
                    help=f"comma-separated dtypes to validate in ({', '.join(DTYPES)})")
    group.addoption("--pitcheck-checks", default="all", help="comma-separated subset of the checks")
    group.addoption("--pitcheck-xfail", default=None, metavar="FILE",
                    help="expected failures: one check name or item id per line, '# reason' after it")
    group.addoption("--pitcheck-vocab", type=int, default=DEFAULT_VOCAB)
    group.addoption("--pitcheck-dim", type=int, default=DEFAULT_DIM)
    group.addoption("--pitcheck-steps", type=int, default=DEFAULT_STEPS)
    group.addoption("--pitcheck-timeout", type=float, default=DEFAULT_TIMEOUT)
    group.addoption("--pitcheck-world-size", type=int, default=None, metavar="N",
                    help="validate a vocabulary-parallel target on N ranks (the shard contract; adds shards, replicas)")


def read_xfails(path: str | None) -> dict[str, str]:
    """{check name or item id: reason} from an xfail file."""
    if not path:
        return {}
    try:
        text = open(path, encoding="utf-8").read()
    except OSError as exc:
        raise pytest.UsageError(f"--pitcheck-xfail {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise pytest.UsageError(f"--pitcheck-xfail {path}: not a UTF-8 text file") from None
    out = {}
    for line in text.splitlines():
        entry, _, reason = line.partition("#")
        if entry.strip():
            out[entry.strip()] = reason.strip() or "expected failure"
    return out


class PitcheckFailure(Exception):
    """A check failed: reported as its one-line reason, not a traceback into pitcheck."""


class ValidationCache:
    def __init__(self, config):
        self.config, self.results = config, {}

    def get(self, target: str, dtype: str):
        key = (target, dtype)
        if key not in self.results:
            opt = self.config.getoption
            self.results[key] = validate(target, dtype, vocab=opt("pitcheck_vocab"), dim=opt("pitcheck_dim"),
                                         steps=opt("pitcheck_steps"), timeout=opt("pitcheck_timeout"),
                                         checks=opt("pitcheck_checks"), world_size=opt("pitcheck_world_size"))
        return self.results[key]


class PitcheckItem(pytest.Item):
    def __init__(self, *, target: str, dtype: str, check: str, **kwargs):
        super().__init__(**kwargs)
        self.target, self.dtype, self.check = target, dtype, check

    def runtest(self) -> None:
        try:
            result = self.config._pitcheck_cache.get(self.target, self.dtype)
        except PitcheckError as exc:
            raise PitcheckFailure(f"target error: {exc}") from None
        if result.fatal:
            raise PitcheckFailure(f"target error: {result.fatal}")
        c = result.by_name().get(self.check)
        if c is None:
            raise PitcheckFailure(f"{self.check}: no result from the target")
        self.user_properties.append(("ratio", c.value))
        self.user_properties.append(("threshold", c.threshold))
        if c.verdict in ("fail", "error"):
            raise PitcheckFailure(f"{self.check}: {c.reason} (ratio {c.value}, threshold {c.threshold})")
        if c.verdict == "inconclusive":
            note = next((n for n in result.size_notes("--pitcheck-vocab", "--pitcheck-dim")
                         if n.startswith(f"{self.check}: ")), "")
            pytest.skip(note.partition(": ")[2] + f" ({c.reason})" if note else f"inconclusive: {c.reason}")

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, PitcheckFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, None, self.name


class PitcheckTarget(pytest.Collector):
    """The node that holds one target's items in one dtype (its name is their JUnit classname); it
    collects nothing itself: pytest_collection_modifyitems makes the items."""

    def collect(self):
        return []


def classname(target: str, dtype: str) -> str:
    """`pitcheck.<target>.<dtype>`: a dotted name as JUnit readers group by ('/' and ':' as dots, no '[')."""
    plain = target.replace("/", ".").replace(":", ".").replace("[", "(").replace("]", ")")
    return f"pitcheck.{plain}.{dtype}"


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "pitcheck: a pitcheck validate check (select with -m pitcheck)")
    if config.getoption("pitcheck", default=None):
        config._pitcheck_cache = ValidationCache(config)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session, config, items) -> None:
    targets = config.getoption("pitcheck", default=None)
    if not targets:
        return
    opt = config.getoption
    # a dtype or target named twice is validated once: one item per id
    targets = list(dict.fromkeys(targets))
    dtypes = list(dict.fromkeys(d.strip() for d in opt("pitcheck_dtype").split(",") if d.strip()))
    try:
        world_size = opt("pitcheck_world_size")
        if world_size is not None:
            check_world_size(world_size)
        checks = parse_checks(opt("pitcheck_checks"), sharded=world_size is not None)
        if not dtypes:
            raise ValueError("--pitcheck-dtype names no dtype")
        for dtype in dtypes:
            check_options(dtype, vocab=opt("pitcheck_vocab"), dim=opt("pitcheck_dim"), steps=opt("pitcheck_steps"),
                          timeout=opt("pitcheck_timeout"))
    except ValueError as exc:
        raise pytest.UsageError(f"pitcheck: {exc}") from None
    xfails = read_xfails(opt("pitcheck_xfail"))
    ids = {f"pitcheck[{t}-{d}-{c}]" for t in targets for d in dtypes for c in checks}
    unknown = [entry for entry in xfails if entry not in checks and entry not in ids]
    if unknown:
        raise pytest.UsageError(f"--pitcheck-xfail: {', '.join(unknown)} names no selected check or item id")
    for target in targets:
        for dtype in dtypes:
            group = classname(target, dtype)
            node = PitcheckTarget.from_parent(session, name=group, nodeid=group)
            for check in checks:
                name = f"pitcheck[{target}-{dtype}-{check}]"
                item = PitcheckItem.from_parent(node, name=name, target=target, dtype=dtype, check=check)
                item.add_marker(pytest.mark.pitcheck)
                reason = xfails.get(name, xfails.get(check))
                if reason is not None:
                    item.add_marker(pytest.mark.xfail(reason=reason, strict=False))
                items.append(item)
