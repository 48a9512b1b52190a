"""Command line: a thin layer over pitcheck's Python API, one module per verb.

Each verb module has `add_parser(subparsers)`, `main(args) -> int` and `NEEDS_TORCH`. The library
raises PitcheckError; only this layer prints and chooses exit statuses. Bad input ends in a one-line error
and exit status 2; a run whose state breaks down, in a message and exit status 1; Ctrl-C, at any moment, in
a one-line message (exit 130, or 2 with the checkpoint saved). Only the standard library is imported at the
top: Ctrl-C while numpy, scipy or torch load is still inside main's handler.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from ..infra.errors import PitcheckError
from .common import CtrlCNeverSwallowed, import_torch_holding_ctrl_c

# verb -> its module under pitcheck/cli (imported when the parser is built)
VERBS = ("run", "compare", "plot", "validate", "stress", "bench", "heads", "convert")


def package_version() -> str:
    """The installed distribution's version; pitcheck.__version__ when run from a tree not installed."""
    from importlib import metadata

    from .. import __version__

    try:
        return metadata.version("pitcheck")
    except metadata.PackageNotFoundError:
        return __version__


def _verb_module(verb: str):
    return importlib.import_module(f"{__name__}.{verb}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pitcheck", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    for verb in VERBS:
        _verb_module(verb).add_parser(sub)
        # one thread policy for every verb, applied in _main (pitcheck.infra.threads)
        sub.choices[verb].add_argument(
            "--threads", type=_positive_int, default=None, metavar="N",
            help="torch and BLAS threads of this process, or of each worker of a pool (default: 1 for a single "
                 "process, measured fastest; a pool's workers share the cores)")
    return parser


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    try:
        ctrl_c = CtrlCNeverSwallowed()
        try:
            return _main(argv)
        finally:
            ctrl_c.close()
    except KeyboardInterrupt:
        print("pitcheck: interrupted", file=sys.stderr)
        return 130
    except RuntimeError as exc:
        # Ctrl-C landing in a class's __set_name__ while a library imports (scipy's, measured) reaches here
        # wrapped in a RuntimeError: still an interruption, not a crash
        if not _caused_by_ctrl_c(exc):
            raise
        print("pitcheck: interrupted", file=sys.stderr)
        return 130


def _caused_by_ctrl_c(exc: BaseException) -> bool:
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def _main(argv: list[str] | None) -> int:
    from ..trajectory import RunBreakdown

    args = build_parser().parse_args(argv)
    verb = _verb_module(args.command)
    if verb.NEEDS_TORCH:
        import_torch_holding_ctrl_c()
    from ..infra.threads import apply_thread_policy

    apply_thread_policy(args.threads, torch=verb.NEEDS_TORCH)
    try:
        return verb.main(args)
    except RunBreakdown as exc:
        print(f"pitcheck: breakdown: {exc}", file=sys.stderr)
        return 1
    except PitcheckError as exc:
        print(f"pitcheck: error: {exc}", file=sys.stderr)
        return 2
    except MemoryError:
        print("pitcheck: error: out of memory; choose a smaller --vocab or --dim", file=sys.stderr)
        return 2
    except OSError as exc:
        # the edges turn the expected ones into PitcheckError; this keeps any other to one line too
        print(f"pitcheck: error: {exc.strerror or exc}{f': {exc.filename}' if exc.filename else ''}", file=sys.stderr)
        return 2
