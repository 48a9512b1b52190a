import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pitcheck import PitcheckError
from pitcheck.formats import FORMATS, get_format, round_to


def test_unit_roundoff_table():
    # u = 2^-p, half of numpy's eps (PIT-NUMERICS section 2)
    expected = {"fp64": 1.11e-16, "fp32": 5.96e-8, "tf32": 4.88e-4, "fp16": 4.88e-4, "bf16": 3.91e-3,
                "fp8-e4m3": 6.25e-2, "fp8-e5m2": 1.25e-1}
    for name, u in expected.items():
        assert FORMATS[name].u == pytest.approx(u, rel=1e-2)
    assert FORMATS["fp32"].u == np.finfo(np.float32).eps / 2
    assert FORMATS["fp16"].max == float(np.finfo(np.float16).max)
    assert FORMATS["bf16"].max == float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)
    assert FORMATS["fp8-e4m3"].max == float(ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).max)
    assert FORMATS["fp8-e5m2"].max == float(ml_dtypes.finfo(ml_dtypes.float8_e5m2).max)
    assert FORMATS["fp16"].smallest_subnormal == float(np.finfo(np.float16).smallest_subnormal)


def _samples(seed=0, n=200_000):
    rng = np.random.default_rng(seed)
    # wide exponent range: subnormals, normals and overflow of every small format, plus exact ties
    x = rng.standard_normal(n).astype(np.float32) * np.float32(2.0) ** rng.integers(-30, 20, n).astype(np.float32)
    ties = (np.arange(1, 2049, dtype=np.float32) + np.float32(0.5)) * np.float32(2.0**-10)
    return np.concatenate([x, ties, -ties, np.float32([0.0, -0.0, np.inf, -np.inf, np.nan])])


NATIVE = {"bf16": ml_dtypes.bfloat16, "fp16": np.float16, "fp8-e4m3": ml_dtypes.float8_e4m3fn,
          "fp8-e5m2": ml_dtypes.float8_e5m2}


@pytest.mark.parametrize("name", list(NATIVE))
def test_round_to_nearest_matches_ml_dtypes_bit_for_bit(name):
    x = _samples()
    with np.errstate(over="ignore"):
        native = x.astype(NATIVE[name]).astype(np.float64)
    mine = round_to(x.astype(np.float64), name)
    same = (mine == native) | (np.isnan(mine) & np.isnan(native))
    assert same.all(), f"{(~same).sum()} mismatches, first at {x[~same][:5]}"
    # signed zeros too
    assert np.array_equal(np.signbit(mine[mine == 0]), np.signbit(native[native == 0]))


@pytest.mark.parametrize("name,dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_round_to_nearest_matches_torch_casts(name, dtype):
    x = torch.from_numpy(_samples(1))
    assert torch.equal(round_to(x, name).nan_to_num(7.0), x.to(dtype).float().nan_to_num(7.0))


def test_round_to_fp32_matches_numpy_cast():
    x = np.random.default_rng(2).standard_normal(100_000) * 10.0 ** np.random.default_rng(3).integers(-40, 38, 100_000)
    assert np.array_equal(round_to(x, "fp32"), x.astype(np.float32).astype(np.float64))


def test_round_to_known_values():
    # 1 + 2^-8 is the tie between 1 and 1 + 2^-7 in bf16: ties go to even (1)
    assert round_to(np.array([1 + 2.0**-8]), "bf16")[0] == 1.0
    assert round_to(np.array([1 + 3 * 2.0**-8]), "bf16")[0] == 1 + 2.0**-6
    assert round_to(np.array([70000.0]), "fp16")[0] == np.inf
    assert np.isnan(round_to(np.array([1000.0]), "fp8-e4m3")[0])  # e4m3fn has no infinity


def test_tf32_is_fp32_range_with_11_bits():
    x = np.array([1 + 2.0**-11, 1 + 3 * 2.0**-11, 1e38, 1e-38])
    y = round_to(x, "tf32")
    assert y[0] == 1.0 and y[1] == 1 + 2.0**-9 and np.isfinite(y[2]) and y[3] > 0


@settings(max_examples=200, deadline=None)
@given(x=st.floats(min_value=-1e30, max_value=1e30, allow_nan=False), name=st.sampled_from(["bf16", "tf32", "fp32"]))
def test_round_to_error_within_u_and_idempotent(x, name):
    fmt = get_format(name)
    y = float(round_to(np.array([x]), fmt)[0])
    if abs(x) >= fmt.tiny:
        assert abs(y - x) <= fmt.u * abs(x)
    else:
        assert abs(y - x) <= fmt.smallest_subnormal / 2
    assert float(round_to(np.array([y]), fmt)[0]) == y


def test_stochastic_rounding_is_unbiased_and_lands_on_neighbours():
    rng = np.random.default_rng(0)
    x = np.full(200_000, 1 + 0.3 * 2.0**-7)  # 30% of the way from 1 to the next bf16 value
    y = round_to(x, "bf16", mode="stochastic", rng=rng)
    assert set(np.unique(y)) == {1.0, 1 + 2.0**-7}
    # mean of 200k Bernoulli(0.3) draws: 5 standard errors is 0.005
    assert abs((y == 1 + 2.0**-7).mean() - 0.3) < 0.005
    yt = round_to(torch.from_numpy(x), "bf16", mode="stochastic", rng=torch.Generator().manual_seed(0))
    assert abs((yt == 1 + 2.0**-7).double().mean().item() - 0.3) < 0.005


def test_bad_format_and_mode_are_clear_errors():
    with pytest.raises(PitcheckError, match="unknown format"):
        round_to(np.ones(2), "fp12")
    with pytest.raises(PitcheckError, match="rounding mode"):
        round_to(np.ones(2), "bf16", mode="up")
    with pytest.raises(PitcheckError, match="Generator"):
        round_to(np.ones(2), "bf16", mode="stochastic")
