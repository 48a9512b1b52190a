"""Run `pitcheck validate` on every implementation in tests/zoo, in float32 and bfloat16, and write
results/validate/zoo.md: for each, the exit status, the checks that failed, and the worst ratio of the
check that exists to catch its bug. Usage (from the repository root):

    .venv/bin/python scripts/studies/validate_zoo.py [--vocab 1024 --dim 16 --steps 200 --out results/validate]
    python3 scripts/studies/validate_zoo.py --device cuda --jobs 8 --timeout 90 --out $OUT/zoo   # scripts/gpu_check.sh

zoo.md is rewritten after every target, so a run stopped by a time limit keeps what it measured. A zoo
module needing a package that is not installed (tests/zoo OPTIONAL) is listed as skipped, not failed.
Exit 1 when an outcome is not the expected one (correct_* pass, broken_* fail their check).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROCESS_FAILURES = ("hang", "abort", "unimportable")


def zoo_names() -> list[str]:
    names = sorted(p.stem for p in (ROOT / "tests" / "zoo").glob("*.py") if not p.stem.startswith("_"))
    return [n for n in names if n not in PROCESS_FAILURES] + list(PROCESS_FAILURES)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    ap.add_argument("--timeout", type=float, default=120, help="per target (hang.py takes all of it)")
    ap.add_argument("--jobs", type=int, default=1, help="validations at once (each is its own process)")
    ap.add_argument("--only", default="", help="comma-separated zoo names (default: all)")
    ap.add_argument("--out", default="results/validate")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from tests.zoo import CAUGHT_BY, CAUGHT_IN, NOT_SHOWN, OPTIONAL
    out = Path(args.out)
    (out / "json").mkdir(parents=True, exist_ok=True)
    names = zoo_names()
    if args.only:
        wanted = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in wanted if n not in names]
        if unknown:
            ap.error(f"not in tests/zoo: {', '.join(unknown)}")
        names = [n for n in names if n in wanted]
    # float32 solves are a bug only under a float64 request
    runs = [(dtype, name) for dtype in args.dtypes.split(",") for name in names]
    if "broken_fp32_solves" in names:
        runs.append(("float64", "broken_fp32_solves"))
    missing = {name: pkg for name, pkg in OPTIONAL.items() if importlib.util.find_spec(pkg) is None}
    rows: list[dict] = []
    lock = threading.Lock()  # the jobs' rows and zoo.md

    def one(dtype: str, name: str) -> dict:
        if name in missing:
            row = {"target": name, "dtype": dtype, "exit": None, "expected": CAUGHT_BY.get(name, "-"), "failed": "-",
                   "inconclusive": "-", "ratio": None, "threshold": None, "wall": 0.0,
                   "reason": f"skipped: needs {missing[name]}, not installed"}
        else:
            caught_by = {**CAUGHT_BY, **{n: check for (d, n), (check, _) in CAUGHT_IN.items() if d == dtype}}
            row = validate_one(dtype, name, args, out, caught_by)
        with lock:
            rows.append(row)
            status = "skipped" if row["exit"] is None else f"exit {row['exit']}"
            print(f"{dtype:9s} {name:28s} {status}  failed: {row['failed']}  ({row['wall']:.1f} s)", flush=True)
            write_summary(out, args, rows, NOT_SHOWN)
        return row

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        list(pool.map(lambda run: one(*run), runs))
    unexpected = write_summary(out, args, rows, NOT_SHOWN)
    print(f"-> {out / 'zoo.md'}")
    for u in unexpected:
        print(f"UNEXPECTED {u}", file=sys.stderr)
    return 1 if unexpected else 0


def validate_one(dtype: str, name: str, args, out: Path, caught_by: dict) -> dict:
    json_path = out / "json" / f"{name}-{dtype}.json"
    json_path.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "pitcheck.cli", "validate", f"tests.zoo.{name}:make", "--dtype", dtype,
           "--device", args.device, "--vocab", str(args.vocab), "--dim", str(args.dim), "--steps", str(args.steps),
           "--timeout", str(args.timeout), "--json", str(json_path)]
    start = time.monotonic()
    # the validator keeps its own limit; this one only guards against the validator itself hanging
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=args.timeout + 120)
        code, tail = proc.returncode, (proc.stderr.strip().splitlines() or [""])[-1]
    except subprocess.TimeoutExpired:
        code, tail = None, f"the validator itself did not end within {args.timeout + 120:g} s"
    wall = time.monotonic() - start
    want = caught_by.get(name, "")
    if code is None or not json_path.exists():  # the validator failed to report: say so, never a pass
        return {"target": name, "dtype": dtype, "exit": code if code is not None else -1, "expected": want or "-",
                "failed": "(no report)", "inconclusive": "-", "ratio": None, "threshold": None,
                "reason": tail, "wall": wall}
    data = json.loads(json_path.read_text())
    failed = ["(target error)"] if data["fatal"] else [c["name"] for c in data["checks"] if c["verdict"] == "fail"]
    inconclusive = [c["name"] for c in data["checks"] if c["verdict"] == "inconclusive"]
    named = next((c for c in data["checks"] if c["name"] == want), None)
    return {"target": name, "dtype": dtype, "exit": code, "expected": want or "-",
            "failed": ", ".join(failed) or "-", "inconclusive": ", ".join(inconclusive) or "-",
            "ratio": named["value"] if named else None, "threshold": named["threshold"] if named else None,
            "reason": data["fatal"] or (named["reason"] if named else ""), "wall": wall}


def write_summary(out: Path, args, rows: list[dict], not_shown: dict) -> list[str]:
    """zoo.md from the rows so far, in the order of the runs; returns the unexpected outcomes."""
    rows = sorted(rows, key=lambda r: (r["dtype"] != "float32", r["dtype"], zoo_order(r["target"])))
    on = "" if args.device == "auto" else f", --device {args.device}"
    lines = [f"# `pitcheck validate` over tests/zoo (V={args.vocab}, D={args.dim}, {args.steps} trajectory steps{on})",
             "",
             "Generated by `scripts/studies/validate_zoo.py`. Exit 0: every check passed or was inconclusive; 1: a check "
             "failed; 2: the target could not be imported, built or run. `check` is the check that exists to "
             "catch the module's bug (tests/zoo/__init__.py); `ratio` is that check's worst normalised error "
             "(threshold 16).", "",
             "| dtype | target | exit | check | ratio | failed | inconclusive | reason | wall s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = "-" if r["ratio"] is None else (r["ratio"] if isinstance(r["ratio"], str) else f"{r['ratio']:.3g}")
        # a timeout's reason ends with the slowest phases: kept whole
        reason = r["reason"] if "timed out" in r["reason"] else r["reason"][:140]
        exit_ = "-" if r["exit"] is None else r["exit"]
        lines.append(f"| {r['dtype']} | {r['target']} | {exit_} | {r['expected']} | {ratio} | {r['failed']} | "
                     f"{r['inconclusive']} | {reason.replace('|', chr(92) + '|')} | {r['wall']:.1f} |")
    unexpected = [f"{r['dtype']} {r['target']}: exit {r['exit']}, failed {r['failed']} ({r['reason'][:300]})"
                  for r in rows if r["exit"] is not None and not outcome_as_expected(r, not_shown)]
    shown = [(r["dtype"], r["target"]) for r in rows if (r["dtype"], r["target"]) in not_shown]
    if shown:
        lines += ["", "Broken modules that pass, and why: " + "; ".join(
            f"{name} in {dtype}: {not_shown[dtype, name]}" for dtype, name in shown) + "."]
    from tests.zoo import CAUGHT_IN
    elsewhere = [(r["dtype"], r["target"]) for r in rows if (r["dtype"], r["target"]) in CAUGHT_IN]
    if elsewhere:
        lines += ["", "Broken modules caught by another check than the one meant for them, and why: " + "; ".join(
            f"{name} in {dtype} by {CAUGHT_IN[dtype, name][0]}: {CAUGHT_IN[dtype, name][1]}"
            for dtype, name in elsewhere) + "."]
    skipped = [f"{r['dtype']} {r['target']} ({r['reason']})" for r in rows if r["exit"] is None]
    if skipped:
        lines += ["", "Skipped: " + "; ".join(skipped) + "."]
    lines += ["", "Unexpected outcomes: " + ("; ".join(unexpected) if unexpected else "none") + "."]
    tmp = out / "zoo.md.tmp"
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(out / "zoo.md")
    return unexpected


def zoo_order(name: str) -> int:
    names = zoo_names()
    return names.index(name) if name in names else len(names)


def outcome_as_expected(row: dict, not_shown: dict) -> bool:
    """Correct modules exit 0; broken ones fail their check (exit 1) unless the dtype cannot show the bug;
    hanging, aborting and unimportable targets exit 2."""
    name, dtype = row["target"], row["dtype"]
    if name in PROCESS_FAILURES:
        return row["exit"] == 2
    if name.startswith("correct_"):
        return row["exit"] == 0
    if (dtype, name) in not_shown:
        return row["exit"] == 0
    return row["exit"] == 1 and row["expected"] in row["failed"].split(", ")


if __name__ == "__main__":
    sys.exit(main())
