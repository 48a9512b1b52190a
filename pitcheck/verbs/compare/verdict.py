"""A sweep's verdict: per precision, the recommended retraction and why, the unsafe and the inconclusive
ones, the rows it cannot judge (a run ended because T blew up, whichever the retraction); and the rows where
T, not Z, was the problem."""
from __future__ import annotations

import math

from .summary import RESOLVABLE_COND_U, median
from ...trajectory.plan import head_named, policy_named

# beyond this cond(T) the head's solves lose all of fp32's digits: T, not Z, is then the problem
UNSTABLE_COND_T = 1e8
# growth exponents below this are bounded error; at or above it the error grows without bound
BOUNDED_GROWTH = 0.25
# the two growth models the exponent tells apart, bounded error and a random walk: a call on either side of
# BOUNDED_GROWTH stands only where the exponent's interval of GROWTH_SIGMAS standard errors excludes the other
BOUNDED, RANDOM_WALK = 0.0, 0.5
GROWTH_SIGMAS = 2.0
# a retraction whose final error is within this factor of the best one's is as accurate; the cheapest wins
ACCURACY_TIE = 2.0
# a format whose floor ||Q^T Q - I||_F exceeds this cannot resolve how well a retraction keeps Z orthonormal:
# every retraction sits at the floor (NVFP4-stored Z: 0.29 at 256 x 32), so no recommendation is made
RESOLVABLE_FLOOR = 0.1


def measurable(row: dict) -> bool:
    """Whether the row's growth could be measured: a finite exponent with a finite error (too few recorded
    steps past sqrt(N) give neither, and a row that may grow like k^1 must not pass for bounded)."""
    return math.isfinite(row["growth_exponent"]) and math.isfinite(row["growth_exponent_err"])


def growth_resolved(row: dict) -> bool:
    """Whether the measured exponent tells bounded error from a random walk: below BOUNDED_GROWTH it must
    exclude RANDOM_WALK, at or above it BOUNDED, at GROWTH_SIGMAS standard errors (a short run's +0.27 ± 0.14
    is either)."""
    g, err = row["growth_exponent"], row["growth_exponent_err"]
    if g >= BOUNDED_GROWTH:
        return g - GROWTH_SIGMAS * err > BOUNDED
    return g + GROWTH_SIGMAS * err < RANDOM_WALK


def copy_hides_master(row: dict) -> bool:
    """Whether the row's Z, as the model computes with it, is an 8- or 4-bit copy of the master the retraction
    keeps, with the error at that copy's floor: the copy's rounding then hides the master's drift (Cayley's
    k^0.5 in fp32 reads +0.01 under an E4M3 copy)."""
    placement = policy_named(row["precision"]).placement
    return (bool(placement and placement.z_copy) and row["error_over_floor"] < ACCURACY_TIE
            and not row["growth_exponent"] >= BOUNDED_GROWTH)  # a growth that shows through it is judged


def unresolved_growth(row: dict) -> str | None:
    """Why the row's growth cannot judge its retraction, or None where it can."""
    if copy_hides_master(row):
        master = policy_named(row["precision"]).master
        return (f"error within {ACCURACY_TIE:g}x the floor of Z's 8- or 4-bit copy, whose rounding hides the "
                f"{master} master's drift: its growth is judged in {master}")
    if not measurable(row):
        return ("growth exponent not measurable (too few recorded steps between sqrt(N) and "
                f"N = {row['steps']}: give more steps)")
    if not growth_resolved(row):
        return (f"growth exponent {row['growth_exponent']:+.2f} ± {row['growth_exponent_err']:.2f} cannot tell "
                f"bounded error ({BOUNDED:g}) from a random walk ({RANDOM_WALK:g}) at {GROWTH_SIGMAS:g} standard "
                "errors: give more steps or seeds")
    return None


def own_breakdowns(row: dict) -> int:
    """The row's breakdowns counted against its retraction (summary.breakdown_cause: Z broke while T was still
    resolvable, and not under every retraction); a row read from an older summary: every one not T's."""
    return row.get("breakdowns_own", row["breakdowns"] - row.get("breakdowns_T", 0))


def not_judged(row: dict) -> int:
    """Seeds of the row whose run is no judgement of its retraction (summary.judge_cells: it ended in a
    breakdown not its own, or T blew up under every retraction); a row read from an older summary: its T
    breakdowns."""
    return row.get("not_judged", row["breakdowns"] - own_breakdowns(row))


