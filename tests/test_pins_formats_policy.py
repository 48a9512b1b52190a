"""Pins of pitcheck.formats (u, range, rounding) and pitcheck.policy (u of a policy, factor format)."""
import numpy as np
import pytest
import torch

from pitcheck.errors import PitcheckError
from pitcheck.formats import FORMATS, Format, get_format, overflow_threshold, round_to
from pitcheck.policy import POLICIES, get_policy

P = {"fp64": 53, "fp32": 24, "tf32": 11, "fp16": 11, "bf16": 8, "fp8-e4m3": 4, "fp8-e5m2": 3, "fp4-e2m1": 2}


def test_format_table_exact():
    assert {n: f.p for n, f in FORMATS.items()} == P
    for name, p in P.items():
        assert FORMATS[name].u == 2.0**-p  # u, not eps = 2^(1-p)
    assert FORMATS["fp32"].max == float(np.finfo(np.float32).max)
    assert FORMATS["fp64"].max == float(np.finfo(np.float64).max)
    assert FORMATS["fp16"].max == 65504.0 and FORMATS["fp16"].tiny == 2.0**-14
    assert FORMATS["fp16"].smallest_subnormal == 2.0**-24
    assert FORMATS["bf16"].max == (2 - 2.0**-7) * 2.0**127 and FORMATS["bf16"].tiny == 2.0**-126
    assert FORMATS["tf32"].max == (2 - 2.0**-10) * 2.0**127
    assert FORMATS["fp8-e4m3"].max == 448.0 and not FORMATS["fp8-e4m3"].has_inf
    assert FORMATS["fp8-e4m3"].smallest_subnormal == 2.0**-9
    assert FORMATS["fp8-e5m2"].max == 57344.0 and FORMATS["fp8-e5m2"].has_inf
    e2m1 = FORMATS["fp4-e2m1"]
    assert (e2m1.max, e2m1.tiny, e2m1.smallest_subnormal, e2m1.has_inf, e2m1.has_nan) == (6.0, 1.0, 0.5, False, False)
    assert [f.name for f in FORMATS.values() if not f.has_nan] == ["fp4-e2m1"]
    assert Format("x", 5, 4, -3).max == (2 - 2.0**-4) * 16 and Format("x", 5, 4, -3).tiny == 0.125
    assert get_format("bf16") is FORMATS["bf16"]
    with pytest.raises(PitcheckError):
        get_format("fp4")


@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_round_to_ties_subnormals_and_overflow(lib):
    x = np.array([1 + 2.0**-11, 1 + 3 * 2.0**-11, 1 + 2.0**-11 + 2.0**-30, 2.0**-25, 3 * 2.0**-25, 2.0**-26,
                  65519.0, 65520.0, -70000.0, np.inf, -np.inf, 0.0, 2.0**-14 * 1.5])
    want = [1.0, 1 + 2.0**-9, 1 + 2.0**-10, 0.0, 2.0**-23, 0.0, 65504.0, np.inf, -np.inf, np.inf, -np.inf, 0.0,
            2.0**-14 * 1.5]
    arr = x if lib == "numpy" else torch.from_numpy(x)
    got = round_to(arr, "fp16")
    got = got if lib == "numpy" else got.numpy()
    np.testing.assert_array_equal(got, want)
    # a format without infinities: overflow and infinities become NaN
    e4 = round_to(arr[[7, 9]] if lib == "numpy" else arr[[7, 9]], FORMATS["fp8-e4m3"])
    e4 = e4 if lib == "numpy" else e4.numpy()
    assert np.isnan(e4).all()
    np.testing.assert_array_equal(np.asarray(round_to(np.array([448.0, 464.0, 480.0, 0.3]), "fp8-e4m3")),
                                  [448.0, 448.0, np.nan, 0.3125])


def test_round_to_bf16_and_tf32_known_values():
    x = np.array([1 + 2.0**-8, 1 + 3 * 2.0**-8, 1 + 2.0**-11, 1 + 3 * 2.0**-11, 2.0**-133, 2.0**-134])
    np.testing.assert_array_equal(round_to(x[:2], "bf16"), [1.0, 1 + 2.0**-6])
    np.testing.assert_array_equal(round_to(x[2:4], "tf32"), [1.0, 1 + 2.0**-9])
    np.testing.assert_array_equal(round_to(x[4:], "bf16"), [2.0**-133, 0.0])  # smallest subnormal 2^-133


def test_stochastic_rounding_probability_is_the_fractional_distance():
    x = np.full(200_000, 1 + 2.0**-12)  # a quarter of the fp16 spacing 2^-10 above 1
    got = round_to(x, "fp16", mode="stochastic", rng=np.random.default_rng(0))
    assert set(np.unique(got)) == {1.0, 1 + 2.0**-10}
    assert np.mean(got > 1) == pytest.approx(0.25, abs=0.005)
    t = round_to(torch.from_numpy(x), "fp16", mode="stochastic", rng=torch.Generator().manual_seed(0))
    assert float((t > 1).double().mean()) == pytest.approx(0.25, abs=0.005)
    with pytest.raises(PitcheckError):
        round_to(x, "fp16", mode="stochastic")
    with pytest.raises(PitcheckError):
        round_to(x, "fp16", mode="up")


