"""`pitcheck compare`: a grid of runs, a verdict per precision, summary.csv, report.md and plots."""
from __future__ import annotations

import argparse

NEEDS_TORCH = True


def add_parser(sub) -> argparse.ArgumentParser:
    from ..sweep import add_compare_options

    c = sub.add_parser("compare", help="sweep a grid of runs (retraction x precision x ...): a verdict, "
                       "summary.csv, report.md and plots")
    add_compare_options(c)
    return c


def main(args) -> int:
    from ..sweep import main_compare

    return main_compare(args)
