"""`pitcheck heads`: PIT against standard tying and untied tables on real text."""
from __future__ import annotations

import argparse

from .common import add_lm_options

NEEDS_TORCH = True


def add_parser(sub) -> argparse.ArgumentParser:
    from ..lm.compare import add_heads_parser

    add_heads_parser(sub)
    h = sub.choices["heads"]
    add_lm_options(h)
    return h


def main(args) -> int:
    return args.func(args)
