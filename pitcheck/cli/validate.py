"""`pitcheck validate`: judge a third-party PIT implementation (module:factory) against the reference."""
from __future__ import annotations

import argparse
import sys

from .common import check_writable

NEEDS_TORCH = True


def add_parser(sub) -> argparse.ArgumentParser:
    from ..verbs.validate import CHECKS, api
    from ..verbs.validate.dtypes import DTYPES

    v = sub.add_parser("validate", help="judge a third-party PIT implementation (module:factory) against the reference")
    v.add_argument("target", help="module:factory or path/to/file.py:factory")
    v.add_argument("--dtype", default="float32", help=f"one of {', '.join(DTYPES)} (default float32)")
    v.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    v.add_argument("--vocab", type=int, default=api.DEFAULT_VOCAB)
    v.add_argument("--dim", type=int, default=api.DEFAULT_DIM)
    v.add_argument("--steps", type=int, default=api.DEFAULT_STEPS, help="trajectory steps")
    v.add_argument("--seed", type=int, default=0)
    v.add_argument("--checks", default="all", help=f"comma-separated subset of: {', '.join(CHECKS)} "
                   "(and shards, replicas with --world-size)")
    v.add_argument("--world-size", type=int, default=None, metavar="N",
                   help="validate a vocabulary-parallel target on N ranks (gloo on CPU, NCCL on CUDA); its factory "
                        "takes rank= and world_size= (the shard contract)")
    v.add_argument("--timeout", type=float, default=api.DEFAULT_TIMEOUT, help="seconds for the target's process")
    v.add_argument("--json", default=None, metavar="FILE")
    v.add_argument("--report", default=None, metavar="FILE.md")
    v.add_argument("--junit", default=None, metavar="FILE.xml")
    return v


class Progress:
    """A line on stdout, before the table, as each phase of the target's process ends: its import, its build, each check's
    measurement (the verdicts are judged once every measurement is in)."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stdout  # stderr holds a failure's one line alone
        self.previous, self.done = None, 0

    def __call__(self, phase: str, seconds: float) -> None:
        if phase.startswith("done "):
            self.done += 1
            self._line(f"[{self.done}] {phase[len('done '):]} measured", seconds)
        elif self.previous in ("import", "build"):
            self._line(f"{'imported' if self.previous == 'import' else 'built'} the target", seconds)
        self.previous = phase

    def _line(self, text: str, seconds: float) -> None:
        print(f"  {text} ({seconds:.1f} s)", file=self.stream, flush=True)


def main(args) -> int:
    from ..verbs.validate import validate
    from ..verbs.validate.api import check_arguments
    from ..verbs.validate.isolation import watch
    from ..verbs.validate.result import check_outputs

    options = dict(device=args.device, vocab=args.vocab, dim=args.dim, steps=args.steps, seed=args.seed,
                   checks=args.checks, timeout=args.timeout, world_size=args.world_size)
    check_arguments(args.dtype, **options)  # bad options are refused before the banner
    check_outputs(args.json, args.report, args.junit, target=args.target)
    check_writable(files=[("--json", args.json), ("--report", args.report), ("--junit", args.junit)])
    print(f"validating {args.target} [{args.dtype}, V={args.vocab}, D={args.dim}] in a child process "
          f"(up to {args.timeout:g} s); the verdicts follow the measurements", flush=True)
    with watch(Progress()):
        result = validate(args.target, args.dtype, **options)
    # the verdict is printed first: an output that still cannot be written loses nothing else
    print(result.table(report=args.report))
    print(result.summary(), file=sys.stderr if result.fatal else sys.stdout)
    for note in result.size_notes():
        print(note)
    result.write(args.json, args.report, args.junit)
    return result.exit_status