def judgeable(row: dict) -> bool:
    """Whether the row's error and growth judge its retraction: not when a seed's run is no judgement of it
    (it stopped early, or T blew up, for reasons any retraction would have had)."""
    return not_judged(row) == 0


def judge(row: dict) -> tuple[bool, str]:
    """(unsafe, why) for one summary row: the retraction's own failures (its Z breakdowns; steps it failed in
    the runs that judge it) always count; the error's growth only in a row that can judge it (judgeable)."""
    reasons = []
    own = own_breakdowns(row)
    if own:
        reasons.append(f"Z broke down in {own} of {row['seeds']} seeds")
    failed = row.get("failed_retractions_judged", row.get("failed_retractions", 0))
    if failed:
        reasons.append(f"the retraction failed in {failed} steps (skipped)")
    if judgeable(row):
        g = row["growth_exponent"]
        if unresolved_growth(row) is None and g >= BOUNDED_GROWTH:
            reasons.append(f"error grows like k^{g:.2f}: {row['error_over_floor']:.2g}x the floor at step {row['steps']}")
        if not math.isfinite(row["final_orthonormality"]):
            reasons.append("non-finite error")
    return bool(reasons), "; ".join(reasons)


NOT_JUDGED = "T blew up whichever the retraction: not a judgement of the retraction"


def where(row: dict, rows: list[dict]) -> str:
    """The row among `rows` in words: its gradient model, and every other axis but the retraction and
    precision that varies among them."""
    parts = [row["adversary"]]
    for key, text in (("optimizer", "{}"), ("lr", "lr={:g}"), ("head", "head {}"), ("shards", "{} shards")):
        if len({r.get(key) for r in rows}) > 1:
            parts.append(text.format(row.get(key)))
    if len({(r.get("vocab"), r.get("dim")) for r in rows}) > 1:
        parts.append(f"{row['vocab']}x{row['dim']}")
    return ", ".join(parts)


def verdicts(rows: list[dict]) -> list[dict]:
    """Per precision: the recommended retraction and why, the unsafe combinations, the inconclusive ones and
    the rows not judged.

    A retraction is unsafe in a precision when, in any row of that precision (adversary, head, shape...),
    it failed by itself (summary.breakdown_cause: Z broke down while T was resolvable and not under every
    retraction; or the retraction failed steps in a run that judges it) or, in a row that can judge it, its error grows (growth
    exponent >= BOUNDED_GROWTH). A row where a seed's run is no judgement of the retraction (it ended in a
    breakdown not its own, or T blew up under every retraction: summary.judge_cells) is not judged (listed in
    "not_judged"), neither for nor against it. A retraction is inconclusive, never
    safe, when it is not unsafe but some judged row's growth could not be measured (too few recorded steps)
    or cannot tell bounded error from a random walk (growth_resolved); an unresolved exponent makes no
    retraction unsafe either. It is not judged when no row of it can be. Among the safe ones its error is its worst final
    ||Z^T Z - I||_F / floor over its judged rows; the most accurate wins, unless a cheaper one is within
    ACCURACY_TIE of its error, in which case the cheapest of those wins.
    """
    out = []
    precisions = list(dict.fromkeys(r["precision"] for r in rows))
    for p in precisions:
        prow = [r for r in rows if r["precision"] == p and head_named(r["head"]).has_retraction]
        by_ret: dict[str, list[dict]] = {}
        for r in prow:
            by_ret.setdefault(r["retraction"], []).append(r)
        unsafe, safe, inconclusive, unjudged = [], [], [], []
        for ret, all_rs in by_ret.items():
            rs = [r for r in all_rs if judgeable(r)]
            bad = [(r, why) for r in all_rs for bad_, why in [judge(r)] if bad_]
            unmeasured = [r for r in rs if unresolved_growth(r)]
            if bad:
                r, why = max(bad, key=lambda b: b[0]["growth_exponent"] if math.isfinite(b[0]["growth_exponent"])
                             else math.inf)
                # the worst row, and how many of the retraction's rows are unsafe, so that one named row is
                # not read as the only one
                at = where(r, prow) if len(all_rs) > 1 else ""
                if len(bad) > 1:
                    at += f"; unsafe in {len(bad)} of its {len(all_rs)} rows"
                unsafe.append({"retraction": ret, "why": why + (f" ({at})" if at else "")})
                continue
            unjudged += [{"retraction": ret, "where": where(r, prow), "seeds": r["seeds"], "of": not_judged(r)}
                         for r in all_rs if not judgeable(r)]
            if unmeasured:
                r = unmeasured[0]
                at = f" ({r['adversary']})" if len({x['adversary'] for x in all_rs}) > 1 else ""
                inconclusive.append({"retraction": ret, "why": unresolved_growth(r) + at})
            elif rs:
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
                    "inconclusive": inconclusive, "not_judged": unjudged, "judged": bool(by_ret), "floor": floor,
                    "unresolved": unresolved})
    return out


