"""`pitcheck bench`."""
from __future__ import annotations

import argparse

NEEDS_TORCH = True


def add_parser(sub) -> argparse.ArgumentParser:
    from ..bench import add_bench_parser

    return add_bench_parser(sub)


def main(args) -> int:
    return args.func(args)
