"""The validator's judging (pitcheck.validate.checks) on synthetic probes: every check must fail a case
built to be wrong and pass one built to be right, without a target process (fast)."""
import math

import numpy as np
import pytest

from pitcheck import reference
from pitcheck.validate import TAU, checks
from pitcheck.validate.checks import Context
from pitcheck.validate.probes import Probe
from tests.helpers import pit_pair

V, D = 256, 8
FP32 = Context("float32", 2.0**-24, V, D)
BF16 = Context("bfloat16", 2.0**-8, V, D)


def rounded(x, dtype):
    import torch

    return torch.from_numpy(np.asarray(x, dtype=np.float64)).to(getattr(torch, dtype)).double().numpy()


def maps(cond=10.0, dtype="float32", seed=0, one_solve=False, stretch=0.0):
    """E and W of a PIT pair as a target in `dtype` would return them (float64 values rounded)."""
    Z, L = pit_pair(V, D, cond, seed)
    Z = Z * (1.0 + stretch)
    if one_solve:
        import scipy.linalg

        E = scipy.linalg.solve_triangular(L, Z.T, lower=True, trans="T").T
    else:
        E = reference.embedding_matrix(Z, L)
    W = reference.head_matrix(Z, L)
    return rounded(E, dtype), rounded(W, dtype)


def probe_of(*states, **facts):
    p = Probe(facts=dict(facts))
    for label, (E, W) in states:
        p.add_state(label, E, W)
    return p


def verdict(name, probe, ctx=FP32):
    return checks.judge(name, probe, ctx)


# ---- penrose / reference / trajectory ----------------------------------------------------------

@pytest.mark.parametrize("check", ["penrose", "reference", "trajectory"])
def test_pair_checks_pass_a_correct_pair_and_fail_one_solve(check):
    # two states that differ (a trajectory whose maps never moved is inconclusive, not a pass)
    good = verdict(check, probe_of(("start", maps(cond=1.0)), ("generic", maps())))
    assert good.verdict == "pass", good.reason
    assert good.value < 4  # measured 0.1-2: a correct pair is O(1) units
    bad = verdict(check, probe_of(("start", maps(cond=1.0)), ("generic", maps(one_solve=True))))
    assert bad.verdict == "fail" and bad.value > 1e3


def test_penrose_catches_a_memory_off_the_manifold():
    result = verdict("penrose", probe_of(("init", maps(cond=1.0, stretch=1e-4))))
    assert result.verdict == "fail"
    assert verdict("penrose", probe_of(("init", maps(cond=1.0, stretch=1e-8)))).verdict == "pass"


def test_penrose_ratio_is_in_units_of_cond_u_not_eps():
    # a pair with a known W E - I: drift 2e-5 relative at cond 1 in fp32 is 2e-5 / unit
    E, W = maps(cond=1.0, dtype="float64")
    W = W * (1 + 2e-5)
    result = verdict("penrose", probe_of(("x", (E, W))))
    drift = [d for d in result.details if d["measure"].startswith("||W E - I||")][0]
    assert drift["ratio"] == pytest.approx(2e-5 * math.sqrt(D) / math.sqrt(D) / FP32.unit(1.0), rel=1e-3)


@pytest.mark.parametrize("cond", [1.0, 1e3])
@pytest.mark.parametrize("s", [1e-3, -1e-3])
def test_memory_orthonormality_is_read_off_the_maps_whatever_t(cond, s):
    # Z (1 + s) has Z^T Z = (1 + s)^2 I: ||Z^T Z - I||_2 = |2 s + s^2|, whatever T is
    E, W = maps(cond=cond, dtype="float64", stretch=s)
    assert checks.memory_orthonormality(E, W) == pytest.approx(abs(2 * s + s * s), rel=1e-6)


def test_interface_reports_the_worst_penrose_condition():
    from pitcheck import metrics

    E, W = maps(cond=10.0, dtype="float64", one_solve=True)
    pen = metrics.penrose_residuals(E, W.T)
    assert max(pen.values()) > 1.5 * min(pen.values())
    assert checks.interface(E, W)["penrose"] == max(pen.values())


def test_reference_ratio_is_the_forward_error_in_units_of_cond():
    # E off by a relative 1e-5 from the exact pseudo-inverse of W: the forward error 1e-5 over unit(cond)
    cond, delta = 100.0, 1e-5
    E, W = maps(cond=cond, dtype="float64")
    result = verdict("reference", probe_of(("x", (E * (1 + delta), W))))
    row = result.details[0]
    assert row["raw"] == pytest.approx(delta, rel=1e-6)
    assert row["ratio"] == pytest.approx(delta / FP32.unit(row["cond_T"]), rel=1e-6)
    assert row["cond_T"] == pytest.approx(cond, rel=1e-6)


