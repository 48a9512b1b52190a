"""The validator's judging (pitcheck.verbs.validate.checks) on synthetic probes whose answer is known, without a
target process (fast, small arrays).

Two kinds of case: whole checks on generic PIT pairs as a target in float32 or bfloat16 returns them
(V = 256), which must fail a pair built to be wrong and pass one built to be right; and each check at its
documented boundary (TAU, RESOLVABLE, u = 2^-p and not eps, the scale check's fmax / 64 and tiny / u, the
ladder's rungs; V = 64), where the verdict, the measured ratio or the value in the reason is asserted with
tolerances far below any change of a constant, norm or operator (see scripts/dev/mutation/).
"""
import dataclasses
import json
import math

import numpy as np
import pytest

from pitcheck.numerics import reference
from pitcheck.verbs.validate import TAU, checks
from pitcheck.verbs.validate.checks import Context, Verdicts
from pitcheck.verbs.validate import probes
from pitcheck.verbs.validate.probes import Probe
from tests.helpers import orthonormal, pit_pair

V, D = 64, 8
U32, U64, UBF = 2.0**-24, 2.0**-53, 2.0**-8
FP32 = Context("float32", U32, V, D)
FP64 = Context("float64", U64, V, D)
BF16 = Context("bfloat16", UBF, V, D)
UNIT32 = U32 * (1 + math.sqrt(D))  # FP32.unit(1): u + sqrt(D) u


def maps(cond=10.0, seed=0, one_solve=False):
    """E and W of an exact float64 PIT pair."""
    Z, L = pit_pair(V, D, cond, seed)
    if one_solve:
        import scipy.linalg

        E = scipy.linalg.solve_triangular(L, Z.T, lower=True, trans="T").T
    else:
        E = reference.embedding_matrix(Z, L)
    return E, reference.head_matrix(Z, L)


def probe_of(*states, **facts):
    p = Probe(facts=dict(facts))
    for label, (E, W), *extra in states:
        p.add_state(label, E, W, **(extra[0] if extra else {}))
    return p


def rows_of(result, state):
    return [d for d in result.details if d.get("state") == state]


VW = 256  # a wider vocabulary for the whole-check cases on generic pairs
FP32W = Context("float32", 2.0**-24, VW, D)
BF16W = Context("bfloat16", 2.0**-8, VW, D)


def rounded(x, dtype):
    import torch

    return torch.from_numpy(np.asarray(x, dtype=np.float64)).to(getattr(torch, dtype)).double().numpy()


def rounded_maps(cond=10.0, dtype="float32", seed=0, one_solve=False, stretch=0.0):
    """E and W of a PIT pair as a target in `dtype` would return them (float64 values rounded)."""
    Z, L = pit_pair(VW, D, cond, seed)
    Z = Z * (1.0 + stretch)
    if one_solve:
        import scipy.linalg

        E = scipy.linalg.solve_triangular(L, Z.T, lower=True, trans="T").T
    else:
        E = reference.embedding_matrix(Z, L)
    W = reference.head_matrix(Z, L)
    return rounded(E, dtype), rounded(W, dtype)


def verdict(name, probe, ctx=FP32W):
    return checks.judge(name, probe, ctx)



# ==== whole checks on generic pairs (V = 256) ==========================================================

# ---- penrose / reference / trajectory ----------------------------------------------------------

@pytest.mark.parametrize("check", ["penrose", "reference", "trajectory"])
def test_pair_checks_pass_a_correct_pair_and_fail_one_solve(check):
    # two states that differ (a trajectory whose maps never moved is inconclusive, not a pass)
    good = verdict(check, probe_of(("start", rounded_maps(cond=1.0)), ("generic", rounded_maps())))
    assert good.verdict == "pass", good.reason
    assert good.value < 4  # measured 0.1-2: a correct pair is O(1) units
    bad = verdict(check, probe_of(("start", rounded_maps(cond=1.0)), ("generic", rounded_maps(one_solve=True))))
    assert bad.verdict == "fail" and bad.value > 1e3


def test_penrose_catches_a_memory_off_the_manifold():
    result = verdict("penrose", probe_of(("init", rounded_maps(cond=1.0, stretch=1e-4))))
    assert result.verdict == "fail"
    assert verdict("penrose", probe_of(("init", rounded_maps(cond=1.0, stretch=1e-8)))).verdict == "pass"


def test_penrose_ratio_is_in_units_of_cond_u_not_eps():
    # a pair with a known W E - I: drift 2e-5 relative at cond 1 in fp32 is 2e-5 / unit
    E, W = rounded_maps(cond=1.0, dtype="float64")
    W = W * (1 + 2e-5)
    result = verdict("penrose", probe_of(("x", (E, W))))
    drift = [d for d in result.details if d["measure"].startswith("||W E - I||")][0]
    assert drift["ratio"] == pytest.approx(2e-5 * math.sqrt(D) / math.sqrt(D) / FP32W.unit(1.0), rel=1e-3)


@pytest.mark.parametrize("cond", [1.0, 1e3])
@pytest.mark.parametrize("s", [1e-3, -1e-3])
def test_memory_orthonormality_is_read_off_the_maps_whatever_t(cond, s):
    # Z (1 + s) has Z^T Z = (1 + s)^2 I: ||Z^T Z - I||_2 = |2 s + s^2|, whatever T is
    E, W = rounded_maps(cond=cond, dtype="float64", stretch=s)
    assert checks.memory_orthonormality(E, W) == pytest.approx(abs(2 * s + s * s), rel=1e-6)


def test_interface_reports_the_worst_penrose_condition():
    from pitcheck.numerics import metrics

    E, W = rounded_maps(cond=10.0, dtype="float64", one_solve=True)
    pen = metrics.penrose_residuals(E, W.T)
    assert max(pen.values()) > 1.5 * min(pen.values())
    assert checks.interface(E, W)["penrose"] == max(pen.values())


def test_reference_ratio_is_the_forward_error_in_units_of_cond():
    # E off by a relative 1e-5 from the exact pseudo-inverse of W: the forward error 1e-5 over unit(cond)
    cond, delta = 100.0, 1e-5
    E, W = rounded_maps(cond=cond, dtype="float64")
    result = verdict("reference", probe_of(("x", (E * (1 + delta), W))))
    row = result.details[0]
    assert row["raw"] == pytest.approx(delta, rel=1e-6)
    assert row["ratio"] == pytest.approx(delta / FP32W.unit(row["cond_T"]), rel=1e-6)
    assert row["cond_T"] == pytest.approx(cond, rel=1e-6)


@pytest.mark.parametrize("cond", [1e4, 1e6])
def test_reference_passes_a_correct_float64_pair_at_high_cond(cond):
    # the reference is rebuilt from W without squaring cond(T): through W W^T a correct pair at 1e4
    # measured 214 units, far above TAU, and at 1e6 the reference alone is wrong in every digit
    E, W = maps(cond=cond, seed=3)
    result = verdict("reference", probe_of(("x", (E, W))), FP64)
    assert result.verdict == "pass", result.reason
    assert result.value < 2


def test_memory_from_maps_recovers_the_memory_at_high_cond():
    Z, L = pit_pair(V, D, 1e6, seed=3)
    got = checks.memory_from_maps(reference.embedding_matrix(Z, L), reference.head_matrix(Z, L))
    assert np.linalg.norm(got - Z) / np.linalg.norm(Z) < 1e6 * 64 * U64


def test_trajectory_catches_drift_that_appears_after_steps():
    states = [(f"step {k}", rounded_maps(cond=1.0, stretch=s)) for k, s in ((0, 0.0), (10, 1e-6), (100, 1e-3))]
    result = verdict("trajectory", probe_of(*states))
    assert result.verdict == "fail" and "step 100" in result.reason and "step 0" not in result.reason


def test_bf16_cannot_resolve_a_badly_conditioned_pair():
    result = verdict("penrose", probe_of(("generic", rounded_maps(cond=1e3, dtype="bfloat16"))), BF16W)
    assert result.verdict == "inconclusive" and "cannot resolve" in result.reason
    assert verdict("penrose", probe_of(("init", rounded_maps(cond=1.0, dtype="bfloat16"))), BF16W).verdict == "pass"


def test_singular_maps_fail_rather_than_being_unresolvable():
    # all-zero maps: cond(T) is infinite, so every unit is; that is a singular T, not a hard question
    zeros = (np.zeros((VW, D)), np.zeros((D, VW)))
    for check in ("penrose", "trajectory"):
        result = verdict(check, probe_of(("a", zeros), ("b", rounded_maps())))
        assert result.verdict == "fail" and "rank deficient" in result.reason


def test_trajectory_that_never_moved_is_inconclusive():
    E, W = rounded_maps()
    result = verdict("trajectory", probe_of(("step 0", (E, W)), ("step 20", (E.copy(), W.copy()))))
    assert result.verdict == "inconclusive" and "did not change" in result.reason
    assert verdict("trajectory", probe_of(("step 0", (E, W)))).verdict == "inconclusive"


def with_shadow(probe, shadows):
    """The float64 build's maps beside each named state (as the penrose and trajectory probes record them)."""
    for label, (E, W) in shadows.items():
        probe.arrays[f"E64:{label}"], probe.arrays[f"W64:{label}"] = E, W
    return probe


def shadowed(check, delta, ctx=BF16W):
    """bfloat16 maps of an exact pair at cond 1 (a pass in bfloat16) beside a float64 build whose head is
    (1 + delta) times the exact one: W E - I = delta I, so its penrose residual, ||W E - I||_F / sqrt(D) and
    max |eig(W E) - 1| are all delta."""
    E, W = rounded_maps(cond=1.0, dtype="float64")
    own = [("step 0", rounded_maps(cond=1.0, dtype="bfloat16")), ("step 40", rounded_maps(cond=1.0, dtype="bfloat16", seed=1))]
    probe = probe_of(*own)
    return verdict(check, with_shadow(probe, {"step 40": (E, W * (1 + delta))}), ctx)


FINE = Context("float32", U32, VW, D).unit(1.0)  # the float64 build is judged in float32 units


@pytest.mark.parametrize("check", ["penrose", "trajectory"])
def test_a_half_precision_pass_fails_where_the_float64_build_shows_a_defect(check):
    # the boundary: TAU float32 units of the float64 build's error (3.7e-6 at cond 1), far below bfloat16's unit
    below, above = shadowed(check, 0.9 * TAU * FINE), shadowed(check, 1.1 * TAU * FINE)
    assert below.verdict == "pass", below.reason
    assert above.verdict == "fail" and "step 40: the float64 build of the target" in above.reason
    assert "a defect of the code" in above.reason
    rows = [d for d in above.details if d["measure"].startswith("float64 build:")]
    assert len(rows) == 3 and all(d["ratio_build_units"] == pytest.approx(1.1 * TAU, rel=1e-3) for d in rows)
    # no ratio of bfloat16's own beside the failure: its passing value would read as the failure's size
    assert above.value is None and below.value < 4
    # a defect of a few percent (2.5 bfloat16 units, as broken_no_retraction at 40 steps): a failure too
    assert shadowed(check, 0.01).verdict == "fail"


def test_the_float64_build_does_not_judge_float32_or_hide_a_failure():
    # float32 judges its own maps in the same units: the float64 build adds nothing (and is not consulted)
    E, W = rounded_maps(cond=1.0, dtype="float64")
    ok = probe_of(("step 0", rounded_maps(cond=1.0)), ("step 40", rounded_maps(cond=1.0, seed=1)))
    result = verdict("trajectory", with_shadow(ok, {"step 40": (E, W * 1.01)}))
    assert result.verdict == "pass" and not [d for d in result.details if "float64 build" in d.get("measure", "")]
    # bfloat16's own failure is the one its reason names
    bad = probe_of(("step 0", rounded_maps(cond=1.0, dtype="bfloat16")),
                   ("step 40", rounded_maps(cond=1.0, dtype="bfloat16", stretch=0.1)))
    result = verdict("trajectory", with_shadow(bad, {"step 40": (E, W * 1.01)}), BF16W)
    assert result.verdict == "fail" and "float64 build" not in result.reason
    # non-finite float64 maps beside finite bfloat16 ones: not a pass
    nan = probe_of(("step 0", rounded_maps(cond=1.0, dtype="bfloat16")), ("step 40", rounded_maps(cond=1.0, dtype="bfloat16", seed=1)))
    result = verdict("trajectory", with_shadow(nan, {"step 40": (E * np.nan, W)}), BF16W)
    assert result.verdict == "inconclusive" and "non-finite" in result.reason


@pytest.mark.parametrize("storage,expected", [("bfloat16", "pass"), ("float16", "fail"),
                                              ("float16-small", "pass")])
def test_the_float64_build_is_judged_in_units_of_the_coarsest_dtype_it_stores(storage, expected):
    # a build asked for float64 that keeps Z in bfloat16 (broken_bf16_storage) rounds as a bfloat16 request
    # does: under bfloat16 it is not consulted; one keeping float16 is judged in float16 units (u = 2^-11)
    delta = 0.01 if storage != "float16-small" else 0.9 * TAU * Context("float16", 2.0**-11, VW, D).unit(1.0)
    E, W = rounded_maps(cond=1.0, dtype="float64")
    probe = probe_of(("step 0", rounded_maps(cond=1.0, dtype="bfloat16")),
                     ("step 40", rounded_maps(cond=1.0, dtype="bfloat16", seed=1)))
    probe.facts["shadow_storage"] = storage.split("-")[0]
    result = verdict("trajectory", with_shadow(probe, {"step 40": (E, W * (1 + delta))}), BF16W)
    assert result.verdict == expected, result.reason
    if storage == "bfloat16":
        assert "not consulted: it stores bfloat16" in [d.get("reason") for d in result.details]
    else:
        rows = [d for d in result.details if "ratio_build_units" in d]
        assert rows and {d["build_units"] for d in rows} == {"float16"}


def test_non_finite_maps_fail():
    E, W = rounded_maps()
    E[3, 1] = np.nan
    assert verdict("penrose", probe_of(("x", (E, W)))).verdict == "fail"


