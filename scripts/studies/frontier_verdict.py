"""The frontier study's verdict per method and precision, from the committed compare summary
and bench figures: results/frontier/summary.csv and results/frontier/bench/bench.json -> verdict.md.

Per (method, precision), over both adversaries and both shapes (seeds aggregated by compare): the worst
final ||Z^T Z - I||_F in units of the storage floor, the largest growth exponent (with its standard
error), the failed retractions, and the bench's cost in GEMM units (Z^T Z of the same shape) at each
benchmarked shape. Safe: no failed step and every growth exponent below 0.25 (compare's rule); an
approximate map is listed with its error, which no growth figure makes safe.

    PYTHONPATH=$PWD python scripts/studies/frontier_verdict.py [--dir results/frontier]
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

from pitcheck.model.retractions import APPROXIMATE

METHODS = ("qr", "cholqr2", "rcqr", "cholqr3-shifted", "polar-express", "gram-ns", "landing", "ns5")
GROWTH_LIMIT = 0.25  # compare's verdict: below it the error is taken as bounded


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default="results/frontier")
    d = Path(ap.parse_args(argv).dir)
    with open(d / "summary.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    bench = json.loads((d / "bench" / "bench.json").read_text())["results"]
    shapes = sorted({(r["vocab"], r["dim"]) for r in bench if r["kind"] == "retraction"})
    cost = {(r["retraction"], r["vocab"], r["dim"]): r["ratio"] for r in bench if r["kind"] == "retraction"}
    precisions = list(dict.fromkeys(r["precision"] for r in rows))
    head = ["method", "precision", "worst x floor", "worst final ‖ZᵀZ-I‖", "max growth exp.", "failed retr.",
            *[f"GEMM units {V}x{D}" for V, D in shapes], "verdict"]
    out = ["# frontier: the new methods against qr and cholqr2", "",
           "`PYTHONPATH=$PWD python scripts/studies/frontier_verdict.py` from summary.csv (compare, "
           "pitcheck/grids/frontier.toml) and bench/bench.json (`pitcheck bench`, fp32, one thread, process CPU "
           "time on a shared 2-core machine). Worst over adversaries (gaussian, dense_output+sparse_input) and "
           f"shapes (V/D = 16, 256). Safe: no failed retraction and growth exponent below {GROWTH_LIMIT} in every row "
           "(compare's rule; the growth exponent is measured over steps sqrt(N)..N, N = 1000).", "",
           "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for m in METHODS:
        for p in precisions:
            sel = [r for r in rows if r["retraction"] == m and r["precision"] == p]
            if not sel:
                continue
            worst = max(sel, key=lambda r: float(r["error_over_floor"]))
            growth = max(sel, key=lambda r: float(r["growth_exponent"]))
            failed = sum(int(float(r["failed_retractions"])) for r in sel)
            g = float(growth["growth_exponent"])
            if m in APPROXIMATE and m != "landing":
                verdict = "approximate: not a retraction"
            elif failed or not g < GROWTH_LIMIT:
                verdict = "unsafe"
            else:
                verdict = "safe" + (" (retraction-free: bounded, never on the manifold)" if m == "landing" else "")
            out.append(f"| {m} | {p} | {float(worst['error_over_floor']):.3g} | {float(worst['final_orthonormality']):.3g} "
                       f"| {g:+.2f} ± {float(growth['growth_exponent_err']):.2f} | {failed} | "
                       + " | ".join(f"{cost.get((m, V, D), float('nan')):.3g}" for V, D in shapes)
                       + f" | {verdict} |")
    (d / "verdict.md").write_text("\n".join(out) + "\n")
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