def test_trajectory_catches_drift_that_appears_after_steps():
    states = [(f"step {k}", maps(cond=1.0, stretch=s)) for k, s in ((0, 0.0), (10, 1e-6), (100, 1e-3))]
    result = verdict("trajectory", probe_of(*states))
    assert result.verdict == "fail" and "step 100" in result.reason and "step 0" not in result.reason


def test_bf16_cannot_resolve_a_badly_conditioned_pair():
    result = verdict("penrose", probe_of(("generic", maps(cond=1e3, dtype="bfloat16"))), BF16)
    assert result.verdict == "inconclusive" and "cannot resolve" in result.reason
    assert verdict("penrose", probe_of(("init", maps(cond=1.0, dtype="bfloat16"))), BF16).verdict == "pass"


def test_singular_maps_fail_rather_than_being_unresolvable():
    # all-zero maps: cond(T) is infinite, so every unit is; that is a singular T, not a hard question
    zeros = (np.zeros((V, D)), np.zeros((D, V)))
    for check in ("penrose", "trajectory"):
        result = verdict(check, probe_of(("a", zeros), ("b", maps())))
        assert result.verdict == "fail" and "rank deficient" in result.reason


def test_trajectory_that_never_moved_is_inconclusive():
    E, W = maps()
    result = verdict("trajectory", probe_of(("step 0", (E, W)), ("step 20", (E.copy(), W.copy()))))
    assert result.verdict == "inconclusive" and "did not change" in result.reason
    assert verdict("trajectory", probe_of(("step 0", (E, W)))).verdict == "inconclusive"


def test_non_finite_maps_fail():
    E, W = maps()
    E[3, 1] = np.nan
    assert verdict("penrose", probe_of(("x", (E, W)))).verdict == "fail"


# ---- contract ------------------------------------------------------------------------------------

def contract_probe(dtype_values, out_dtype="float32", tensor_dtype="float32"):
    E, W = maps(dtype=dtype_values)
    return probe_of(("init", (E, W)), ("generic", (E, W)),
                    embed={"shape": [2, 3, D], "dtype": out_dtype}, logits={"shape": [2, 3, V], "dtype": out_dtype},
                    tensors=[{"name": "Z", "dtype": tensor_dtype, "kind": "parameter"}])


def test_contract_passes_float32_values_and_fails_bfloat16_ones():
    assert verdict("contract", contract_probe("float32")).verdict == "pass"
    bad = verdict("contract", contract_probe("bfloat16"))
    assert bad.verdict == "fail" and "bfloat16" in bad.reason


def test_contract_fails_narrow_storage_and_wrong_output_dtype():
    assert "stored in bfloat16" in verdict("contract", contract_probe("float32", tensor_dtype="bfloat16")).reason
    assert "returned float16" in verdict("contract", contract_probe("float32", out_dtype="float16")).reason


def test_contract_sees_float32_arithmetic_under_a_float64_request():
    ctx = Context("float64", 2.0**-53, V, D)
    ok = contract_probe("float64", out_dtype="float64", tensor_dtype="float64")
    assert verdict("contract", ok, ctx).verdict == "pass"
    bad = contract_probe("float32", out_dtype="float64", tensor_dtype="float64")
    assert "float32" in verdict("contract", bad, ctx).reason


# ---- conditioning --------------------------------------------------------------------------------

def test_conditioning_fails_a_silently_singular_state_and_passes_a_ladder():
    ladder = checks.conditioning_ladder(FP32)
    assert ladder[-1] >= 1e4 and TAU * FP32.unit(ladder[-1]) <= checks.RESOLVABLE
    good = [(f"cond {c:.0e}", maps(cond=c)) for c in ladder]
    p = probe_of(*good)
    assert verdict("conditioning", p).verdict == "pass"
    E, W = maps(cond=1.0)
    p.add_state("zeroed L", np.full_like(E, np.inf), W, attack="L")
    result = verdict("conditioning", p)
    assert result.verdict == "fail" and "singular" in result.reason


def test_conditioning_is_inconclusive_when_the_module_cannot_reach_the_ladder():
    result = verdict("conditioning", probe_of(("cond 1e+02", maps(cond=3.0))))
    assert result.verdict == "inconclusive" and "short of" in result.reason


def test_conditioning_sees_a_head_that_dropped_a_direction():
    # a pinv head with a cutoff: W loses E's smallest singular direction, so W E has an eigenvalue 0
    E, _ = maps(cond=1e4, dtype="float64")
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
    assert verdict("gradients", p, Context("float64", 2.0**-53, V, D)).verdict == expected