# ---- contract ------------------------------------------------------------------------------------

def values_contract_probe(dtype_values, out_dtype="float32", tensor_dtype="float32"):
    E, W = rounded_maps(dtype=dtype_values)
    return probe_of(("init", (E, W)), ("generic", (E, W)),
                    embed={"shape": [2, 3, D], "dtype": out_dtype}, logits={"shape": [2, 3, VW], "dtype": out_dtype},
                    tensors=[{"name": "Z", "dtype": tensor_dtype, "kind": "parameter"}])


def test_contract_passes_float32_values_and_fails_bfloat16_ones():
    assert verdict("contract", values_contract_probe("float32")).verdict == "pass"
    bad = verdict("contract", values_contract_probe("bfloat16"))
    assert bad.verdict == "fail" and "bfloat16" in bad.reason


def test_contract_fails_narrow_storage_and_wrong_output_dtype():
    assert "stored in bfloat16" in verdict("contract", values_contract_probe("float32", tensor_dtype="bfloat16")).reason
    assert "returned float16" in verdict("contract", values_contract_probe("float32", out_dtype="float16")).reason


def test_contract_sees_float32_arithmetic_under_a_float64_request():
    ctx = Context("float64", 2.0**-53, VW, D)
    ok = values_contract_probe("float64", out_dtype="float64", tensor_dtype="float64")
    assert verdict("contract", ok, ctx).verdict == "pass"
    bad = values_contract_probe("float32", out_dtype="float64", tensor_dtype="float64")
    assert "float32" in verdict("contract", bad, ctx).reason


# ---- conditioning --------------------------------------------------------------------------------

def test_conditioning_fails_a_silently_singular_state_and_passes_a_ladder():
    ladder = checks.conditioning_ladder(FP32W)
    assert ladder[-1] >= 1e4 and TAU * FP32W.unit(ladder[-1]) <= checks.RESOLVABLE
    good = [(f"cond {c:.0e}", rounded_maps(cond=c)) for c in ladder]
    p = probe_of(*good)
    assert verdict("conditioning", p).verdict == "pass"
    E, W = rounded_maps(cond=1.0)
    p.add_state("zeroed L", np.full_like(E, np.inf), W, attack="L")
    result = verdict("conditioning", p)
    assert result.verdict == "fail" and "singular" in result.reason


def test_conditioning_is_inconclusive_when_the_module_cannot_reach_the_ladder():
    result = verdict("conditioning", probe_of(("cond 1e+02", rounded_maps(cond=3.0))))
    assert result.verdict == "inconclusive" and "short of" in result.reason


def test_conditioning_sees_a_head_that_dropped_a_direction():
    # a pinv head with a cutoff: W loses E's smallest singular direction, so W E has an eigenvalue 0
    E, _ = rounded_maps(cond=1e4, dtype="float64")
    U, s, Vt = np.linalg.svd(E, full_matrices=False)
    s_inv = np.where(s > s[0] * 1e-3, 1 / s, 0.0)
    W = (Vt.T * s_inv) @ U.T
    result = verdict("conditioning", probe_of(("cond 1e+04", (E, W))))
    assert result.verdict == "fail"


# ---- gradients, checkpoint, bad_input, scale -----------------------------------------------------

@pytest.mark.parametrize("error,expected", [(1e-12, "pass"), (1e-3, "fail")])
def test_gradients_judges_autograd_against_finite_differences(error, expected):
    p = Probe(facts={"parameters": 2, "fd_dtype": "float64", "autograd": 1.0, "finite_difference": 1.0 + error,
                     "fd_at_step": 1.0 + error, "fd_at_half_step": 1.0 + error, "loss_scale": 1.0})
    assert verdict("gradients", p, Context("float64", 2.0**-53, VW, D)).verdict == expected


def test_gradients_unit_follows_the_measured_noise_of_the_differences():
    # differences that disagree by 1e-3 between t and t/2 cannot judge an error of 1e-3, but do see 0.5
    noisy = {"parameters": 2, "fd_dtype": "float32", "autograd": 1.0, "fd_at_step": 1.0, "fd_at_half_step": 1.001,
             "loss_scale": 1.0}
    ctx = Context("float32", 2.0**-24, VW, D)
    assert verdict("gradients", Probe(facts={**noisy, "finite_difference": 1.001}), ctx).verdict == "pass"
    assert verdict("gradients", Probe(facts={**noisy, "finite_difference": 1.5}), ctx).verdict == "fail"


def test_checkpoint_requires_the_same_maps_after_a_resume():
    E, W = rounded_maps()
    same = probe_of(("before", (E, W)), ("loaded", (E, W)), ("uninterrupted after step", (E, W)),
                    ("resumed after step", (E, W)))
    assert verdict("checkpoint", same).verdict == "pass"
    E2, W2 = rounded_maps(seed=1)
    lost = probe_of(("before", (E, W)), ("loaded", (E2, W2)), ("uninterrupted after step", (E, W)),
                    ("resumed after step", (E2, W2)))
    assert verdict("checkpoint", lost).verdict == "fail"


def negative_id_probe(id_minus_one):
    rows = np.arange(2 * D, dtype=float).reshape(2, D)
    clean = np.ones((3, VW))
    p = Probe(facts={"cases": {"id -1": id_minus_one, "empty batch": {"shape": [0, D]}}})
    p.arrays.update({"rows_0_last": rows, "clean_logits": clean, "value:empty batch": np.zeros((0, D))})
    if "shape" in id_minus_one:
        p.arrays["value:id -1"] = rows.copy()
    return p


def test_bad_input_fails_a_wrapped_negative_id_and_passes_an_error():
    assert verdict("bad_input", negative_id_probe({"raised": "IndexError: id -1"})).verdict == "pass"
    wrapped = verdict("bad_input", negative_id_probe({"shape": [2, D]}))
    assert wrapped.verdict == "fail" and "wraps" in wrapped.reason


@pytest.mark.parametrize("case", ["id VW", "float ids"])
def test_bad_input_fails_finite_numbers_for_an_impossible_id(case):
    p = negative_id_probe({"raised": "IndexError"})
    p.facts["cases"][case] = {"shape": [2, D]}
    p.arrays[f"value:{case}"] = np.ones((2, D))
    result = verdict("bad_input", p)
    assert result.verdict == "fail" and f"{case} returned finite numbers" in result.reason
    p.arrays[f"value:{case}"][1] = np.nan  # NaN confined to the offending row is a clear answer
    assert verdict("bad_input", p).verdict == "pass"


def test_bad_input_requires_a_non_finite_row_to_stay_in_its_row():
    clean = np.ones((3, VW))
    spread = clean.copy()
    spread[:] = np.nan
    confined = clean.copy()
    confined[1] = np.nan
    for value, expected in ((confined, ""), (spread, "spread"), (clean, "gave finite logits")):
        p = Probe(facts={"cases": {"nan hidden row": {"shape": [3, VW]}}})
        p.arrays.update({"rows_0_last": np.zeros((2, D)), "clean_logits": clean, "value:nan hidden row": value})
        result = verdict("bad_input", p)
        assert result.verdict == ("fail" if expected else "pass") and expected in result.reason


def transform_scale_probe(transform):
    rng = np.random.default_rng(0)
    hid = rng.standard_normal((4, D))
    base = rng.standard_normal((4, VW))
    fmax, tiny = float(np.finfo(np.float32).max), float(np.finfo(np.float32).tiny)
    p = Probe(facts={"max": fmax, "tiny": tiny, "scaled": []})
    p.arrays.update({"base": base, "hidden": hid})
    for k in (-60, 0, 60, 126, 128):
        p.facts["scaled"].append({"exponent": k})
        p.arrays[f"scaled:{k}"] = transform(k, base)
    return p


def test_scale_passes_exact_scaling_and_fails_a_silent_overflow():
    def exact(k, base):
        with np.errstate(over="ignore"):
            return (base * 2.0**k).astype(np.float32).astype(np.float64)

    assert verdict("scale", transform_scale_probe(exact)).verdict == "pass"

    def overflow_at_60(k, base):
        return np.full_like(base, np.nan) if k >= 60 else exact(k, base)

    result = verdict("scale", transform_scale_probe(overflow_at_60))
    assert result.verdict == "fail" and "2^60" in result.reason

    def zeros_at(j):
        return lambda k, base: np.zeros_like(base) if k == j else exact(k, base)

    near_edge = verdict("scale", transform_scale_probe(zeros_at(126)))
    assert near_edge.verdict == "fail" and "2^126" in near_edge.reason
    assert "finite numbers" in verdict("scale", transform_scale_probe(zeros_at(128))).reason


def test_a_target_exception_fails_the_check_with_its_reason():
    result = verdict("penrose", Probe(facts={"error": "RuntimeError: boom", "where": "mine.py:3"}))
    assert result.verdict == "fail" and "boom" in result.reason and "mine.py:3" in result.reason


# ==== each check at its boundaries (V = 64) =========================================================

# ---- units, constants, CheckResult.to_json ------------------------------------------------------------

def test_unit_is_u_plus_sqrt_d_times_the_fp32_u_at_most():
    assert FP32.unit() == pytest.approx(U32 * (1 + math.sqrt(D)), rel=1e-14)
    assert FP32.unit(3.0) == pytest.approx(3 * U32 * (1 + math.sqrt(D)), rel=1e-14)
    assert FP64.unit() == pytest.approx(U64 * (1 + math.sqrt(D)), rel=1e-14)
    # a half-precision target does its factor work in fp32: the length-D term is in fp32 units
    assert BF16.unit() == pytest.approx(UBF + math.sqrt(D) * U32, rel=1e-14)
    assert Context("float16", 2.0**-11, V, 100).unit(2.0) == pytest.approx(2 * (2.0**-11 + 10 * U32), rel=1e-14)


def test_context_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        FP32.u = 1.0
    assert hash(Context("float32", U32, V, D)) == hash(FP32)


def test_generic_condition_is_ten_or_what_the_dtype_resolves():
    assert checks.generic_condition(FP32) == 10.0
    assert checks.generic_condition(BF16) == pytest.approx(0.9 * 0.1 / (16 * BF16.unit(1.0)), rel=1e-12)
    # a dtype whose limit is 10.5: the cap 10 applies, not 9 or 11
    u = 0.9 * 0.1 / (16 * 10.5) - math.sqrt(D) * U32
    assert checks.generic_condition(Context("x", u, V, D)) == 10.0
    u = 0.9 * 0.1 / (16 * 9.5) - math.sqrt(D) * U32
    assert checks.generic_condition(Context("x", u, V, D)) == pytest.approx(9.5, rel=1e-12)


def test_to_json_spells_non_finite_values():
    r = checks.CheckResult("x", "fail", math.inf, 16.0, -math.inf, "why",
                           [{"a": math.nan, "b": math.inf, "c": -math.inf, "d": 2.5, "e": "text", "f": 3}])
    j = r.to_json()
    assert j["value"] == "inf" and j["measured"] == "-inf" and j["threshold"] == 16.0
    assert j["details"] == [{"a": "nan", "b": "inf", "c": "-inf", "d": 2.5, "e": "text", "f": 3}]
    r = checks.CheckResult("x", "pass", None, None, math.nan)
    assert r.to_json()["value"] is None and r.to_json()["measured"] == "nan"
    assert checks.CheckResult("x", "pass", 0.5, 16.0, 1e-9).to_json()["value"] == 0.5


def test_condition_number():
    assert checks.condition_number(np.array([[2.0, 0.0, 0.0], [0.0, 0.6, 0.0]])) == pytest.approx(2 / 0.6, rel=1e-14)
    assert checks.condition_number(np.array([[2.0, 0.0, 0.0]])) == 1.0  # D = 1: one singular value
    assert checks.condition_number(np.zeros((2, 3))) == math.inf
    assert checks.condition_number(np.array([[1.0, 0.0], [0.0, 0.0]])) == math.inf


# ---- Verdicts: TAU, RESOLVABLE, the worst ratio, the reason --------------------------------------------

def test_ratio_passes_at_tau_and_fails_above():
    v = Verdicts("t", FP32)
    v.ratio("a", 16 * 2.0**-20, 2.0**-20, "m")  # exactly TAU units
    assert v.done().verdict == "pass" and v.result.value == 16.0
    for r, verdict in ((15.5, "pass"), (16.5, "fail")):
        v = Verdicts("t", FP32)
        v.ratio("a", r * 2.0**-20, 2.0**-20, "m")
        assert v.done().verdict == verdict
    v = Verdicts("t", FP32)
    v.ratio("a", 17 * 2.0**-20, 2.0**-20, "err")
    assert v.done().reason == "a: err 1.62e-05 is 17 x its unit (threshold 16)"


def test_ratio_is_inconclusive_when_the_threshold_exceeds_resolvable():
    v = Verdicts("t", FP32)
    v.ratio("a", 0.0, 0.1 / 16, "m")  # TAU * unit == RESOLVABLE exactly: still resolvable
    assert v.done().verdict == "pass"
    v = Verdicts("t", FP32)
    v.ratio("a", 0.0, 0.01, "m")  # threshold 0.16
    r = v.done()
    assert r.verdict == "inconclusive" and r.reason == "a: float32 cannot resolve m (threshold 0.16)"
    assert r.value is None
    v = Verdicts("t", FP32)
    v.ratio("a", 0.0, 0.05, "m")  # threshold 0.8 < 1.1
    assert v.done().verdict == "inconclusive"


def test_ratio_of_a_non_positive_or_infinite_unit():
    for scale in (0.0, -0.5):
        v = Verdicts("t", FP32)
        v.ratio("a", 1e-9, scale, "m")
        r = v.done()
        assert r.verdict == "fail" and r.details[0]["ratio"] == math.inf
    v = Verdicts("t", FP32)
    v.ratio("a", 1e-9, math.inf, "m")
    assert "rank deficient" in v.done().reason


