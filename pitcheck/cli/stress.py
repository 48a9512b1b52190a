"""`pitcheck stress`."""
from __future__ import annotations

import argparse

NEEDS_TORCH = True


def add_parser(sub) -> argparse.ArgumentParser:
    from ..stress import add_stress_parser

    return add_stress_parser(sub)


def main(args) -> int:
    return args.func(args)