def test_gradients_unit_follows_the_measured_noise_of_the_differences():
    # differences that disagree by 1e-3 between t and t/2 cannot judge an error of 1e-3, but do see 0.5
    noisy = {"parameters": 2, "fd_dtype": "float32", "autograd": 1.0, "fd_at_step": 1.0, "fd_at_half_step": 1.001,
             "loss_scale": 1.0}
    ctx = Context("float32", 2.0**-24, V, D)
    assert verdict("gradients", Probe(facts={**noisy, "finite_difference": 1.001}), ctx).verdict == "pass"
    assert verdict("gradients", Probe(facts={**noisy, "finite_difference": 1.5}), ctx).verdict == "fail"


def test_checkpoint_requires_the_same_maps_after_a_resume():
    E, W = maps()
    same = probe_of(("before", (E, W)), ("loaded", (E, W)), ("uninterrupted after step", (E, W)),
                    ("resumed after step", (E, W)))
    assert verdict("checkpoint", same).verdict == "pass"
    E2, W2 = maps(seed=1)
    lost = probe_of(("before", (E, W)), ("loaded", (E2, W2)), ("uninterrupted after step", (E, W)),
                    ("resumed after step", (E2, W2)))
    assert verdict("checkpoint", lost).verdict == "fail"


def bad_input_probe(id_minus_one):
    rows = np.arange(2 * D, dtype=float).reshape(2, D)
    clean = np.ones((3, V))
    p = Probe(facts={"cases": {"id -1": id_minus_one, "empty batch": {"shape": [0, D]}}})
    p.arrays.update({"rows_0_last": rows, "clean_logits": clean, "value:empty batch": np.zeros((0, D))})
    if "shape" in id_minus_one:
        p.arrays["value:id -1"] = rows.copy()
    return p


def test_bad_input_fails_a_wrapped_negative_id_and_passes_an_error():
    assert verdict("bad_input", bad_input_probe({"raised": "IndexError: id -1"})).verdict == "pass"
    wrapped = verdict("bad_input", bad_input_probe({"shape": [2, D]}))
    assert wrapped.verdict == "fail" and "wraps" in wrapped.reason


@pytest.mark.parametrize("case", ["id V", "float ids"])
def test_bad_input_fails_finite_numbers_for_an_impossible_id(case):
    p = bad_input_probe({"raised": "IndexError"})
    p.facts["cases"][case] = {"shape": [2, D]}
    p.arrays[f"value:{case}"] = np.ones((2, D))
    result = verdict("bad_input", p)
    assert result.verdict == "fail" and f"{case} returned finite numbers" in result.reason
    p.arrays[f"value:{case}"][1] = np.nan  # NaN confined to the offending row is a clear answer
    assert verdict("bad_input", p).verdict == "pass"


def test_bad_input_requires_a_non_finite_row_to_stay_in_its_row():
    clean = np.ones((3, V))
    spread = clean.copy()
    spread[:] = np.nan
    confined = clean.copy()
    confined[1] = np.nan
    for value, expected in ((confined, ""), (spread, "spread"), (clean, "gave finite logits")):
        p = Probe(facts={"cases": {"nan hidden row": {"shape": [3, V]}}})
        p.arrays.update({"rows_0_last": np.zeros((2, D)), "clean_logits": clean, "value:nan hidden row": value})
        result = verdict("bad_input", p)
        assert result.verdict == ("fail" if expected else "pass") and expected in result.reason


def scale_probe(transform):
    rng = np.random.default_rng(0)
    hid = rng.standard_normal((4, D))
    base = rng.standard_normal((4, V))
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

    assert verdict("scale", scale_probe(exact)).verdict == "pass"

    def overflow_at_60(k, base):
        return np.full_like(base, np.nan) if k >= 60 else exact(k, base)

    result = verdict("scale", scale_probe(overflow_at_60))
    assert result.verdict == "fail" and "2^60" in result.reason

    def zeros_at(j):
        return lambda k, base: np.zeros_like(base) if k == j else exact(k, base)

    near_edge = verdict("scale", scale_probe(zeros_at(126)))
    assert near_edge.verdict == "fail" and "2^126" in near_edge.reason
    assert "finite numbers" in verdict("scale", scale_probe(zeros_at(128))).reason


def test_a_target_exception_fails_the_check_with_its_reason():
    result = verdict("penrose", Probe(facts={"error": "RuntimeError: boom", "where": "mine.py:3"}))
    assert result.verdict == "fail" and "boom" in result.reason and "mine.py:3" in result.reason