def test_result_keeps_the_worst_judged_ratio():
    v = Verdicts("t", FP32)
    v.ratio("a", 5e-9, 1e-9, "m")
    v.ratio("b", 2e-9, 1e-9, "m")
    v.ratio("c", 9e-3, 1e-2, "m")  # inconclusive: not a measured ratio
    r = v.done()
    assert r.value == pytest.approx(5.0) and r.measured == 5e-9 and r.verdict == "inconclusive"
    v = Verdicts("t", FP32)
    v.ratio("a", 2e-9, 1e-9, "m")
    v.ratio("b", 4e-9, 2e-9, "m")  # the same ratio: the first measurement stays
    assert v.result.value == pytest.approx(2.0) and v.result.measured == 2e-9


def test_reason_names_three_failures_or_two_unresolved():
    v = Verdicts("t", FP32)
    for k in range(4):
        v.fail(f"s{k}", "bad")
    assert v.done().reason == "s0: bad; s1: bad; s2: bad"
    v = Verdicts("t", FP32)
    for k in range(3):
        v.inconclusive(f"s{k}", "hard")
    assert v.done().reason == "s0: hard; s1: hard"


# ---- contract ----------------------------------------------------------------------------------------

def test_representable_fraction_counts_the_finite_non_zero_entries():
    third = float(np.float32(1 / 3))  # an fp32 value, not a bfloat16 one
    assert checks.representable_fraction([0.0, 0.0, -0.5, third, 0.25], "bfloat16") == pytest.approx(2 / 3)
    assert checks.representable_fraction([0.0, 0.0, 0.5, -third, -0.25], "bfloat16") == pytest.approx(2 / 3)
    assert checks.representable_fraction([0.0, 0.0, 0.0, 1.0, third], "bfloat16") == 0.5
    assert checks.representable_fraction([0.0, 0.0, 0.0, -1.0, third], "bfloat16") == 0.5
    assert checks.representable_fraction([math.inf, 0.5, third, math.nan], "bfloat16") == 0.5
    assert checks.representable_fraction([0.0, 0.0], "bfloat16") == 0.0
    assert checks.representable_fraction([0.5], "bfloat16") == 1.0


def contract_probe(E=None, W=None, ctx=FP32, embed_shape=None, logits_shape=None, out_dtype=None, tensors=()):
    if E is None:
        E, W = maps()
        E, W = E + 1e-3 / 3, W + 1e-3 / 3  # float64 values: not exact in any narrower format
    facts = {"embed": {"shape": embed_shape or [2, 3, ctx.dim], "dtype": out_dtype or ctx.dtype},
             "logits": {"shape": logits_shape or [2, 3, ctx.vocab], "dtype": out_dtype or ctx.dtype},
             "tensors": list(tensors)}
    return json.loads(json.dumps(facts)), probe_of(("init", (E, W)), **facts)


@pytest.mark.parametrize("shapes", [dict(embed_shape=[2, 3, D + 1]), dict(embed_shape=[2, 3, D - 1]),
                                    dict(logits_shape=[2, 3, V + 1]), dict(logits_shape=[2, 2, V])])
def test_contract_fails_a_wrong_output_shape(shapes):
    _, p = contract_probe(ctx=FP64, **shapes)
    r = checks.check_contract(p, FP64)
    assert r.verdict == "fail" and "returned shape" in r.reason


def test_contract_passes_what_came_through_json_and_fails_a_wider_or_narrower_output():
    facts, p = contract_probe(ctx=FP64, tensors=[{"name": "Z", "dtype": "float64", "kind": "parameter"},
                                                 {"name": "step", "dtype": "int64", "kind": "buffer"}])
    p.facts.update(facts)  # strings as a real probe has them: decoded from JSON, not the literals
    r = checks.check_contract(p, FP64)
    assert r.verdict == "pass" and r.value is None and r.threshold is None
    assert rows_of(r, "all") == [{"state": "all", "verdict": "pass", "measure": "shapes and dtypes"}]
    _, p = contract_probe(out_dtype="float64")
    r = checks.check_contract(p, FP32)
    assert r.verdict == "fail" and "embed returned float64 when float32 was asked for" in r.reason
    assert rows_of(r, "all") == []


def test_contract_storage_width_table():
    # a tensor wider than the dtype asked for is fine; a narrower one is not
    for ctx, ok, bad in ((FP32, "float64", "bfloat16"), (FP32, "float32", "float16"), (BF16, "float16", None),
                         (FP64, "float64", "float32"), (Context("float16", 2.0**-11, V, D), "float32", "bfloat16")):
        E, W = maps()
        E, W = E + 1e-3 / 3, W + 1e-3 / 3
        if ctx is BF16:
            E, W = np.round(E * 256) / 256 + 1 / 1024, np.round(W * 256) / 256 + 1 / 1024
        facts = json.loads(json.dumps({"embed": {"shape": [2, 3, D], "dtype": ctx.dtype},
                                       "logits": {"shape": [2, 3, V], "dtype": ctx.dtype}}))
        for dt, verdict in ((ok, "pass"), (bad, "fail")):
            if dt is None:
                continue
            p = probe_of(("init", (E, W)), **facts, tensors=[{"name": "Z", "dtype": dt, "kind": "parameter"}])
            r = checks.check_contract(p, ctx)
            assert r.verdict == verdict, (ctx.dtype, dt, r.reason)
            if verdict == "fail":
                assert r.reason == f"Z: parameter Z is stored in {dt}, narrower than {ctx.dtype}"


def _half_exact(frac_exact):
    """E, W with a given fraction of entries exactly 1.0 (exact in every format), the rest fp32 thirds."""
    n = V * D
    x = np.full(n, float(np.float32(1 / 3)))
    x[: int(round(frac_exact * n))] = 1.0
    E = x.reshape(V, D)
    return E, E.T.copy()


def test_contract_fails_more_than_half_exact_narrow_values_with_the_percentage():
    E, W = _half_exact(0.5)
    _, p = contract_probe(E, W)
    r = checks.check_contract(p, FP32)
    assert r.verdict == "pass"  # exactly half is not "more than half"
    E, W = _half_exact(0.75)
    _, p = contract_probe(E, W)
    r = checks.check_contract(p, FP32)
    assert r.verdict == "fail"
    assert r.reason.startswith("init: 75% of the embedding entries are exact bfloat16 values: "
                               "computed or stored in bfloat16, not float32")
    assert [d["raw"] for d in r.details if "raw" in d] == [0.75] * 4


# ---- reference, with the batched gathers ---------------------------------------------------------------

def batched_probe(rows_delta=0.0, logits_delta=0.0, states=3, zero=False, **overrides):
    """Three states (the batched maps come from the last); rows and logits off by known relative errors."""
    # T scaled by 100 (still an exact pair): ||E[ids]|| and ||H|| ||W|| below 1, so the norms are what divides
    p = probe_of(*[(f"s{k}", (maps(seed=k)[0] / 100, maps(seed=k)[1] * 100)) for k in range(states)])
    E, W = maps(seed=states - 1)
    E, W = E / 100, W * 100
    if zero:
        E = np.zeros_like(E)
        p.arrays[f"E:s{states - 1}"] = E
    rng = np.random.default_rng(5)
    arrays = {}
    for suffix, ids_shape in (("", (4,)), ("_grid", (2, 3))):
        ids = rng.integers(0, V, ids_shape)
        H = 1e-4 * rng.standard_normal(ids_shape + (D,)) * (0 if zero else 1)
        g = E[ids]
        rows = g + rows_delta * np.linalg.norm(g) * (P := rng.standard_normal(g.shape)) / np.linalg.norm(P)
        lg = H @ W
        Q = rng.standard_normal(lg.shape)
        lg = lg + logits_delta * np.linalg.norm(H) * np.linalg.norm(W) * Q / np.linalg.norm(Q)
        names = ("ids", "embed_rows", "hidden", "logits_rows") if not suffix else \
            ("ids_grid", "embed_grid", "hidden_grid", "logits_grid")
        arrays.update(zip(names, (ids, rows, H, lg)))
    arrays.update(overrides)
    p.arrays.update(arrays)
    return p


def test_reference_judges_batched_and_grid_maps_in_units_of_u():
    r = checks.check_reference(batched_probe(rows_delta=3 * UNIT32, logits_delta=5 * UNIT32), FP32)
    assert r.verdict == "pass", r.reason
    for label in ("batched", "(B, T) batches"):
        emb, lg = rows_of(r, label)
        assert emb["measure"] == "embed(ids) against rows of the full embedding"
        assert emb["raw"] == pytest.approx(3 * UNIT32, rel=1e-6) and emb["ratio"] == pytest.approx(3, rel=1e-6)
        assert lg["measure"] == "logits(h) against h W (W = logits(I))"
        assert lg["raw"] == pytest.approx(5 * UNIT32, rel=1e-6) and lg["ratio"] == pytest.approx(5, rel=1e-6)


@pytest.mark.parametrize("which", ["rows", "logits"])
def test_reference_fails_batched_maps_off_by_more_than_tau(which):
    kw = {"rows_delta": 20 * UNIT32} if which == "rows" else {"logits_delta": 20 * UNIT32}
    r = checks.check_reference(batched_probe(**kw), FP32)
    assert r.verdict == "fail" and r.reason.startswith("batched: ")
    assert {d["state"] for d in r.details if d["verdict"] == "fail"} == {"batched", "(B, T) batches"}


def test_reference_batched_against_the_last_state_only():
    for states in (2, 3):
        r = checks.check_reference(batched_probe(states=states), FP32)
        assert r.verdict == "pass", r.reason
        assert max(d["ratio"] for d in r.details if d["state"] in ("batched", "(B, T) batches")) < 1e-3


def test_reference_all_zero_gathers_measure_zero():
    r = checks.check_reference(batched_probe(zero=True), FP32)
    for label in ("batched", "(B, T) batches"):
        assert [d["ratio"] for d in rows_of(r, label)] == [0.0, 0.0]


@pytest.mark.parametrize("bad", ["embed_rows", "logits_rows"])
@pytest.mark.parametrize("delta", [1, -1])
def test_reference_fails_wrong_batched_shapes_and_goes_on(bad, delta):
    p = batched_probe()
    x = p.arrays[bad]
    p.arrays[bad] = x[:, : x.shape[1] + delta] if delta < 0 else np.concatenate([x, x[:, :1]], axis=1)
    r = checks.check_reference(p, FP32)
    assert r.verdict == "fail" and r.reason.startswith("batched: embed gave shape")
    assert len(rows_of(r, "(B, T) batches")) == 2  # the grid is still judged
    p = batched_probe()
    x = p.arrays[bad]
    p.arrays[bad] = x[: x.shape[0] + delta] if delta < 0 else np.concatenate([x, x[:1]])
    r = checks.check_reference(p, FP32)
    assert r.verdict == "fail" and r.reason.startswith("batched: embed gave shape")


def test_reference_fails_non_finite_or_singular_states_and_goes_on():
    E, W = maps(seed=1)
    bad = E.copy()
    bad[2, 3] = np.nan
    r = checks.check_reference(probe_of(("a", (bad, W)), ("b", maps())), FP32)
    assert r.verdict == "fail" and r.reason == "a: the maps contain non-finite values"
    assert len(rows_of(r, "b")) == 1
    Ws = np.zeros((D, V))
    Ws[: D - 1, : D - 1] = np.eye(D - 1)  # W W^T = diag(1, ..., 1, 0): an exact zero eigenvalue
    r = checks.check_reference(probe_of(("a", (Ws.T.copy(), Ws)), ("b", maps())), FP32)
    assert r.reason == "a: the head W = T Z^T is rank deficient: T is singular"
    assert len(rows_of(r, "b")) == 1


def test_reference_exceptions_become_a_failure_that_names_them():
    p = Probe(facts={"states": []}, arrays={"embed_rows": np.zeros((1, D))})
    r = checks.judge("reference", p, FP32)
    assert r.verdict == "fail" and r.reason.startswith("could not judge what the target returned: IndexError")
    r = checks.judge("checkpoint", probe_of(("before", maps())), FP32)
    assert r.verdict == "fail" and r.reason.startswith("could not judge what the target returned: KeyError")
    p = Probe(facts={"max": 1e38, "tiny": 1e-38, "scaled": [{"exponent": 0}]},
              arrays={"base": np.ones((2, V)), "hidden": np.ones((2, D))})
    r = checks.judge("scale", p, FP32)
    assert r.verdict == "fail" and r.reason.startswith("could not judge what the target returned: KeyError")


# ---- conditioning ---------------------------------------------------------------------------------------

def test_conditioning_ladder_rungs():
    # fp32, D = 8: the top resolvable cond(T) is 0.1 / (16 unit(1)) = 2.7e4, rounded down to 2e4
    assert 0.1 / (16 * UNIT32) == pytest.approx(27391, rel=1e-4)
    assert checks.conditioning_ladder(FP32) == [1e2, 1e4, 2e4]
    assert checks.conditioning_ladder(FP64) == [1e2, 1e4, 1e6]  # capped
    assert checks.conditioning_ladder(FP64, cap=37000.0) == [1e2, 1e4, 3e4]
    assert checks.conditioning_ladder(FP32, cap=500.0) == [1e2, 500.0]
    assert checks.conditioning_ladder(FP32, cap=100.0) == [1e2]
    assert checks.conditioning_ladder(FP32, cap=99.5) == []
    assert checks.conditioning_ladder(BF16) == []
    assert checks.conditioning_ladder(Context("float32", U32, V, 4 * D)) == [1e2, 1e4]  # top 1.6e4


def diagonal_pair(s):
    """W = [diag(s) 0] (D x V) and E = W^+: cond(T) exactly max(s) / min(s)."""
    Dd = len(s)
    W = np.zeros((Dd, 2 * Dd))
    W[:, :Dd] = np.diag(s)
    E = np.zeros((2 * Dd, Dd))
    E[:Dd] = np.diag(1 / np.asarray(s))
    return E, W


