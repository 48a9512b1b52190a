"""A sweep's verdict: per precision, the recommended retraction and why, the unsafe and the inconclusive
ones; and the rows where T, not Z, was the problem."""
from __future__ import annotations

import math

from .summary import median
from ..heads import get_head

# beyond this cond(T) the head's solves lose all of fp32's digits: T, not Z, is then the problem
UNSTABLE_COND_T = 1e8
# growth exponents below this are bounded error; at or above it the error grows without bound
BOUNDED_GROWTH = 0.25
# a retraction whose final error is within this factor of the best one's is as accurate; the cheapest wins
ACCURACY_TIE = 2.0
# a format whose floor ||Q^T Q - I||_F exceeds this cannot resolve how well a retraction keeps Z orthonormal:
# every retraction sits at the floor (NVFP4-stored Z: 0.29 at 256 x 32), so no recommendation is made
RESOLVABLE_FLOOR = 0.1


def measurable(row: dict) -> bool:
    """Whether the row's growth could be measured: a finite exponent with a finite error (too few recorded
    steps past sqrt(N) give neither, and a row that may grow like k^1 must not pass for bounded)."""
    return math.isfinite(row["growth_exponent"]) and math.isfinite(row["growth_exponent_err"])


def judge(row: dict) -> tuple[bool, str]:
    """(unsafe, why) for one summary row."""
    reasons = []
    z_breakdowns = row["breakdowns"] - row.get("breakdowns_T", 0)
    if z_breakdowns:
        reasons.append(f"Z broke down in {z_breakdowns} of {row['seeds']} seeds")
    if row.get("failed_retractions"):
        reasons.append(f"the retraction failed in {row['failed_retractions']} steps (skipped)")
    g = row["growth_exponent"]
    if math.isfinite(g) and g >= BOUNDED_GROWTH:
        reasons.append(f"error grows like k^{g:.2f}: {row['error_over_floor']:.2g}x the floor at step {row['steps']}")
    if not math.isfinite(row["final_orthonormality"]):
        reasons.append("non-finite error")
    return bool(reasons), "; ".join(reasons)


def verdicts(rows: list[dict]) -> list[dict]:
    """Per precision: the recommended retraction and why, the unsafe combinations and the inconclusive ones.

    A retraction is unsafe in a precision when, in any row of that precision (adversary, head, shape...),
    it broke down or its error grows (growth exponent >= BOUNDED_GROWTH). It is inconclusive, never safe,
    when it is not unsafe but some row's growth could not be measured (too few recorded steps). Among the
    safe ones its error is its worst final ||Z^T Z - I||_F / floor over those rows; the most accurate wins,
    unless a cheaper one is within ACCURACY_TIE of its error, in which case the cheapest of those wins.
    """
    out = []
    precisions = list(dict.fromkeys(r["precision"] for r in rows))
    for p in precisions:
        prow = [r for r in rows if r["precision"] == p and get_head(r["head"]).has_retraction]
        by_ret: dict[str, list[dict]] = {}
        for r in prow:
            by_ret.setdefault(r["retraction"], []).append(r)
        unsafe, safe, inconclusive = [], [], []
        for ret, rs in by_ret.items():
            bad = [(r, why) for r in rs for bad_, why in [judge(r)] if bad_]
            unmeasured = [r for r in rs if not measurable(r)]
            if bad:
                r, why = max(bad, key=lambda b: b[0]["growth_exponent"] if math.isfinite(b[0]["growth_exponent"])
                             else math.inf)
                where = f" ({r['adversary']})" if len({x['adversary'] for x in rs}) > 1 else ""
                unsafe.append({"retraction": ret, "why": why + where})
            elif unmeasured:
                r = unmeasured[0]
                where = f" ({r['adversary']})" if len({x['adversary'] for x in rs}) > 1 else ""
                inconclusive.append({"retraction": ret, "why": "growth exponent not measurable (too few recorded "
                                     f"steps between sqrt(N) and N = {r['steps']}: give more steps){where}"})
            else:
                worst = max(rs, key=lambda r: r["error_over_floor"])
                safe.append({"retraction": ret, "ratio": worst["error_over_floor"], "row": worst,
                             "growth": max(r["growth_exponent"] for r in rs),
                             "growth_err": max(r["growth_exponent_err"] for r in rs),
                             "ms": median(r["ms_per_step"] for r in rs)})
        best = None
        if safe:
            top = min(s["ratio"] for s in safe)
            tied = [s for s in safe if s["ratio"] <= ACCURACY_TIE * top]
            best = min(tied, key=lambda s: (s["ms"] if math.isfinite(s["ms"]) else math.inf, s["ratio"]))
            best["because"] = ("the most accurate" if best["ratio"] == top and len(tied) == 1 else
                               "the most accurate, and the cheapest of those within "
                               f"{ACCURACY_TIE:g}x of it" if best["ratio"] == top else
                               f"within {ACCURACY_TIE:g}x of the most accurate and the cheapest of those")
        floor = max((r["floor"] for r in prow), default=0.0)
        unresolved = floor > RESOLVABLE_FLOOR
        out.append({"precision": p, "best": None if unresolved else best, "safe": safe, "unsafe": unsafe,
                    "inconclusive": inconclusive, "judged": bool(by_ret), "floor": floor, "unresolved": unresolved})
    return out