# ---- policy ----------------------------------------------------------------------------------------
def test_policy_u_is_the_coarsest_of_storage_and_matmul():
    """The issue's survivor: u from the storage format only would report tf32 runs in fp32's u."""
    u = {name: p.u for name, p in POLICIES.items()}
    assert u == {"fp64": 2.0**-53, "fp32": 2.0**-24, "tf32": 2.0**-11, "bf16": 2.0**-8, "fp16": 2.0**-11,
                 "bf16-mixed": 2.0**-8, "fp16-mixed": 2.0**-11}
    assert get_policy("tf32").u == FORMATS["tf32"].u != FORMATS[get_policy("tf32").storage].u


def test_policy_table_factor_format_and_mixed():
    """torch has no half-precision factorisation: every half policy factorises in fp32."""
    table = {n: (p.storage, p.master, p.factor, p.matmul, p.gradient, p.loss_scaling) for n, p in POLICIES.items()}
    assert table == {
        "fp64": ("fp64", "fp64", "fp64", "fp64", "fp64", False),
        "fp32": ("fp32", "fp32", "fp32", "fp32", "fp32", False),
        "tf32": ("fp32", "fp32", "fp32", "tf32", "fp32", False),
        "bf16": ("bf16", "bf16", "fp32", "bf16", "bf16", False),
        "fp16": ("fp16", "fp16", "fp32", "fp16", "fp16", True),
        "bf16-mixed": ("bf16", "fp32", "fp32", "fp32", "bf16", False),
        "fp16-mixed": ("fp16", "fp32", "fp32", "fp32", "fp16", True),
    }
    assert {n for n, p in POLICIES.items() if p.mixed} == {"bf16-mixed", "fp16-mixed"}
    d = get_policy("bf16-mixed").describe()
    assert d["u"] == 2.0**-8 and d["factor"] == "fp32" and d["name"] == "bf16-mixed" and d["loss_scaling"] is False
    with pytest.raises(PitcheckError):
        get_policy("fp8")


def test_policy_mixed_is_master_differing_from_storage_and_policies_are_frozen():
    import dataclasses

    from pitcheck.policy import Policy

    assert Policy("x", "fp32", "bf16", "fp32", "fp32", "fp32").mixed  # "bf16" < "fp32": not an ordering
    same = "".join(["fp", "32"])  # equal, not the same object
    assert not Policy("y", "fp32", same, "fp32", "fp32", "fp32").mixed
    with pytest.raises(dataclasses.FrozenInstanceError):
        get_policy("fp32").storage = "bf16"
    with pytest.raises(dataclasses.FrozenInstanceError):
        FORMATS["fp32"].p = 11


def test_fp64_and_fp32_ranges():
    assert FORMATS["fp64"].tiny == float(np.finfo(np.float64).tiny)
    assert FORMATS["fp64"].smallest_subnormal == float(np.finfo(np.float64).smallest_subnormal)
    assert FORMATS["fp32"].tiny == float(np.finfo(np.float32).tiny)
    assert FORMATS["fp8-e5m2"].tiny == 2.0**-14


def test_format_exponent_ranges_ieee_and_ocp():
    assert {n: (f.emax, f.emin) for n, f in FORMATS.items()} == {
        "fp64": (1023, -1022), "fp32": (127, -126), "tf32": (127, -126), "fp16": (15, -14), "bf16": (127, -126),
        "fp8-e4m3": (8, -6), "fp8-e5m2": (15, -14), "fp4-e2m1": (2, 0)}


def test_stochastic_mode_is_compared_by_value():
    mode = "".join(["stoch", "astic"])  # equal to "stochastic", not the same object
    got = round_to(np.full(4000, 1 + 2.0**-12), "fp16", mode=mode, rng=np.random.default_rng(1))
    assert (got > 1).any() and (got == 1).any()


def test_overflow_threshold_is_where_round_to_overflows():
    """The engine's gradient overflow test: |g| >= threshold exactly when round_to gives inf. Every
    format with an IEEE infinity has one (no silent fall-back to rounding each peak)."""
    rng = np.random.default_rng(0)
    for name, fmt in FORMATS.items():
        t = overflow_threshold(name)
        if not fmt.has_inf or fmt.max_finite is not None:
            assert t is None, name
            continue
        assert t is not None, name
        if np.isinf(t):
            assert name == "fp64"  # a finite float64 gradient never overflows
            continue
        probes = np.concatenate([[t, np.nextafter(t, 0), np.nextafter(t, np.inf), fmt.max],
                                 t * np.exp(rng.uniform(-0.01, 0.01, 200))])
        np.testing.assert_array_equal(~np.isfinite(round_to(probes, fmt)), probes >= t, err_msg=name)
    # the largest finite value plus half its spacing
    assert overflow_threshold("fp16") == 65504 + 16
    assert overflow_threshold("bf16") == (2 - 2.0**-8) * 2.0**127
    assert overflow_threshold("fp32") == (2 - 2.0**-24) * 2.0**127