def test_conditioning_reaching_half_the_top_rung_is_enough():
    ctx = Context("float32", U32, 4, 2)  # unit(1) = u (1 + sqrt 2): top 0.1 / (16 unit) = 4.3e4 -> rung 4e4
    assert checks.conditioning_ladder(ctx) == [1e2, 1e4, 4e4]
    pair = diagonal_pair([2e4, 1.0])
    assert checks.interface(*pair)["cond_T"] == 2e4
    r = checks.check_conditioning(probe_of(("cond 2e4", pair)), ctx)
    assert r.verdict == "pass", r.reason
    r = checks.check_conditioning(probe_of(("cond 1.5e4", diagonal_pair([1.5e4, 1.0]))), ctx)
    assert r.verdict == "inconclusive"
    assert r.reason == "ladder: the module's parameters reached cond(T) = 1.5e+04, short of 4e+04"


def test_conditioning_unreached_is_reported_from_one():
    # only an attack state: nothing reached, cond(T) 1 is where a module starts
    E, W = maps(cond=1.0)
    r = checks.check_conditioning(probe_of(("zeroed L", (E, W), {"attack": "L"})), FP32)
    assert r.verdict == "inconclusive"
    assert r.reason == "ladder: the module's parameters reached cond(T) = 1, short of 2e+04"


def test_conditioning_attack_states():
    ladder = [(f"cond {c:g}", maps(cond=c)) for c in (1e2, 1e4, 2e4)]
    # a finite, resolvable attack state is judged like any other, wherever it comes
    bad = maps(cond=100.0, one_solve=True)
    r = checks.check_conditioning(probe_of(("zeroed L", bad, {"attack": "L"}), *ladder), FP32)
    assert r.verdict == "fail" and r.reason.startswith("zeroed L: ")
    assert {d["state"] for d in r.details} == {"zeroed L", "cond 100", "cond 10000", "cond 20000"}
    good = maps(cond=100.0)
    r = checks.check_conditioning(probe_of(("zeroed L", good, {"attack": "L"}), *ladder), FP32)
    assert r.verdict == "pass", r.reason
    # beyond what fp32 resolves (16 cond unit > 0.1): finite is all that can be asked
    wild = maps(cond=1e6)
    r = checks.check_conditioning(probe_of(*ladder, ("zeroed L", wild, {"attack": "L"})), FP32)
    assert r.verdict == "pass", r.reason
    (row,) = rows_of(r, "zeroed L")
    assert row["reason"] == "finite; cond(T) beyond what the dtype resolves" and row["verdict"] == "pass"


def test_conditioning_records_refused_zeroings():
    ladder = [(f"cond {c:g}", maps(cond=c)) for c in (1e2, 1e4, 2e4)]
    p = probe_of(*ladder, zeroed=[{"parameter": "L", "raised": "ValueError: singular"},
                                  {"parameter": "d", "state": "zeroed d"}])
    r = checks.check_conditioning(p, FP32)
    assert r.verdict == "pass"
    assert rows_of(r, "zeroed L") == [{"state": "zeroed L", "verdict": "pass", "reason": "refused: ValueError: singular"}]
    assert rows_of(r, "zeroed d") == []


# ---- gradients ------------------------------------------------------------------------------------------

def grad_probe(**f):
    base = {"parameters": 2, "fd_dtype": "float32", "loss_scale": 3.0}
    base.update(f)
    return Probe(facts=base)


def test_gradients_ratio_in_units_of_u_fd_to_the_two_thirds():
    # noise-free differences: unit u_fd^(2/3) max(loss scale, |ad|) / scale, scale = max(|ad|, |fd|)
    ad, fd = 2.0, 2.0 + 1e-6
    r = checks.check_gradients(grad_probe(autograd=ad, finite_difference=fd, fd_at_step=fd, fd_at_half_step=fd), FP32)
    row = r.details[0]
    unit = U32 ** (2 / 3) * 3.0 / fd
    assert row["raw"] == pytest.approx(1e-6 / fd, rel=1e-9)
    assert row["ratio"] == pytest.approx(1e-6 / fd / unit, rel=1e-9)
    assert row["fd_noise"] == 0.0 and r.verdict == "pass"
    # |ad| above the loss scale sets the unit
    ad, fd = 5.0, 5.0 + 1e-6
    r = checks.check_gradients(grad_probe(autograd=ad, finite_difference=fd, fd_at_step=fd, fd_at_half_step=fd), FP32)
    assert r.details[0]["ratio"] == pytest.approx(1e-6 / fd / (U32 ** (2 / 3) * ad / fd), rel=1e-9)


def test_gradients_unresolvable_differences_name_the_precision_that_limits_them():
    # differences taken in bfloat16 (a parameter stored in bfloat16) under a float32 request: the unit
    # u_bf16^(2/3) puts the threshold above 0.1, and the reason names bfloat16, not the dtype under test
    r = checks.check_gradients(grad_probe(autograd=1.0, finite_difference=1.0, fd_at_step=1.0, fd_at_half_step=1.0,
                                          fd_dtype="bfloat16", loss_scale=1.0), FP32)
    threshold = checks.TAU * UBF ** (2 / 3)
    assert r.verdict == "inconclusive"
    assert r.reason == ("autograd vs finite differences (bfloat16): bfloat16 cannot resolve directional derivative "
                        f"error (threshold {threshold:.2g})")


def test_gradients_unit_is_the_measured_noise_when_larger():
    ad = 2.0
    r = checks.check_gradients(grad_probe(autograd=ad, finite_difference=ad + 0.02, fd_at_step=ad + 0.02,
                                          fd_at_half_step=ad + 0.01), FP32)
    row = r.details[0]
    scale = ad + 0.02
    assert row["fd_noise"] == pytest.approx(0.01 / scale, rel=1e-9)
    assert row["ratio"] == pytest.approx(2.0, rel=1e-9) and r.verdict == "pass"


def test_gradients_small_derivatives_are_relative():
    ad = 1e-3
    fd = ad * (1 + 1e-3)
    r = checks.check_gradients(grad_probe(autograd=ad, finite_difference=fd, fd_at_step=fd, fd_at_half_step=fd,
                                          loss_scale=1e-3), FP32)
    assert r.details[0]["raw"] == pytest.approx(1e-3 * ad / fd, rel=1e-9)  # relative to the derivative, not to 1
    assert r.details[0]["ratio"] == pytest.approx(1e-3 * ad / (U32 ** (2 / 3) * 1e-3), rel=1e-9)
    assert r.verdict == "fail"


def test_gradients_under_test_against_the_float64_autograd():
    f = dict(autograd=0.5, finite_difference=0.5, fd_at_step=0.5, fd_at_half_step=0.5, fd_dtype="float64",
             reference_dtype="float64", state_transfer_error=0.0)
    r = checks.check_gradients(grad_probe(**f, autograd_under_test=0.5 * (1 + 1e-6), cond_T=3.0), FP32)
    row = r.details[1]
    assert row["state"] == "float32 vs float64 autograd"
    assert row["raw"] == pytest.approx(1e-6, rel=1e-9)
    assert row["ratio"] == pytest.approx(1e-6 / (3 * UNIT32), rel=1e-9)
    r = checks.check_gradients(grad_probe(**f, autograd_under_test=0.5 * (1 + 1e-6)), FP32)
    assert r.details[1]["ratio"] == pytest.approx(1e-6 / UNIT32, rel=1e-9)  # cond(T) 1 when not reported
    r = checks.check_gradients(grad_probe(**f, autograd_under_test=0.5 * (1 + 1e-5)), FP32)
    assert r.verdict == "fail"


def test_gradients_under_test_relative_to_the_magnitude_of_the_terms():
    # pitcheck.nn in bfloat16 at V = 2048, D = 32, seed 0 (measured): the derivative along the random direction
    # is 8450 x smaller than sum |g_i d_i|, so each g_i's rounding, amplified, is 40 units of |ad|, and
    # 0.005 units of sum |g_i d_i|, the scale of the dot product's forward error bound
    ctx = Context("bfloat16", UBF, 2048, 32)
    ad, test, magnitude, cond = 0.0016620493, 0.0012752402, 14.05, 1.4721
    f = dict(autograd=ad, finite_difference=ad, fd_at_step=ad, fd_at_half_step=ad, fd_dtype="float64",
             reference_dtype="float64", state_transfer_error=0.0, autograd_under_test=test, cond_T=cond)
    r = checks.check_gradients(grad_probe(**f), ctx)
    assert r.verdict == "fail" and r.details[1]["ratio"] == pytest.approx(40.47, rel=1e-3)  # without it
    r = checks.check_gradients(grad_probe(**f, autograd_magnitude=magnitude), ctx)
    row = r.details[1]
    assert r.verdict == "pass" and row["autograd_magnitude"] == magnitude
    assert row["ratio"] == pytest.approx(abs(test - ad) / magnitude / ctx.unit(cond), rel=1e-9)
    # a magnitude below |ad| (impossible for sum |g_i d_i|) never makes the comparison stricter
    r = checks.check_gradients(grad_probe(**f, autograd_magnitude=1e-9), ctx)
    assert r.details[1]["ratio"] == pytest.approx(40.47, rel=1e-3)


def test_gradients_each_parameter_against_the_float64_gradient_in_norm():
    f = dict(autograd=0.5, finite_difference=0.5, fd_at_step=0.5, fd_at_half_step=0.5, fd_dtype="float64",
             reference_dtype="float64", state_transfer_error=0.0, autograd_under_test=0.5, cond_T=2.0,
             autograd_magnitude=10.0)
    unit = FP32.unit(2.0)
    blocks = [{"parameter": "Z", "norm": 4.0, "difference": 4.0 * 3 * unit},
              {"parameter": "L", "norm": 3.0, "difference": 0.0},
              {"parameter": "unused", "norm": 0.0, "difference": 0.0}]
    r = checks.check_gradients(grad_probe(**f, gradient_blocks=blocks), FP32)
    rows = {d["state"]: d for d in r.details}
    assert r.verdict == "pass"
    assert rows["float32 vs float64 gradient of Z"]["ratio"] == pytest.approx(3.0, rel=1e-9)
    assert rows["float32 vs float64 gradient of L"]["ratio"] == 0.0
    assert rows["float32 vs float64 gradient of unused"]["ratio"] == 0.0
    # a scaled gradient (1.5 x) fails, whatever the random direction's derivative says
    blocks[1]["difference"] = 0.5 * 3.0
    r = checks.check_gradients(grad_probe(**f, gradient_blocks=blocks), FP32)
    assert r.verdict == "fail" and "gradient of L" in r.reason
    # a gradient where float64 has none is measured against the whole gradient's norm (5)
    blocks[1]["difference"] = 0.0
    blocks[2]["difference"] = 5.0 * 20 * unit
    r = checks.check_gradients(grad_probe(**f, gradient_blocks=blocks), FP32)
    assert r.verdict == "fail"
    assert {d["state"]: d for d in r.details}["float32 vs float64 gradient of unused"]["ratio"] == pytest.approx(20.0)


def test_gradients_builds_left_apart_by_their_state_dict_are_not_compared():
    # the dtype's autograd is compared only where loading the reference build's state_dict put both builds at
    # the same point: embeddings apart by at most TAU units (cond 3: unit 3 UNIT32). The differences were
    # taken in bfloat16 (a bfloat16 parameter), the reference autograd is the float64 build's.
    f = dict(autograd=0.5, finite_difference=0.5, fd_at_step=0.5, fd_at_half_step=0.5, fd_dtype="bfloat16",
             reference_dtype="float64", autograd_under_test=0.9, cond_T=3.0)
    edge = checks.TAU * 3 * UNIT32
    r = checks.check_gradients(grad_probe(**f, state_transfer_error=edge), FP32)
    assert r.verdict == "fail" and r.details[1]["state_transfer_error"] == edge  # at the edge: compared
    assert r.details[1]["state"] == "float32 vs float64 autograd"
    moved = 1.37 * edge  # 21.92 units: a fractional ratio in the message
    r = checks.check_gradients(grad_probe(**f, state_transfer_error=moved), FP32)
    assert r.verdict == "inconclusive"
    assert r.details[1] == {"state": "float32 vs float64 autograd", "verdict": "inconclusive", "reason": (
        f"after loading the float64 build's state_dict the two builds' embeddings are {moved:.3g} apart "
        f"({moved / (3 * UNIT32):.3g} x the unit): not the same point (state outside the state_dict?), so their "
        "derivatives are not compared")}
    r = checks.check_gradients(grad_probe(**f, state_transfer_error=float("nan")), FP32)
    assert r.verdict == "inconclusive" and r.details[1]["reason"] == (
        "after loading the float64 build's state_dict the embeddings are not finite: the derivatives cannot be "
        "compared")


def test_gradients_unresolvable_because_of_measured_noise_says_so():
    # noise 0.02 above the theoretical u_fp32^(2/3) = 1.5e-5 sets the unit: 16 x 0.02 > 0.1 cannot resolve
    r = checks.check_gradients(grad_probe(autograd=1.0, finite_difference=1.0, fd_at_step=1.0, fd_at_half_step=1.02,
                                          loss_scale=1.0), FP32)
    assert r.verdict == "inconclusive" and r.reason == (
        "autograd vs finite differences (float32): the differences' measured noise (0.02) cannot resolve "
        "directional derivative error (threshold 0.32)")


def test_gradients_of_zero_are_measured_as_zero():
    f = dict(autograd=0.0, finite_difference=0.0, fd_at_step=0.0, fd_at_half_step=0.0, autograd_under_test=0.0,
             reference_dtype="float64", state_transfer_error=0.0)
    r = checks.check_gradients(grad_probe(**f), FP32)
    # 0 / 0 is no error; the differences' unit is unbounded there, so the first row cannot judge
    assert [d["ratio"] for d in r.details] == [0.0, 0.0] and r.details[1]["verdict"] == "pass"


# ---- trajectory, checkpoint -------------------------------------------------------------------------------