def t_blew_up(row: dict) -> bool:
    """Whether T blew up in the row: beyond UNSTABLE_COND_T, or beyond what its precision's solves resolve."""
    return (row["max_cond_T"] > UNSTABLE_COND_T
            or row["max_cond_T"] * policy_named(row["precision"]).solve_u > RESOLVABLE_COND_U)


def t_instability_lines(rows: list[dict]) -> list[str]:
    """Rows where T, not Z, failed: cond(T) beyond UNSTABLE_COND_T, or a run ended in a breakdown that was not
    the retraction's. These come from the gradient model and learning rate, so they are reported apart from
    the retractions."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if head_named(r["head"]).has_retraction and (not judgeable(r) or r["max_cond_T"] > UNSTABLE_COND_T):
            groups.setdefault((r["adversary"], r["optimizer"], r["lr"]), []).append(r)
    lines = []
    for (adv, opt, lr), rs in groups.items():
        seeds = sum(r["seeds"] for r in rs)
        broke = sum(r.get("breakdowns_T", 0) for r in rs)
        after = sum(r["breakdowns"] - own_breakdowns(r) for r in rs) - broke
        worst = max(r["max_cond_T"] for r in rs)
        if not broke and after and not any(t_blew_up(r) for r in rs):
            # T stayed resolvable: the runs not judged are those where Z broke down under every retraction
            lines.append(f"- Z broke down under every retraction under {adv} with {opt} lr={lr:g} in {after} of "
                         f"{seeds} runs, while cond(T) stayed at most {worst:.2g}: the gradient model and learning "
                         "rate's doing, not a retraction's, so these breakdowns are counted against none and the "
                         "rows they ended are not judged.")
            continue
        also = (f"; Z broke down after cond(T) u passed {RESOLVABLE_COND_U:g}, or under every retraction, in "
                f"{after} more" if after else "")
        lines.append(f"- T, not Z, is unstable under {adv} with {opt} lr={lr:g}: cond(T) reached {worst:.1e} in "
                     f"{len(rs)} rows, and T or its factor L broke down (L's diagonal at 0 or non-finite: run "
                     f"ended) in {broke} of {seeds} runs, whichever the retraction{also}. These breakdowns are not "
                     "counted against any retraction, and the rows they ended are not judged (nor those where T blew "
                     "up under every retraction); gradient overflows and skipped steps in these rows follow from T. "
                     "Where T stayed resolvable under some retraction, the Z errors are still comparable; the pinv "
                     "drift is not.")
    return lines


def verdict_lines(rows: list[dict]) -> list[str]:
    lines = ["| precision | recommended | why | unsafe | not judged |", "|---|---|---|---|---|"]
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
            rec, why = "none", "inconclusive: no retraction was shown safe; " + grouped(v["inconclusive"])
        elif v["not_judged"] and not v["unsafe"]:
            rec, why = "none", f"no row could be judged ({NOT_JUDGED})"
        elif v["not_judged"]:
            rec, why = "none", "every retraction tried is unsafe or could not be judged here"
        else:
            rec, why = "none", "every retraction tried is unsafe here"
        unsafe = "; ".join(f"{u['retraction']} ({u['why']})" for u in v["unsafe"]) or "none"
        if b and v["inconclusive"]:
            why += "; inconclusive: " + grouped(v["inconclusive"])
        lines.append(f"| {v['precision']} | {rec} | {why} | {unsafe} | {not_judged_text(v['not_judged'])} |")
    return lines


def grouped(entries: list[dict]) -> str:
    """Retractions with their reasons, those that share one named together before it."""
    reasons: dict[str, list[str]] = {}
    for e in entries:
        reasons.setdefault(e["why"], []).append(e["retraction"])
    return "; ".join(f"{', '.join(rets)}: {why}" for why, rets in reasons.items())


def not_judged_text(entries: list[dict]) -> str:
    """The rows not judged, as one table cell: each retraction with where and in how many seeds its runs ended,
    then why once."""
    if not entries:
        return "none"
    listed = "; ".join(f"{e['retraction']} ({e['where']}, {e['of']} of {e['seeds']} seeds)" for e in entries)
    return f"{listed}: {NOT_JUDGED}"