def t_instability_lines(rows: list[dict]) -> list[str]:
    """Rows where T, not Z, failed: cond(T) beyond UNSTABLE_COND_T or L's diagonal reached 0. These come
    from the gradient model and learning rate, so they are reported apart from the retractions."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if get_head(r["head"]).has_retraction and (r.get("breakdowns_T") or r["max_cond_T"] > UNSTABLE_COND_T):
            groups.setdefault((r["adversary"], r["optimizer"], r["lr"]), []).append(r)
    lines = []
    for (adv, opt, lr), rs in groups.items():
        seeds = sum(r["seeds"] for r in rs)
        broke = sum(r.get("breakdowns_T", 0) for r in rs)
        worst = max(r["max_cond_T"] for r in rs)
        lines.append(f"- T, not Z, is unstable under {adv} with {opt} lr={lr:g}: cond(T) reached {worst:.1e} in "
                     f"{len(rs)} rows, and L's diagonal reached 0 (T singular, run ended) in {broke} of {seeds} "
                     "runs, whichever the retraction; gradient overflows and skipped steps in these rows follow "
                     "from it. Their Z errors are still comparable; their pinv drift is not.")
    return lines


def verdict_lines(rows: list[dict]) -> list[str]:
    lines = ["| precision | recommended | why | unsafe |", "|---|---|---|---|"]
    for v in verdicts(rows):
        b = v["best"]
        if b:
            why = (f"{b['because']}: error {b['ratio']:.2g}x the storage floor, growth exponent "
                   f"{b['growth']:+.2f} ± {b['growth_err']:.2f}, {b['ms']:.3g} ms/step")
            rec = f"**{b['retraction']}**"
        elif v["unresolved"]:
            rec, why = "none", (f"inconclusive: the format's floor {v['floor']:.2g} > {RESOLVABLE_FLOOR:g} "
                                "cannot resolve which retraction keeps Z closer (every error is at the floor)")
        elif not v["judged"]:
            rec, why = "none", "no retraction to judge: only the baseline heads (tied, untied), which have none"
        elif v["inconclusive"]:
            rec, why = "none", ("inconclusive: no retraction was shown safe; "
                                + "; ".join(f"{u['retraction']}: {u['why']}" for u in v["inconclusive"]))
        else:
            rec, why = "none", "every retraction tried is unsafe here"
        unsafe = "; ".join(f"{u['retraction']} ({u['why']})" for u in v["unsafe"]) or "none"
        if b and v["inconclusive"]:
            why += "; not judged: " + "; ".join(f"{u['retraction']} ({u['why']})" for u in v["inconclusive"])
        lines.append(f"| {v['precision']} | {rec} | {why} | {unsafe} |")
    return lines