@pytest.mark.parametrize("moved", ["E", "W", "both"])
def test_trajectory_a_state_that_moved_either_map_is_not_still(moved):
    E0, W0 = maps(cond=1.0)
    E1, W1 = maps(cond=1.0, seed=1)
    later = {"E": (E1, W0), "W": (E0, W1), "both": (E1, W1)}[moved]
    r = checks.check_trajectory(probe_of(("step 0", (E0, W0)), ("step 10", later)), FP32)
    assert "did not change" not in r.reason and rows_of(r, "trajectory") == []


def test_trajectory_of_three_moving_states_passes_and_judges_after_a_non_finite_one():
    states = [(f"step {k}", maps(cond=1.0, seed=k)) for k in range(3)]
    r = checks.check_trajectory(probe_of(*states), FP32)
    assert r.verdict == "pass", r.reason
    E, W = maps(cond=1.0, seed=7)
    E = E.copy()
    E[0, 0] = np.inf
    r = checks.check_trajectory(probe_of(("step 0", (E, W)), *states[1:]), FP32)
    assert r.reason == "step 0: the maps contain non-finite values"
    assert len(rows_of(r, "step 2")) == 2


def checkpoint_probe(loaded, resumed):
    E, W = maps()
    E, W = 0.01 * E, 0.01 * W  # norms below 1
    return probe_of(("before", (E, W)), ("loaded", loaded(E, W)), ("uninterrupted after step", (E, W)),
                    ("resumed after step", resumed(E, W)))


def test_checkpoint_difference_is_relative_in_units_of_u():
    r = checks.check_checkpoint(checkpoint_probe(lambda E, W: (E * (1 + 3 * U32), W * (1 - 5 * U32)),
                                                 lambda E, W: (E, W)), FP32)
    assert r.verdict == "pass"
    ratios = [d["ratio"] for d in rows_of(r, "loaded vs saved")]
    assert ratios == [pytest.approx(3, rel=1e-6), pytest.approx(5, rel=1e-6)]
    r = checks.check_checkpoint(checkpoint_probe(lambda E, W: (E, W), lambda E, W: (E * (1 + 20 * U32), W)), FP32)
    assert r.verdict == "fail" and r.reason.startswith("one step after resume: embedding difference")


def test_checkpoint_of_zero_maps_is_zero_difference():
    z = (np.zeros((V, D)), np.zeros((D, V)))
    p = probe_of(("before", z), ("loaded", z), ("uninterrupted after step", z), ("resumed after step", z))
    r = checks.check_checkpoint(p, FP32)
    assert r.verdict == "pass" and [d["ratio"] for d in r.details] == [0.0] * 4


def test_checkpoint_non_finite_embedding_fails_and_the_head_is_still_compared():
    def nan_embedding(E, W):
        E = E.copy()
        E[1, 1] = np.nan
        return E, W
    r = checks.check_checkpoint(checkpoint_probe(nan_embedding, lambda E, W: (E, W)), FP32)
    assert r.reason == "loaded vs saved: the embedding is non-finite"
    assert [d.get("measure") for d in rows_of(r, "loaded vs saved")] == [None, "head difference"]


# ---- bad_input -----------------------------------------------------------------------------------------------

ROWS = np.arange(2 * D, dtype=float).reshape(2, D) + 1.0


def bad_input_probe(**values):
    """Cases answered with the given arrays (or refused, for a string)."""
    rng = np.random.default_rng(3)
    clean = rng.standard_normal((3, V))
    cases, arrays = {}, {"rows_0_last": ROWS, "clean_logits": clean}
    for name, value in values.items():
        name = name.replace("_", " ").replace("minus", "-")
        if isinstance(value, str):
            cases[name] = {"raised": value}
        else:
            value = value(clean) if callable(value) else value
            cases[name] = {"shape": list(np.shape(value))}
            arrays[f"value:{name}"] = value
    return Probe(facts=json.loads(json.dumps({"cases": cases})), arrays=arrays)


def nan_row(shape, row=1):
    x = np.ones(shape)
    x[row] = np.nan
    return x


@pytest.mark.parametrize("value,reason", [
    (nan_row((2, D)), ""),
    (nan_row((2, D), row=0), "id V returned finite numbers instead of an error"),  # the bad id's row is finite
    (np.ones((1, D)), "id V returned an array of shape (1, 8) instead of an error (a batch of 2 ids should give 2 rows)"),
    (nan_row((1, D), row=0), "id V returned an array of shape (1, 8) instead of an error (a batch of 2 ids should give 2 rows)"),
    (np.array(1.0), "id V returned an array of shape () instead of an error (a batch of 2 ids should give 2 rows)"),
    (np.array([1.0, np.nan]), "id V returned an array of shape (2,) instead of an error (a batch of 2 ids should give 2 rows)"),
    (nan_row((2, 2, D)), "id V returned an array of shape (2, 2, 8) instead of an error (a batch of 2 ids should give 2 rows)"),
    (nan_row((3, D)), "id V returned an array of shape (3, 8) instead of an error (a batch of 2 ids should give 2 rows)"),
    (ROWS.copy(), "id V returned finite numbers instead of an error"),
])
def test_bad_input_an_impossible_id_must_give_its_own_row_non_finite(value, reason):
    r = checks.check_bad_input(bad_input_probe(id_V=value), FP32)
    assert r.verdict == ("fail" if reason else "pass") and r.reason == (f"id V: {reason}" if reason else "")


def test_bad_input_wrapped_negative_id_needs_the_same_rows():
    r = checks.check_bad_input(bad_input_probe(id_minus1=ROWS.copy()), FP32)
    assert r.reason == "id -1: id -1 silently returned the embedding of token V-1 (negative index wraps)"
    three = np.vstack([ROWS, ROWS[:1]])
    r = checks.check_bad_input(bad_input_probe(id_minus1=three), FP32)
    assert r.reason == f"id -1: id -1 returned an array of shape (3, {D}) instead of an error (a batch of 2 ids should give 2 rows)"
    r = checks.check_bad_input(bad_input_probe(id_minus1=ROWS[1:]), FP32)
    assert r.reason == f"id -1: id -1 returned an array of shape (1, {D}) instead of an error (a batch of 2 ids should give 2 rows)"
    r = checks.check_bad_input(bad_input_probe(float_ids=ROWS.copy()), FP32)
    assert r.reason == "float ids: float ids returned finite numbers instead of an error"


@pytest.mark.parametrize("shape,ok", [((0, D), True), ((0, D - 1), False), ((0, D + 1), False), ((1, D), False)])
def test_bad_input_empty_batch_shape(shape, ok):
    r = checks.check_bad_input(bad_input_probe(empty_batch=np.zeros(shape), id_V="IndexError"), FP32)
    assert r.verdict == ("pass" if ok else "fail")
    if not ok:
        assert r.reason == f"empty batch: an empty batch gave shape {shape}, not (0, {D})"


def test_bad_input_non_finite_hidden_row_stays_in_its_row():
    def confined(delta):
        def f(clean):
            x = clean * (1 + delta)
            x[1] = -np.inf
            return x
        return f
    # any other case name is a hidden-row case ("-inf hidden row" sorts before the id cases)
    # the other rows a relative 3 u below their clean values
    r = checks.check_bad_input(bad_input_probe(**{"-inf hidden row": confined(-3 * UNIT32)}), FP32)
    assert r.verdict == "pass"
    (row,) = r.details
    assert row["measure"] == "other rows' change" and row["ratio"] == pytest.approx(3, rel=1e-6)
    r = checks.check_bad_input(bad_input_probe(nan_hidden_row=confined(20 * UNIT32)), FP32)
    assert r.verdict == "fail" and r.reason.startswith("nan hidden row: other rows' change")

    def spread(row):
        def f(clean):
            x = confined(0.0)(clean)
            x[row] = np.nan
            return x
        return f
    for row in (0, 2):
        r = checks.check_bad_input(bad_input_probe(nan_hidden_row=spread(row)), FP32)
        assert r.reason == "nan hidden row: the non-finite hidden row spread to the other rows' logits"
    for shape in ((4, V), (2, V), (3, V + 1)):
        r = checks.check_bad_input(bad_input_probe(nan_hidden_row=nan_row(shape)), FP32)
        assert r.reason == f"nan hidden row: logits of shape {shape}, expected {(3, V)}"


# ---- scale -----------------------------------------------------------------------------------------------
# fp32: fmax = (1 - 2^-24) 2^128, tiny = 2^-126, tiny / u = 2^-102. Both probes below are built so that:
#   safe (in and out well inside the range): c max(|h|, |logits|) <= fmax / 64 and c min|.| >= 2^-102:
#       max = 1 - 2^-24, min = 2^-14  ->  -88 <= k <= 122, both ends exactly on the boundary
#   overflow: c max|logits| > fmax or c max|h| > fmax  ->  k >= 129 (k = 128 lands exactly on fmax)
#   judged (outputs not subnormal): c min|logits| >= 2^-102, min|logits| = 2^-12  ->  k >= -90
FMAX, TINY = float(np.finfo(np.float32).max), float(np.finfo(np.float32).tiny)
EXPONENTS = [-200, -91, -90, -89, -88, -87, 0, 10, 121, 122, 123, 128, 129, 137, 138, 150]
TOP = 1 - 2.0**-24


def scale_arrays(kind, sign=1.0):
    """'h': |h| up to 1 - 2^-24 and logits up to 2^-10 (the hidden state overflows first); 'logits': the
    other way round. Both hold an exact zero, min|h| = 2^-14 (positive; negative ones from 2^-13) and
    min|logits| = 2^-12 (negative; positive ones from 2^-11.9)."""
    rng = np.random.default_rng(11)
    big, small = (0.5, 2.0**-10.1) if kind == "h" else (2.0**-10.1, 0.5)
    hid = rng.uniform(2.0**-12, big if kind == "h" else 2.0**-10.1, (4, D)) * rng.choice([-1, 1], (4, D))
    base = rng.uniform(2.0**-11.9, 2.0**-10.1 if kind == "h" else 0.5, (4, V)) * rng.choice([-1, 1], (4, V))
    hid[0, :4] = [0.0, 2.0**-14, -(2.0**-13), TOP if kind == "h" else 2.0**-10]
    base[0, :3] = [0.0, -(2.0**-12), 2.0**-10 if kind == "h" else TOP]
    return sign * hid, sign * base


def scale_probe(hid, base, outputs, exponents=EXPONENTS):
    """outputs(k, c, base) -> an array, or a string: the exception raised."""
    p = Probe(facts={"max": FMAX, "tiny": TINY, "scaled": []}, arrays={"base": base, "hidden": hid})
    for k in exponents:
        out = outputs(k, 2.0**k, base)
        if isinstance(out, str):
            p.facts["scaled"].append({"exponent": k, "raised": out})
        else:
            p.facts["scaled"].append({"exponent": k})
            p.arrays[f"scaled:{k}"] = out
    return p


def scale_rows(result):
    out = {}
    for d in result.details:
        out[d["state"]] = (d["verdict"], d["reason"] if "reason" in d else round(d["ratio"], 3))
    return out


def safe(k):
    return -88 <= k <= 122


def overflow(k):
    return k >= 129


def judged(k):
    return k >= -90


SCALE_CASES = [(kind, sign) for kind in ("h", "logits") for sign in (1.0, -1.0)]


@pytest.mark.parametrize("kind,sign", SCALE_CASES)
def test_scale_exact_scaling_is_measured_where_resolvable_and_overflow_shows(kind, sign):
    hid, base = scale_arrays(kind, sign)
    r = checks.check_scale(scale_probe(hid, base, lambda k, c, b: c * b * (1 + 2 * UNIT32)), FP32)
    expected = {}
    for k in EXPONENTS:
        if overflow(k):
            expected[f"c = 2^{k}"] = ("pass", "overflow shows")
        elif judged(k):
            expected[f"c = 2^{k}"] = ("pass", 2.0)
    assert scale_rows(r) == expected
    assert r.verdict == "pass"


@pytest.mark.parametrize("kind,sign", SCALE_CASES)
def test_scale_refusal_is_a_failure_only_where_input_and_output_are_safe(kind, sign):
    hid, base = scale_arrays(kind, sign)
    r = checks.check_scale(scale_probe(hid, base, lambda k, c, b: "OverflowError: no"), FP32)
    expected = {f"c = 2^{k}": ("fail", "raised for a representable input and output: OverflowError: no") if safe(k)
                else ("pass", "refused: OverflowError: no") for k in EXPONENTS}
    assert scale_rows(r) == expected


@pytest.mark.parametrize("kind,sign", SCALE_CASES)
def test_scale_non_finite_output_is_a_failure_only_where_safe(kind, sign):
    hid, base = scale_arrays(kind, sign)
    bmax = np.abs(base).max()
    r = checks.check_scale(scale_probe(hid, base, lambda k, c, b: np.full_like(b, np.nan)), FP32)
    expected = {}
    for k in EXPONENTS:
        if safe(k) and not overflow(k):
            expected[f"c = 2^{k}"] = ("fail", f"non-finite logits although c logits(h) is at most {2.0**k * bmax:.3g}")
        else:
            expected[f"c = 2^{k}"] = ("pass", "overflow shows")
    assert scale_rows(r) == expected


@pytest.mark.parametrize("kind,sign", SCALE_CASES)
def test_scale_finite_wrong_numbers_fail_wherever_judged_or_overflowing(kind, sign):
    hid, base = scale_arrays(kind, sign)
    r = checks.check_scale(scale_probe(hid, base, lambda k, c, b: np.zeros_like(b)), FP32)
    expected = {}
    for k in EXPONENTS:
        if overflow(k):
            expected[f"c = 2^{k}"] = ("fail", "the logits overflow the dtype, yet finite numbers came back")
        elif judged(k):
            expected[f"c = 2^{k}"] = ("fail", round(1 / UNIT32, 3))
    assert scale_rows(r) == expected


def test_scale_overflow_tolerance_is_relative_tau_units():
    hid, base = scale_arrays("h")
    for delta, verdict in ((10 * UNIT32, "pass"), (20 * UNIT32, "fail")):
        r = checks.check_scale(scale_probe(hid, base, lambda k, c, b: c * b * (1 + delta), [129, 150]), FP32)
        assert r.verdict == verdict


def test_scale_overflow_of_the_hidden_state_with_small_logits():
    # logits of order 2^-2 at c = 2^129: the hidden state overflows, and a finite zero is still wrong
    hid, base = scale_arrays("h")
    base = base * 2.0**-121
    r = checks.check_scale(scale_probe(hid, base, lambda k, c, b: np.zeros_like(b), [129]), FP32)
    assert r.verdict == "fail" and "finite numbers came back" in r.reason
    # while numbers within TAU u of c logits(h), however small, are the right ones
    r = checks.check_scale(scale_probe(hid, base, lambda k, c, b: c * b * (1 + 2 * UNIT32), [129]), FP32)
    assert scale_rows(r) == {"c = 2^129": ("pass", "overflow shows")}


def test_scale_a_refusal_does_not_end_the_check():
    hid, base = scale_arrays("h")
    r = checks.check_scale(scale_probe(hid, base, lambda k, c, b: "E" if k == -200 else np.zeros_like(b)), FP32)
    assert r.verdict == "fail" and r.reason.startswith("c = 2^-90: relative error")


def test_scale_safe_range_is_fmax_over_64():
    # max |h| = 1.01: c = 2^121 is safe, 2^122 is not (1.01 2^122 > fmax / 64, though below fmax / 63)
    hid, base = scale_arrays("h")
    hid[0, 3] = 1.01
    r = checks.check_scale(scale_probe(hid, base, lambda k, c, b: "E", [121, 122]), FP32)
    assert scale_rows(r) == {"c = 2^121": ("fail", "raised for a representable input and output: E"),
                             "c = 2^122": ("pass", "refused: E")}


@pytest.mark.parametrize("value", [1.0, -1.0])
def test_scale_constant_logits_are_measured(value):
    hid, _ = scale_arrays("h")
    base = np.full((4, V), value)
    r = checks.check_scale(scale_probe(hid, base, lambda k, c, b: c * b * (1 + 2 * UNIT32), [0]), FP32)
    assert scale_rows(r) == {"c = 2^0": ("pass", 2.0)}


def test_scale_all_zero_logits_measure_nothing():
    hid, _ = scale_arrays("h")
    base = np.zeros((4, V))
    r = checks.check_scale(scale_probe(hid, base, lambda k, c, b: np.zeros_like(b), [0]), FP32)
    assert r.verdict == "inconclusive" and r.reason == "nothing could be measured"


def test_scale_non_finite_base_fails_at_once():
    hid, base = scale_arrays("h")
    base[1, 1] = np.inf
    r = checks.check_scale(scale_probe(hid, base, lambda k, c, b: c * b), FP32)
    assert r.verdict == "fail" and r.reason == "c = 1: logits of an ordinary hidden state are non-finite"
    assert len(r.details) == 1


@pytest.mark.parametrize("seed", range(5))
def test_reference_fails_a_head_of_numerical_rank_below_d(seed):
    # two equal rows of W: its smallest singular value is rounding (about 1e-16 of the largest), not zero
    W = np.random.default_rng(seed).standard_normal((D, V))
    W[D - 1] = W[D - 2]
    r = checks.check_reference(probe_of(("a", (W.T.copy(), W))), FP32)
    assert r.reason == "a: the head W = T Z^T is rank deficient: T is singular"
    assert checks.memory_from_maps(W.T.copy(), W) is None


def test_numerical_rank_tolerance_is_matrix_ranks():
    sv = np.array([1.0, 1e-10])
    tol = 8 * np.finfo(np.float64).eps
    assert checks.numerically_full_rank(np.array([1.0, 1.01 * tol]), (2, 8))
    assert not checks.numerically_full_rank(np.array([1.0, tol]), (2, 8))
    assert checks.numerically_full_rank(sv, (2, 8)) == (np.linalg.matrix_rank(np.diag(sv) @ np.eye(2, 8)) == 2)


def test_conditioning_ladder_top_rung_exactly_at_the_limit():
    # here 16 unit(2e4) is exactly RESOLVABLE = 0.1 (in floating point): the rung 2e4 is resolvable and kept
    # (the limit is the quotient RESOLVABLE / (TAU unit), not its floor division, which gives 19999)
    ctx = Context("float32", 2.528953552246094e-07, V, 1)
    assert 16 * ctx.unit(2e4) == 0.1 and 0.1 / (16 * ctx.unit(1.0)) == 2e4
    assert checks.conditioning_ladder(ctx) == [1e2, 1e4, 2e4]


def test_conditioning_attack_state_exactly_at_the_resolvable_limit_is_judged():
    # 16 unit(2e4) == RESOLVABLE exactly in this context, and the pair's cond(T) is exactly 2e4
    ctx = Context("float32", 2.528953552246094e-07, V, 1)
    pair = diagonal_pair([2e4, 1.0])
    assert checks.interface(*pair)["cond_T"] == 2e4 and 16 * ctx.unit(2e4) == 0.1
    r = checks.check_conditioning(probe_of(("zeroed L", pair, {"attack": "L"})), ctx)
    assert [d.get("measure", "")[:15] for d in rows_of(r, "zeroed L")] == ["penrose residua", "||W E - I||_F /"]


def test_scale_safe_range_ends_at_fmax_over_64_not_below_it():
    """fp16: fmax / 64 = 65504 / 64 = 1023.5. A refusal at max(|h|) = 1023.25 (inside the safe range) is a
    failure; at 1024 (outside it) a refusal is allowed. Pins the exact boundary, fractional part included."""
    fp16 = Context("float16", 2.0**-11, V, D)
    tiny = 2.0**-14
    for top, verdict in ((1023.25, "fail"), (1024.0, "pass")):
        hid = np.full((2, D), 0.5)
        hid[0, 0] = top
        base = np.full((2, V), 0.75)
        p = Probe(facts={"max": 65504.0, "tiny": tiny, "scaled": [{"exponent": 0, "raised": "OverflowError: no"}]},
                  arrays={"base": base, "hidden": hid})
        assert checks.check_scale(p, fp16).verdict == verdict


# ---- retraction ------------------------------------------------------------------------------------

STEPS = (2.0**-5, 2.0**-6)


def _polar(x):
    u, _, vt = np.linalg.svd(x, full_matrices=False)
    return u @ vt


def _unit_direction(seed=5):
    """A V x D direction with ||N||_F = ||Z||_F = sqrt(D): residuals added along it are relative."""
    n = np.random.default_rng(seed).standard_normal((V, D))
    return n * math.sqrt(D) / np.linalg.norm(n)


def retraction_probe(R0=None, RQ=None, Y=None, X=None, maps_memory=None, steps=STEPS, memory_dtype="float64",
                     **facts):
    """The arrays probe_retraction returns, for an exact float64 polar retraction unless overridden:
    Y and X map a step t (and X:t) to the point after and before post_step."""
    Z = orthonormal(V, D, 0)
    Q = orthonormal(D, D, 1)
    G = np.random.default_rng(2).standard_normal((V, D))
    xi = G - Z @ (Z.T @ G)
    xi *= math.sqrt(D) / np.linalg.norm(xi)
    Zm = Z if maps_memory is None else maps_memory
    p = Probe(facts={"post_step": True, "memory": "Z", "memory_dtype": memory_dtype, "steps": list(steps),
                     **facts})
    p.add_state("state", Zm.copy(), Zm.T.copy())
    p.arrays.update({"Z": Z, "R0": Z.copy() if R0 is None else R0(Z), "ZQ": Z @ Q,
                     "RQ": Z @ Q if RQ is None else RQ(Z @ Q)})
    for t in steps:
        x = Z + t * xi if X is None else X(t, Z)
        p.arrays[f"X:{t!r}"] = x
        p.arrays[f"Y:{t!r}"] = _polar(x) if Y is None else Y(t, x)
    return p


def retraction_row(result, state, measure):
    return [d for d in result.details if d["state"] == state and d.get("measure", "").startswith(measure)]


def test_retraction_an_exact_retraction_passes_every_measurement():
    r = checks.check_retraction(retraction_probe(), FP32)
    assert r.verdict == "pass" and r.threshold == checks.TAU
    order = retraction_row(r, "first order", "order")[0]
    assert 1.95 < order["raw"] < 2.05 and order["residuals"][0] > order["residuals"][1]
    # the worst ratio: the residual at t = 2^-5 in units of t^2 (about 1/2 for the polar map)
    assert r.value == pytest.approx(order["residuals"][0] / STEPS[0] ** 2, rel=1e-12)
    assert 0.3 < r.value < 1


@pytest.mark.parametrize("which", ["R0", "RQ"])
def test_retraction_fixed_point_displacement_in_units_of_u_at_tau(which):
    N = _unit_direction()
    for factor, verdict in ((0.999, "pass"), (1.001, "fail")):
        shift = factor * checks.TAU * UNIT32
        r = checks.check_retraction(retraction_probe(**{which: lambda z: z + shift * N}), FP32)
        label = "R(Z, 0)" if which == "R0" else "R(Z Q, 0)"
        row = retraction_row(r, label, "displacement")[0]
        assert row["verdict"] == verdict and row["raw"] == pytest.approx(shift, rel=1e-9)
        assert row["ratio"] == pytest.approx(factor * checks.TAU, rel=1e-9)
        assert r.verdict == verdict
        if verdict == "fail":
            assert r.reason.startswith(f"{label}: displacement") and r.value == pytest.approx(factor * 16, rel=1e-9)


def test_retraction_non_finite_fixed_points_fail_at_once():
    for which in ("R0", "RQ"):
        r = checks.check_retraction(retraction_probe(**{which: lambda z: z * np.nan}), FP32)
        assert r.verdict == "fail" and "non-finite" in r.reason and r.value is None
        assert not retraction_row(r, "first order", "order")


def test_retraction_order_threshold_is_one_and_a_half():
    N = _unit_direction()
    for p, verdict in ((1.5, "pass"), (1.45, "fail")):
        r = checks.check_retraction(retraction_probe(Y=lambda t, x: x + 0.5 * t**p * N), FP32)
        row = [d for d in r.details if d["state"] == "first order"][0]
        assert row["verdict"] == verdict and row["raw"] == pytest.approx(p, abs=1e-9)
        assert row["residuals"] == pytest.approx([0.5 * STEPS[0] ** p, 0.5 * STEPS[1] ** p], rel=1e-9)
    assert "scales as t^1.4, not t^2" in r.reason


def test_retraction_order_is_fitted_over_the_ratio_of_the_steps():
    N = _unit_direction()
    steps = (2.0**-5, 2.0**-7)
    r = checks.check_retraction(retraction_probe(Y=lambda t, x: _polar(x) + 0.25 * t**3 * N, steps=steps), FP32)
    row = [d for d in r.details if d["state"] == "first order"][0]
    assert row["raw"] == pytest.approx(2.0, abs=0.02) and row["measure"].endswith("(t = 0.03125, 0.0078125)")


def test_retraction_no_move_at_all_has_no_order():
    r = checks.check_retraction(retraction_probe(Y=lambda t, x: x.copy()), FP32)
    row = [d for d in r.details if d["state"] == "first order"][0]
    assert row["verdict"] == "fail" and math.isnan(row["raw"]) and "no order can be fitted" in row["reason"]


def test_retraction_residual_at_the_larger_step_in_units_of_t_squared_at_tau():
    N = _unit_direction()
    for a, verdict in ((15.9, "pass"), (16.1, "fail")):
        r = checks.check_retraction(retraction_probe(Y=lambda t, x: x + a * t**2 * N), FP32)
        row = retraction_row(r, "t = 0.03125", "||post_step(Z + t xi)")[0]
        assert row["verdict"] == verdict and row["ratio"] == pytest.approx(a, rel=1e-9)
        assert row["raw"] == pytest.approx(a * STEPS[0] ** 2, rel=1e-9)
        assert not retraction_row(r, "t = 0.015625", "||post_step(Z + t xi)")  # judged at the larger step only


def _scaled(b):
    return lambda t, z: z * math.sqrt(1 + b)


@pytest.mark.parametrize("before,after,verdict", [(2.0**-10, 0.49 * 2.0**-10, "pass"),
                                                  (2.0**-10, 0.51 * 2.0**-10, "fail"),
                                                  (18 * UNIT32, 15.9 * UNIT32, "pass"),
                                                  (18 * UNIT32, 16.1 * UNIT32, "fail")])
def test_retraction_must_land_on_the_manifold_or_half_way_nearer(before, after, verdict):
    r = checks.check_retraction(retraction_probe(X=_scaled(before), Y=lambda t, x: x / math.sqrt(1 + before)
                                                 * math.sqrt(1 + after)), FP32)
    for t in STEPS:
        row = retraction_row(r, f"t = {t:g}", "||Y^T Y - I||_2")[0]
        assert row["verdict"] == verdict
        assert row["before"] == pytest.approx(before, rel=1e-6) and row["raw"] == pytest.approx(after, rel=1e-6)
    if verdict == "fail":
        assert "off the manifold" in r.reason


def test_retraction_non_finite_result_of_a_step_fails():
    r = checks.check_retraction(retraction_probe(Y=lambda t, x: x * np.nan if t == STEPS[1] else _polar(x)), FP32)
    assert r.verdict == "fail" and "t = 0.015625: post_step returned non-finite values" in r.reason
    assert not [d for d in r.details if d["state"] == "first order"]


def test_retraction_resolvable_while_sixteen_noise_is_half_the_smaller_step_squared():
    # the noise is the larger of the memory's unit and what post_step(Z) moved: 16 noise vs (t/2)^2 / 2
    N = _unit_direction()
    edge = 0.5 * STEPS[1] ** 2 / checks.TAU
    for factor, resolved in ((0.999999, True), (1.000001, False)):
        r = checks.check_retraction(retraction_probe(R0=lambda z: z + factor * edge * N), FP64)
        rows = [d for d in r.details if d["state"] == "first order"]
        assert (rows[0]["verdict"] == "inconclusive") is not resolved
    assert r.verdict == "fail" and r.reason.startswith("R(Z, 0)")  # a failure in fp64 units
    assert "hides the O(t^2) residual at t = 0.015625" in rows[0]["reason"]
    for dtype, resolved in (("float32", True), ("float16", False), ("bfloat16", False)):
        r = checks.check_retraction(retraction_probe(memory_dtype=dtype), FP32)
        assert (r.verdict == "inconclusive") is not resolved, dtype
        if not resolved:
            assert f"the memory is {dtype}" in r.reason


def test_retraction_without_post_step_or_memory_is_inconclusive():
    r = checks.check_retraction(Probe(facts={"post_step": False}), FP32)
    assert r.verdict == "inconclusive" and "no post_step" in r.reason and r.details[0]["state"] == "post_step"
    r = checks.check_retraction(Probe(facts={"post_step": True}), FP32)
    assert r.verdict == "inconclusive" and "no trainable V x D tensor" in r.reason


@pytest.mark.parametrize("apart,judged", [(0.099, True), (0.101, False)])
def test_retraction_judges_only_the_memory_the_maps_use(apart, judged):
    Z = orthonormal(V, D, 0)
    # a rotation in the plane of two columns moves Z by apart (relative): sqrt(4 (1 - cos a) / D)
    angle = math.acos(1 - apart**2 * D / 4)
    rot = np.eye(D)
    rot[:2, :2] = [[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]]
    r = checks.check_retraction(retraction_probe(maps_memory=Z @ rot), FP32)
    assert (r.verdict == "pass") is judged
    if not judged:
        assert r.verdict == "inconclusive" and "0.101 (relative) from the Z the maps use" in r.reason


def test_retraction_maps_that_show_no_memory_do_not_stop_the_judging():
    for maps in (np.full((V, D), np.nan), np.zeros((V, D))):
        assert checks.check_retraction(retraction_probe(maps_memory=maps), FP32).verdict == "pass"


def test_stiefel_distance_and_memory_from_maps():
    Z = orthonormal(V, D, 3)
    assert checks.stiefel_distance(Z * math.sqrt(1 + 2.0**-8)) == pytest.approx(2.0**-8, rel=1e-9)
    y = Z.copy()
    y[:, 0] *= math.sqrt(1 - 2.0**-6)
    assert checks.stiefel_distance(y) == pytest.approx(2.0**-6, rel=1e-9)  # a shrinking column counts too
    E, W = maps(cond=100.0)
    Zr, _ = pit_pair(V, D, 100.0, 0)
    assert np.abs(checks.memory_from_maps(E, W) - Zr).max() < 1e-12
    assert checks.memory_from_maps(E * np.nan, W) is None
    assert checks.memory_from_maps(E, np.zeros_like(W)) is None


def test_a_failure_without_a_failing_ratio_shows_no_ratio():
    v = Verdicts("x", FP32)
    v.ratio("ok", UNIT32, UNIT32, "error")
    v.fail("broken", "non-finite")
    r = v.done()
    assert r.verdict == "fail" and r.value is None and r.measured is None
    v = Verdicts("x", FP32)
    v.ratio("bad", 20 * UNIT32, UNIT32, "error")
    v.fail("broken", "non-finite")
    r = v.done()
    assert r.value == pytest.approx(20) and r.measured == pytest.approx(20 * UNIT32)
    v = Verdicts("x", FP32)
    v.ratio("edge", 16 * UNIT32, UNIT32, "error")
    v.fail("broken", "non-finite")
    assert v.done().value is None  # 16 passes: not the failure's size


# ---- contract: precision judged on computed maps ------------------------------------------------------

def test_contract_does_not_judge_the_initial_state_or_unchanged_maps():
    exact = _half_exact(1.0)  # every entry exact in bfloat16
    E, W = maps()
    computed = (E + 1e-3 / 3, W + 1e-3 / 3)
    facts = {"embed": {"shape": [2, 3, D], "dtype": "float32"}, "logits": {"shape": [2, 3, V], "dtype": "float32"},
             "tensors": []}
    p = probe_of(("init", exact, {"at_init": True}), ("generic", computed), **facts)
    r = checks.check_contract(p, FP32)
    assert r.verdict == "pass" and not rows_of(r, "init")
    assert len(rows_of(r, "generic")) == 4  # two maps, two narrower formats
    # without the flag the same values are judged
    assert checks.check_contract(probe_of(("init", exact), ("generic", computed), **facts), FP32).verdict == "fail"
    # a map that did not move since initialisation shows nothing computed: that map is not judged
    p = probe_of(("init", exact, {"at_init": True}), ("generic", (exact[0], computed[1])), **facts)
    r = checks.check_contract(p, FP32)
    assert r.verdict == "inconclusive" and "generic: the embedding did not change from initialisation" in r.reason
    assert [d["measure"] for d in rows_of(r, "generic") if "measure" in d] == [
        "head entries exact in bfloat16", "head entries exact in float16"]
    p = probe_of(("init", exact, {"at_init": True}), ("generic", (computed[0], exact[1])), **facts)
    assert "the head did not change" in checks.check_contract(p, FP32).reason
    # a dtype with no narrower format judges nothing, so nothing is unresolved
    bf = {**facts, "embed": {"shape": [2, 3, D], "dtype": "bfloat16"},
          "logits": {"shape": [2, 3, V], "dtype": "bfloat16"}}
    assert checks.check_contract(probe_of(("init", exact, {"at_init": True}), ("generic", exact), **bf),
                                 BF16).verdict == "pass"


def test_retraction_one_zero_residual_has_no_order():
    r = checks.check_retraction(retraction_probe(Y=lambda t, x: x.copy() if t == STEPS[1] else _polar(x)), FP32)
    row = [d for d in r.details if d["state"] == "first order"][0]
    assert math.isnan(row["raw"]) and row["residuals"][1] == 0.0 and "no order can be fitted" in r.reason


def test_retraction_noise_is_the_larger_displacement_of_the_two_fixed_points():
    # R(Z, 0) exact, R(Z Q, 0) at the edge: the noise follows the larger one
    N = _unit_direction()
    edge = 0.5 * STEPS[1] ** 2 / checks.TAU
    r = checks.check_retraction(retraction_probe(RQ=lambda z: z + 1.000001 * edge * N), FP64)
    assert [d for d in r.details if d["state"] == "first order"][0]["verdict"] == "inconclusive"


@pytest.mark.parametrize("by,verdict,start", [("probe", "fail", "the target's embedding has no gradient path"),
                                              ("breach", "fail", "boom at step 1"),
                                              ("target", "fail", "the target raised boom at step 1 at t.py:3")])
def test_judge_reads_who_raised_from_json_decoded_facts(by, verdict, start):
    # facts come back through JSON: the strings are not the interned literals
    facts = json.loads(json.dumps({"error": "boom at step 1", "where": "t.py:3", "by": by,
                                   "breach": "the target's embedding has no gradient path"}))
    r = checks.judge("penrose", Probe(facts=facts), FP32)
    assert r.verdict == verdict and r.reason.startswith(start)
    if by == "probe":
        assert r.reason.endswith("(pitcheck's probe stopped at t.py:3: boom at step 1)")
        facts["breach"] = ""
        r = checks.judge("penrose", Probe(facts=facts), FP32)
        assert r.verdict == "error" and r.reason.startswith("pitcheck's probe stopped at t.py:3: boom at step 1")


def test_retraction_order_spans_the_largest_and_smallest_of_more_steps():
    steps = (2.0**-5, 2.0**-6, 2.0**-7)
    r = checks.check_retraction(retraction_probe(steps=steps), FP32)
    row = [d for d in r.details if d["state"] == "first order"][0]
    assert row["measure"].endswith("(t = 0.03125, 0.0078125)") and 1.95 < row["raw"] < 2.05


# ---- the validator's dtypes, read off the formats registry ---------------------------------------------

@pytest.mark.parametrize("dtype,u,width,narrower", [
    ("float64", 2.0**-53, 53, ("float32",)),  # bfloat16 and float16 values are float32 values
    ("float32", 2.0**-24, 24, ("bfloat16", "float16")),
    ("bfloat16", 2.0**-8, 8, ()),  # float16 has more bits, bfloat16 more range: neither holds the other
    ("float16", 2.0**-11, 11, ()),
])
def test_validator_dtype_tables(dtype, u, width, narrower):
    from pitcheck.verbs.validate import dtypes

    assert dtypes.UNIT_ROUNDOFF[dtype] == u and dtypes.WIDTH[dtype] == width and dtypes.NARROWER[dtype] == narrower
    assert dtypes.DTYPES == ("float64", "float32", "bfloat16", "float16")
    assert dtypes.HALF == ("bfloat16", "float16") and dtypes.FP32_U == 2.0**-24


def test_contract_knows_8_and_4_bit_storage_and_block_scaled_wrappers():
    """float8/float4 tensors are narrower than every validated dtype; a wrapper (torchao's MXTensor) is
    judged by the elements it holds, not the dtype it reports; E8M0 scales alone hold no values."""
    E, W = maps()
    E, W = E + 1e-3 / 3, W + 1e-3 / 3
    facts = {"embed": {"shape": [2, 3, D], "dtype": "float32"}, "logits": {"shape": [2, 3, V], "dtype": "float32"}}
    cases = [({"dtype": "float8_e4m3fn"}, "parameter Z is stored in float8_e4m3fn, narrower than float32"),
             ({"dtype": "float8_e5m2fnuz"}, "parameter Z is stored in float8_e5m2fnuz, narrower than float32"),
             ({"dtype": "float32", "stored": "float4_e2m1fn_x2", "wrapper": "MXTensor"},
              "parameter Z is stored in float4_e2m1fn_x2 elements inside a MXTensor reporting float32, narrower "
              "than float32"),
             ({"dtype": "float8_e8m0fnu"}, None), ({"dtype": "float32"}, None)]
    for tensor, reason in cases:
        p = probe_of(("init", (E, W)), **facts, tensors=[{"name": "Z", "kind": "parameter", **tensor}])
        r = checks.check_contract(p, FP32)
        assert r.verdict == ("fail" if reason else "pass"), (tensor, r.reason)
        if reason:
            assert r.reason == f"Z: {reason}"


def test_wrapped_storage_reads_inner_tensors_and_metadata_dtypes():
    torch = pytest.importorskip("torch")
    from pitcheck.verbs.validate.probes import _wrapped_storage

    assert _wrapped_storage(torch.zeros(3)) == {} and _wrapped_storage(torch.nn.Parameter(torch.zeros(3))) == {}
    torchao = pytest.importorskip("torchao", reason="torchao (the MX reference) is not installed")  # noqa: F841
    from torchao.prototype.mx_formats.mx_tensor import MXTensor

    mx = MXTensor.to_mx(torch.randn(4, 64), torch.float8_e5m2, 32)
    assert mx.dtype == torch.float32 and _wrapped_storage(mx) == {"stored": "float8_e5m2", "wrapper": "MXTensor"}
    # packed FP4: the elements are uint8 bytes, their type only in the wrapper's metadata
    fp4 = MXTensor.to_mx(torch.randn(4, 64), torch.float4_e2m1fn_x2, 32)
    assert _wrapped_storage(fp4) == {"stored": "float4_e2m1fn_x2", "wrapper": "MXTensor"}


def test_a_float64_build_with_no_memory_to_take_back_may_carry_storage_rounding_and_says_so():
    # the probe found no V x D tensor to take to the manifold: what the build shows may be the stored values'
    # rounding, so the reason must not call it a defect of the code (and with one found, it does)
    E, W = rounded_maps(cond=1.0, dtype="float64")
    for tall, words in (([], "may carry"), (["Z"], "a defect of the code")):
        probe = probe_of(("step 0", rounded_maps(cond=1.0, dtype="bfloat16")),
                         ("step 40", rounded_maps(cond=1.0, dtype="bfloat16", seed=1)))
        probe.facts["shadow_start"] = {"tall": tall, "reprojected": {}}
        result = verdict("trajectory", with_shadow(probe, {"step 40": (E, W * 1.01)}), BF16W)
        assert result.verdict == ("fail" if tall else "inconclusive") and words in result.reason, result.reason
        assert ("a defect of the code" in result.reason) == bool(tall)


def test_conditioning_states_are_labelled_by_the_cond_they_reached():
    import importlib

    import torch

    from pitcheck.verbs.validate.target import build

    base = importlib.import_module("tests.zoo._base")

    def frozen_t(V_, D_, **kw):  # T cannot move: no T-side parameter for the drive
        module = base.LLtPIT(V_, D_, **kw)
        module.L_raw.requires_grad_(False)
        return module

    for factory, reachable in ((base.LLtPIT, True), (frozen_t, False)):
        module = build(factory, 128, 8, "float64", "cpu", 0)
        harness = probes.Harness(module, 128, 8, torch.float64, "cpu", 0)
        probe = probes.probe_conditioning(harness, conds=[1e2])
        state = probe.facts["states"][0]
        assert state["label"] == f"cond(T) {state['cond_reached']:.3g} (driven toward 1e+02)"
        assert (abs(state["cond_reached"] - 100) < 10) == reachable, state


# ---- the retraction's metric, gradients by parameter and map, Z measured itself, narrow reads (judging) ----

def _in_span_probe(Y):
    """A retraction probe whose move has an in-span part: X = Z + t (xi_normal + Z Omega)."""
    Z = orthonormal(V, D, 0)
    A = np.random.default_rng(3).standard_normal((D, D))
    omega = 0.5 * (A - A.T)
    G = np.random.default_rng(2).standard_normal((V, D))
    xi = G - Z @ (Z.T @ G) + Z @ omega
    xi *= math.sqrt(D) / np.linalg.norm(xi)
    return retraction_probe(X=lambda t, z: z + t * xi, Y=lambda t, x: Y(Z, x))


@pytest.mark.parametrize("metric,Y,passes", [
    ("embedded", lambda Z, x: _polar(x), True),
    # the canonical metric's move doubles the in-span part: x - Z (x - Z)^T Z, then onto the manifold
    ("canonical", lambda Z, x: _polar(x - Z @ ((x - Z).T @ Z)), True),
    # tripled: neither metric's
    (None, lambda Z, x: _polar(x - 2 * Z @ ((x - Z).T @ Z)), False)])
def test_retraction_first_order_is_judged_against_each_metric(metric, Y, passes):
    r = checks.check_retraction(_in_span_probe(Y), FP64)
    row = retraction_row(r, "first order", "order")[0]
    assert row["metric"] == metric
    if passes:
        assert r.verdict == "pass" and f"for the {metric} metric" in row["reason"]
        assert 1.95 < row[f"order_{metric}"] < 2.05 and 1.95 < row["raw"] < 2.05
        other = "canonical" if metric == "embedded" else "embedded"
        assert row[f"order_{other}"] < 1.1
        # the worst ratio is the found metric's residual in units of t^2, not the other's O(t) one
        assert r.value == pytest.approx(row["residuals"][0] / STEPS[0] ** 2, rel=1e-12) and r.value < 2
        assert retraction_row(r, f"t = {STEPS[0]:g}", "||post_step")[0]["measure"].endswith(f"({metric} metric)")
    else:
        assert r.verdict == "fail" and "a retraction for neither metric" in r.reason
        assert "scales as t^1" in r.reason and "as t^1 against the canonical" in r.reason


def test_retraction_a_residual_below_rounding_fits_no_order_for_that_metric():
    # a move with no in-span part: the canonical metric's move equals the embedded one, and a no-op at the
    # small step leaves the embedded residual exactly 0 and the canonical one at rounding level
    r = checks.check_retraction(retraction_probe(Y=lambda t, x: x.copy() if t == STEPS[1] else _polar(x)), FP32)
    row = retraction_row(r, "first order", "order")[0]
    assert math.isnan(row["order_embedded"]) and math.isnan(row["order_canonical"]) and row["metric"] is None


def test_gradients_components_name_the_parameter_and_the_map():
    good = {"autograd": 2.0, "finite_difference": 2.0, "fd_at_step": 2.0, "fd_at_half_step": 2.0, "loss_scale": 3.0}
    bad = {**good, "autograd": 2.2}  # 10 %: far above u^(2/3)
    components = [{"parameter": "Z", "map": "embed", **good}, {"parameter": "Z", "map": "logits", **bad},
                  {"parameter": "L", "map": "embed", **good}, {"parameter": "L", "map": "logits", **good}]
    total = dict(autograd=8.2, finite_difference=8.0, fd_at_step=8.0, fd_at_half_step=8.0)
    r = checks.check_gradients(grad_probe(**total, components=components), FP32)
    failed = [d["state"] for d in r.details if d["verdict"] == "fail"]
    assert failed == ["autograd vs finite differences (float32)", "gradient of Z through logits"]
    assert "gradient of Z through logits: directional derivative error 0.0909" in r.reason
    row = rows_of(r, "gradient of Z through logits")[0]
    assert row["ratio"] == pytest.approx((0.2 / 2.2) / (U32 ** (2 / 3) * 3.0 / 2.2), rel=1e-9)
    # a component's unit is its own measured noise where that is larger, and its own loss scale sets theory
    noisy = {**good, "autograd": 2.02, "fd_at_half_step": 2.005}
    r = checks.check_gradients(grad_probe(autograd=2.0, finite_difference=2.0, fd_at_step=2.0, fd_at_half_step=2.0,
                                          components=[{"parameter": "Z", "map": "embed", **noisy}]), FP32)
    row = rows_of(r, "gradient of Z through embed")[0]
    assert row["fd_noise"] == pytest.approx(0.005 / 2.02, rel=1e-9) and row["ratio"] == pytest.approx(4.0)
    assert r.verdict == "pass"
    # noise too large to resolve the term: shown inconclusive, the verdict left to the total
    r = checks.check_gradients(grad_probe(autograd=2.0, finite_difference=2.0, fd_at_step=2.0, fd_at_half_step=2.0,
                                          components=[{"parameter": "Z", "map": "embed", **good,
                                                       "fd_at_half_step": 2.1}]), FP32)
    assert r.verdict == "pass"
    row = rows_of(r, "gradient of Z through embed")[0]
    assert row["verdict"] == "inconclusive" and "the total judges it" in row["reason"]
    big_scale = {**good, "loss_scale": 30.0, "autograd": 2.0 + 1e-3}
    r = checks.check_gradients(grad_probe(autograd=2.0, finite_difference=2.0, fd_at_step=2.0, fd_at_half_step=2.0,
                                          components=[{"parameter": "Z", "map": "embed", **big_scale}]), FP32)
    row = rows_of(r, "gradient of Z through embed")[0]
    scale = 2.0 + 1e-3
    assert row["ratio"] == pytest.approx((1e-3 / scale) / (U32 ** (2 / 3) * 30.0 / scale), rel=1e-9)


def _trajectory_with_memory(gap_steps, memory=None, name="Z"):
    """Exact maps at cond 1 beside a memory measured at each state (its gap from the manifold)."""
    Z, L = pit_pair(VW, D, 1.0, 0)
    E, W = reference.embedding_matrix(Z, L), reference.head_matrix(Z, L)
    E2, W2 = rounded_maps(cond=1.0, seed=1, dtype="float64")
    p = probe_of(("step 0", (E, W), {"memory_orthonormality": gap_steps[0]}),
                 ("step 40", (E2, W2), {"memory_orthonormality": gap_steps[1]}), memory=name)
    p.arrays["memory:step 0"] = Z if memory is None else memory
    return p


def test_trajectory_measures_the_memory_itself_where_it_is_the_maps_memory():
    ctx = Context("float32", U32, VW, D)
    r = checks.check_trajectory(_trajectory_with_memory([1e-8, 1e-3]), ctx)
    assert r.verdict == "fail" and "step 40: memory orthonormality ||Z^T Z - I||_2 of Z 0.001" in r.reason
    assert "penrose residual (with Z itself 0.001 off the manifold)" in [
        d["measure"] for d in rows_of(r, "step 40")][0]
    assert r.verdict == "fail"
    # the measured gap passes although the maps' own W E would say the same: the memory row carries both
    r = checks.check_trajectory(_trajectory_with_memory([1e-8, 1e-8]), ctx)
    assert r.verdict == "pass" and [d for d in r.details if "maps_orthonormality" in d]
    # a tensor that is not the maps' memory (further than MEMORY_MATCH from it) is not taken as Z
    far = orthonormal(VW, D, 5)
    r = checks.check_trajectory(_trajectory_with_memory([1e-8, 1e-3], memory=far), ctx)
    assert r.verdict == "pass", r.reason
    assert all("as the maps show it" in d["measure"] for d in r.details if "orthonormality" in d.get("measure", ""))
    # within MEMORY_MATCH (a relative 0.09 apart): still the memory
    Z, _ = pit_pair(VW, D, 1.0, 0)
    near = Z + 0.09 * np.linalg.norm(Z) * far / np.linalg.norm(far)
    r = checks.check_trajectory(_trajectory_with_memory([1e-8, 1e-3], memory=near), ctx)
    assert r.verdict == "fail"
    near = Z + 0.11 * np.linalg.norm(Z) * far / np.linalg.norm(far)
    assert checks.check_trajectory(_trajectory_with_memory([1e-8, 1e-3], memory=near), ctx).verdict == "pass"


@pytest.mark.parametrize("read,verdict", [(False, "pass"), (True, "fail"), (None, "fail")])
def test_contract_a_narrow_tensor_fails_only_if_the_maps_read_it(read, verdict):
    tensor = {"name": "z8", "dtype": "float8_e4m3fn", "kind": "buffer"}
    if read is not None:
        tensor["read_by_maps"] = read
    facts = {"embed": {"shape": [2, 3, D], "dtype": "float32"}, "logits": {"shape": [2, 3, V], "dtype": "float32"},
             "tensors": [tensor]}
    r = checks.check_contract(probe_of(**facts), FP32)
    assert r.verdict == verdict
    if read is False:
        assert rows_of(r, "z8")[0]["reason"].endswith("neither map reads it (zeroing it changed neither E nor W)")
    else:
        assert "buffer z8 is stored in float8_e4m3fn, narrower than float32" in r.reason


def test_the_float64_builds_reason_gives_the_dtypes_threshold_and_each_measure_its_verdict():
    above = shadowed("trajectory", 1.1 * TAU * FINE)
    m = checks.interface(*rounded_maps(cond=1.0, dtype="bfloat16", seed=1))
    assert f"(threshold {TAU * BF16W.unit(m['cond_T']):.2g})" in above.reason
    below = shadowed("trajectory", 0.9 * TAU * FINE)
    verdicts = lambda r: {d["verdict"] for d in r.details if d.get("measure", "").startswith("float64 build:")}
    assert verdicts(above) == {"fail"} and verdicts(below) == {"pass"}


def test_a_float64_build_storing_float8_is_not_consulted_under_bfloat16():
    # a float8 tensor in the build (an FP8 cast cache): coarser than bfloat16, so the build shows nothing finer
    E, W = rounded_maps(cond=1.0, dtype="float64")
    probe = probe_of(("step 0", rounded_maps(cond=1.0, dtype="bfloat16")),
                     ("step 40", rounded_maps(cond=1.0, dtype="bfloat16", seed=1)))
    probe.facts["shadow_storage"] = "float8_e4m3fn"
    result = verdict("trajectory", with_shadow(probe, {"step 40": (E, W * 1.01)}), BF16W)
    assert result.verdict == "pass" and "not consulted: it stores float8_e4m3fn" in [d.get("reason") for d in result.details]


def test_gradients_a_component_that_no_gradient_reaches_passes_at_zero():
    zero = {"autograd": 0.0, "finite_difference": 0.0, "fd_at_step": 0.0, "fd_at_half_step": 0.0, "loss_scale": 3.0}
    r = checks.check_gradients(grad_probe(autograd=2.0, finite_difference=2.0, fd_at_step=2.0, fd_at_half_step=2.0,
                                          components=[{"parameter": "Z", "map": "embed", **zero}]), FP32)
    row = rows_of(r, "gradient of Z through embed")[0]
    assert r.verdict == "pass" and row["raw"] == 0.0 and row["reason"].startswith("no gradient reaches it")
    # one of the two zero is judged as any other
    r = checks.check_gradients(grad_probe(autograd=2.0, finite_difference=2.0, fd_at_step=2.0, fd_at_half_step=2.0,
                                          components=[{"parameter": "Z", "map": "embed", **zero, "autograd": 1.0}]),
                               FP32)
    assert r.verdict == "fail" and "gradient of Z through embed" in r.reason


def test_gradients_a_difference_where_no_parameter_has_a_gradient_is_infinite():
    f = dict(autograd=2.0, finite_difference=2.0, fd_at_step=2.0, fd_at_half_step=2.0, cond_T=1.0,
             autograd_under_test=2.0, reference_dtype="float64", state_transfer_error=0.0,
             autograd_magnitude=2.0)
    for difference, verdict in ((0.0, "pass"), (1e-3, "fail")):
        blocks = [{"parameter": "Z", "norm": 0.0, "difference": difference}]
        r = checks.check_gradients(grad_probe(**f, gradient_blocks=blocks), BF16)
        row = rows_of(r, "bfloat16 vs float64 gradient of Z")[0]
        assert row["raw"] == (0.0 if difference == 0 else math.inf) and r.verdict == verdict


def test_trajectory_measures_the_memory_at_a_t_with_eigenvalues_below_one():
    # W W^T = T^2 with every eigenvalue 1/4: the maps still show their memory
    ctx = Context("float32", U32, VW, D)
    p = _trajectory_with_memory([1e-8, 1e-3])
    for label in ("step 0", "step 40"):
        p.arrays[f"E:{label}"], p.arrays[f"W:{label}"] = 2 * p.arrays[f"E:{label}"], 0.5 * p.arrays[f"W:{label}"]
    r = checks.check_trajectory(p, ctx)
    assert "memory orthonormality ||Z^T Z - I||_2 of Z" in r.reason


def test_retraction_maps_that_cannot_show_their_memory_leave_post_step_judged():
    # a singular head (a zero column: W W^T has eigenvalue 0) shows no memory to match: post_step is judged
    Z = orthonormal(V, D, 0).copy()
    Z[:, -1] = 0.0
    r = checks.check_retraction(retraction_probe(maps_memory=Z), FP32)
    assert r.verdict == "pass", r.reason


def test_the_one_process_checks_are_the_ten_judged_by_validate():
    assert list(checks.CHECKS) == ["contract", "penrose", "reference", "conditioning", "gradients", "trajectory",
                                   "retraction", "checkpoint", "bad_input", "scale"]


def test_gradients_an_unresolvable_term_names_its_threshold():
    good = {"autograd": 2.0, "finite_difference": 2.0, "fd_at_step": 2.0, "fd_at_half_step": 2.1, "loss_scale": 3.0}
    r = checks.check_gradients(grad_probe(autograd=2.0, finite_difference=2.0, fd_at_step=2.0, fd_at_half_step=2.0,
                                          components=[{"parameter": "Z", "map": "embed", **good}]), FP32)
    row = rows_of(r, "gradient of Z through embed")[0]
    assert f"(threshold {checks.TAU * 0.1 / 2.0:.2g})" in row["reason"]


def test_retraction_a_non_finite_result_at_one_step_leaves_the_other_step_judged():
    p = retraction_probe(Y=lambda t, x: x * np.nan if t == STEPS[0] else _polar(x))
    r = checks.check_retraction(p, FP32)
    assert r.verdict == "fail" and f"t = {STEPS[0]:g}: post_step returned non-finite values" in r.reason
    assert retraction_row(r, f"t = {STEPS[1]:g}", "||Y^T Y - I||_2")[0]["verdict"] == "pass"
