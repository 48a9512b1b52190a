import bisect
import functools
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pitcheck import PitcheckError
from pitcheck.numerics.formats import (FORMATS, VALIDATED, Format, e8m0_decode, e8m0_encode, format_of_dtype, get_format,
                              overflow_threshold, round_to, validator_dtypes)


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


# ---- the 8- and 4-bit element formats and the E8M0 scale format: value by value against ml_dtypes
# (on float32 inputs) and against exact rounding from the enumerated grid with fractions (on float64
# inputs, which ml_dtypes rounds through float32 first)
SMALL_NATIVE = {"fp8-e4m3": ml_dtypes.float8_e4m3fn, "fp8-e5m2": ml_dtypes.float8_e5m2, "fp4-e2m1": ml_dtypes.float4_e2m1fn}
N_CODES = {"fp8-e4m3": 256, "fp8-e5m2": 256, "fp4-e2m1": 16}


@functools.lru_cache(maxsize=None)
def grid(name):
    """(value, code) of every non-negative finite value, ascending, then the next value the format
    would have (max + its spacing), with the code after max's: where overflow rounds to."""
    codes = np.arange(N_CODES[name], dtype=np.uint8)
    values = codes.view(SMALL_NATIVE[name]).astype(np.float64)
    pos = [(Fraction(float(v)), int(c)) for v, c in zip(values, codes) if np.isfinite(v) and v >= 0 and not np.signbit(v)]
    pos.sort()
    (top, top_code), (below, _) = pos[-1], pos[-2]
    return pos + [(top + (top - below), top_code + 1)]


@functools.lru_cache(maxsize=None)
def grid_values(name):
    return [v for v, _ in grid(name)]


def probes32(name):
    """float32: every representable value, every midpoint between neighbours (including the
    overflow midpoint), the float32 neighbours of each, specials; both signs."""
    g = [float(v) for v, _ in grid(name)]
    values = np.array(g, dtype=np.float32)
    mids = np.array([(a + b) / 2 for a, b in zip(g, g[1:])] + [g[-1] * 4], dtype=np.float32)
    near = [np.nextafter(p, np.float32(np.inf)) for p in (values, mids)] + [np.nextafter(p, np.float32(0)) for p in (values, mids)]
    specials = np.array([np.inf, np.finfo(np.float32).max, np.finfo(np.float32).smallest_subnormal, 1e-30], np.float32)
    x = np.concatenate([values, mids, *near, specials])
    return np.concatenate([x, -x, np.float32([np.nan])])


def same(a, b):
    """Bit-for-bit equal as values: NaN matches NaN, and zeros match in sign."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    both_nan = np.isnan(a) & np.isnan(b)
    return both_nan | ((a == b) & (np.signbit(a) == np.signbit(b)))


@pytest.mark.parametrize("name", list(SMALL_NATIVE))
def test_every_value_and_midpoint_matches_ml_dtypes(name):
    x = probes32(name)
    with np.errstate(over="ignore", invalid="ignore"):
        native = x.astype(SMALL_NATIVE[name]).astype(np.float64)
    mine = round_to(x.astype(np.float64), name)
    ok = same(mine, native)
    if name == "fp4-e2m1":
        # ml_dtypes turns NaN into -0 (E2M1 has no NaN); round_to keeps it NaN, on purpose
        assert np.isnan(mine[np.isnan(x)]).all() and (native[np.isnan(x)] == 0).all()
        ok |= np.isnan(x)
    assert ok.all(), f"{(~ok).sum()} mismatches, first at {x[~ok][:5]}"
    # from a float32 torch tensor too, the same values
    t = round_to(torch.from_numpy(x), name)
    assert t.dtype == torch.float32 and same(t.numpy(), mine).all()


def test_known_boundaries():
    r = lambda v, name, **kw: list(round_to(np.array(v, dtype=np.float64), name, **kw))  # noqa: E731
    # e4m3: 464 is the tie between 448 (even) and the NaN pattern's 480: stays 448; above it, NaN
    assert r([464.0, 448.0], "fp8-e4m3") == [448.0, 448.0] and np.isnan(r([464.0001], "fp8-e4m3")[0])
    # e5m2: 57344 = 1.11b 2^15 has an odd significand, so the tie 61440 goes up to 2^16: infinity (IEEE)
    assert r([61439.0, 61440.0, -61440.0], "fp8-e5m2") == [57344.0, np.inf, -np.inf]
    # e2m1: 0, 0.5, 1, 1.5, 2, 3, 4, 6; ties to even, overflow and infinity saturate (no inf, no NaN)
    assert r([0.25, 0.75, 1.25, 2.5, 3.5, 5.0, 5.0001, 7.0, 1e9, np.inf, -np.inf], "fp4-e2m1") == [
        0.0, 1.0, 1.0, 2.0, 4.0, 4.0, 6.0, 6.0, 6.0, 6.0, -6.0]
    # subnormals: e4m3's smallest is 2^-9, half of it ties to 0; e5m2's is 2^-16
    assert r([2.0**-10, 3 * 2.0**-11, 2.0**-9], "fp8-e4m3") == [0.0, 2.0**-9, 2.0**-9]
    assert r([2.0**-17, 1.5 * 2.0**-17], "fp8-e5m2") == [0.0, 2.0**-16]
    assert np.signbit(round_to(np.array([-2.0**-12]), "fp8-e4m3")[0])  # -0 stays negative


@pytest.mark.parametrize("name", list(SMALL_NATIVE))
def test_saturating_mode_is_the_cast_of_the_clipped_value(name):
    x = probes32(name)
    fmax = FORMATS[name].max
    mine = round_to(x.astype(np.float64), name, saturate=True)
    finite = ~np.isnan(x)
    with np.errstate(invalid="ignore"):
        native = np.clip(x, -fmax, fmax).astype(SMALL_NATIVE[name]).astype(np.float64)
    assert same(mine[finite], native[finite]).all()
    assert np.isnan(mine[~finite]).all()
    assert list(round_to(np.array([np.inf, -np.inf, 1e30]), name, saturate=True)) == [fmax, -fmax, fmax]


def test_torch_native_casts_agree_with_the_emulation():
    """torch's eager float32 -> float8_e4m3fn cast saturates (since 2.12); its e5m2 cast does not."""
    for name, dtype, sat in [("fp8-e4m3", torch.float8_e4m3fn, True), ("fp8-e5m2", torch.float8_e5m2, False)]:
        x = probes32(name)
        native = torch.from_numpy(x).to(dtype).double().numpy()
        assert same(round_to(x.astype(np.float64), name, saturate=sat), native).all(), name


def exact_round(x: float, name: str, saturate=False) -> float:
    """Round-to-nearest-even by exact arithmetic on the enumerated grid (a tie goes to the even code)."""
    if x != x:
        return np.nan
    fmt, g = FORMATS[name], grid(name)
    a = Fraction(abs(x)) if np.isfinite(x) else Fraction(10**400)
    values = grid_values(name)
    i = bisect.bisect_right(values, a) - 1
    if i == len(g) - 1:
        pick = i
    else:
        (lo, lo_code), (hi, hi_code) = g[i], g[i + 1]
        d_lo, d_hi = a - lo, hi - a
        pick = i if d_lo < d_hi or (d_lo == d_hi and lo_code % 2 == 0) else i + 1
    if pick == len(g) - 1 or not np.isfinite(x):  # overflow
        if saturate or not fmt.has_nan:
            y = fmt.max
        elif fmt.has_inf:
            y = np.inf
        else:
            return np.nan
    else:
        y = float(values[pick])
    return float(np.copysign(y, x))


@pytest.mark.parametrize("name", list(SMALL_NATIVE))
@pytest.mark.parametrize("saturate", [False, True])
def test_float64_inputs_round_once_exactly(name, saturate):
    g = [float(v) for v, _ in grid(name)]
    mids = np.array([(a + b) / 2 for a, b in zip(g, g[1:])])
    pts = np.concatenate([mids, np.array(g)])
    x = np.concatenate([pts, np.nextafter(pts, np.inf), np.nextafter(pts, 0), pts * (1 + 2.0**-30), pts * (1 - 2.0**-30),
                        np.exp(np.random.default_rng(0).uniform(-12, 12, 2000))])
    x = np.concatenate([x, -x, [np.inf, -np.inf, np.nan]])
    want = np.array([exact_round(v, name, saturate) for v in x])
    assert same(round_to(x, name, saturate=saturate), want).all()


def test_round_to_rounds_float64_once_where_a_cast_through_float32_rounds_twice():
    x = np.array([-431.99999999999994])  # just inside the midpoint 432 between 416 and 448
    assert round_to(x, "fp8-e4m3")[0] == -416.0 == exact_round(x[0], "fp8-e4m3")
    # through float32 it is -432, a tie, which rounds to even: -448 (ml_dtypes before 0.7 cast float64 so;
    # 0.7 casts it once, to -416)
    assert float(x.astype(np.float32).astype(ml_dtypes.float8_e4m3fn)[0]) == -448.0
    assert float(x.astype(ml_dtypes.float8_e4m3fn)[0]) in (-448.0, -416.0)


@pytest.mark.parametrize("name,x,lo,hi,p_up", [("fp8-e4m3", 1 + 0.25 * 0.125, 1.0, 1.125, 0.25),
                                               ("fp8-e5m2", 3.5 + 0.1 * 0.5, 3.5, 4.0, 0.1),
                                               ("fp4-e2m1", 5.0, 4.0, 6.0, 0.5)])
def test_stochastic_rounding_lands_on_neighbours_unbiased(name, x, lo, hi, p_up):
    y = round_to(np.full(100_000, x), name, mode="stochastic", rng=np.random.default_rng(0))
    assert set(np.unique(y)) == {lo, hi}
    assert abs((y == hi).mean() - p_up) < 0.007  # 5 standard errors at p = 0.5
    again = round_to(np.full(100_000, x), name, mode="stochastic", rng=np.random.default_rng(0))
    assert np.array_equal(y, again)  # seeded: reproducible


def test_stochastic_rounding_past_the_largest_value_obeys_the_overflow_mode():
    x = np.full(20_000, 460.0)  # 12/32 of the way from 448 to 480, beyond e4m3's range
    y = round_to(x, "fp8-e4m3", mode="stochastic", rng=np.random.default_rng(1))
    assert abs(np.isnan(y).mean() - 12 / 32) < 0.02 and set(y[~np.isnan(y)]) == {448.0}
    ys = round_to(x, "fp8-e4m3", mode="stochastic", rng=np.random.default_rng(1), saturate=True)
    assert set(ys) == {448.0}


# ---- E8M0 ------------------------------------------------------------------------------------------
def test_e8m0_decode_matches_ml_dtypes_on_every_code():
    codes = np.arange(256, dtype=np.uint8)
    native = codes.view(ml_dtypes.float8_e8m0fnu).astype(np.float64)
    assert same(e8m0_decode(codes), native).all()
    assert e8m0_decode(np.uint8([0, 127, 254]))[[0, 1, 2]].tolist() == [2.0**-127, 1.0, 2.0**127]
    for wrong in (np.int64, np.int8, np.float32):
        with pytest.raises(PitcheckError, match="uint8"):
            e8m0_decode(np.array([1, 2], dtype=wrong))


def test_e8m0_nearest_matches_ml_dtypes_on_normal_float32():
    e = np.arange(-126, 128)
    m = np.array([1.0, np.nextafter(np.float32(1.5), np.float32(0)), 1.5, np.nextafter(np.float32(1.5), np.float32(2)),
                  np.nextafter(np.float32(2), np.float32(0))], dtype=np.float32)
    x = (m[None, :] * np.ldexp(np.float32(1), e)[:, None].astype(np.float32)).astype(np.float32).ravel()
    x = x[np.isfinite(x)]
    x = np.concatenate([x, np.float32([0, -0.0, -1, -np.inf, np.inf, np.nan, 2.0**-127, 2.0**-128, 1e-45])])
    native = x.astype(ml_dtypes.float8_e8m0fnu).view(np.uint8)
    assert np.array_equal(e8m0_encode(x), native)


def test_e8m0_rounding_modes_and_range():
    x = np.array([3.0, 4.0, 1.5, 1.4999, 2.0**-130, 2.0**127 * 1.49, 2.0**127 * 1.5, 2.0**128, 0.0, -2.0, np.nan])
    assert e8m0_encode(x, "nearest").tolist() == [129, 129, 128, 127, 0, 254, 255, 255, 255, 255, 255]
    assert e8m0_encode(x, "floor").tolist() == [128, 129, 127, 127, 0, 254, 254, 255, 255, 255, 255]
    assert e8m0_encode(x, "ceil").tolist() == [129, 129, 128, 128, 0, 255, 255, 255, 255, 255, 255]
    assert e8m0_encode(np.array([1e300, 1e-300]), "floor").tolist() == [255, 0]  # far out of range, both ways
    # ml_dtypes rounds a float32 subnormal bitwise (1.25 2^-127 -> 2^-126); the nearest power of two is 2^-127
    assert e8m0_encode(np.array([1.25 * 2.0**-127]))[0] == 0
    # modes compared by value
    assert e8m0_encode(x[:1], "".join(["cei", "l"])).tolist() == e8m0_encode(x[:1], "".join(["near", "est"])).tolist() == [129]
    with pytest.raises(PitcheckError, match="E8M0 rounding"):
        e8m0_encode(x, "up")


# ---- the registry: every format's numbers and dtypes, one row each -------------------------------------

F64, F32 = np.finfo(np.float64), np.finfo(np.float32)
FORMAT_TABLE = [
    # name, p, emax, emin, max, tiny, smallest subnormal, has_inf, has_nan, torch name, numpy name
    ("fp64", 53, 1023, -1022, float(F64.max), 2.0**-1022, 2.0**-1074, True, True, "float64", "float64"),
    ("fp32", 24, 127, -126, float(F32.max), 2.0**-126, 2.0**-149, True, True, "float32", "float32"),
    ("tf32", 11, 127, -126, (2 - 2.0**-10) * 2.0**127, 2.0**-126, 2.0**-136, True, True, None, None),
    ("fp16", 11, 15, -14, 65504.0, 2.0**-14, 2.0**-24, True, True, "float16", "float16"),
    ("bf16", 8, 127, -126, (2 - 2.0**-7) * 2.0**127, 2.0**-126, 2.0**-133, True, True, "bfloat16", "bfloat16"),
    ("fp8-e4m3", 4, 8, -6, 448.0, 2.0**-6, 2.0**-9, False, True, "float8_e4m3fn", "float8_e4m3fn"),
    ("fp8-e5m2", 3, 15, -14, 57344.0, 2.0**-14, 2.0**-16, True, True, "float8_e5m2", "float8_e5m2"),
    ("fp4-e2m1", 2, 2, 0, 6.0, 1.0, 0.5, False, False, None, "float4_e2m1fn"),
]


def test_the_registry_holds_these_formats_in_this_order():
    assert list(FORMATS) == [row[0] for row in FORMAT_TABLE]


@pytest.mark.parametrize("name,p,emax,emin,fmax,tiny,subnormal,has_inf,has_nan,torch_name,numpy_name", FORMAT_TABLE)
def test_format_table(name, p, emax, emin, fmax, tiny, subnormal, has_inf, has_nan, torch_name, numpy_name):
    f = get_format(name)
    assert f is FORMATS[name] and f.name == name
    assert (f.p, f.emax, f.emin, f.has_inf, f.has_nan) == (p, emax, emin, has_inf, has_nan)
    assert f.u == 2.0**-p  # u, not eps = 2^(1-p)
    assert (f.max, f.tiny, f.smallest_subnormal) == (fmax, tiny, subnormal)
    assert (f.torch_name, f.numpy_name) == (torch_name, numpy_name)
    if torch_name is None:
        with pytest.raises(PitcheckError):
            f.torch_dtype()
    else:
        assert f.torch_dtype() == getattr(torch, torch_name)
        assert format_of_dtype(torch_name) is f
    if numpy_name is None:
        with pytest.raises(PitcheckError):
            f.numpy_dtype()
    else:
        dtype = f.numpy_dtype()
        assert dtype == np.dtype(getattr(np, numpy_name, None) or getattr(ml_dtypes, numpy_name))
        if name != "fp4-e2m1":  # ml_dtypes' E2M1 turns NaN into -0 (see round_to)
            assert float(np.array(f.max).astype(dtype).astype(np.float64)) == f.max


def test_ieee_values_of_a_format_without_a_largest_finite_value_given():
    assert Format("x", 5, 4, -3).max == (2 - 2.0**-4) * 16 and Format("x", 5, 4, -3).tiny == 0.125
    with pytest.raises(PitcheckError):
        get_format("fp4")
    with pytest.raises(PitcheckError):
        format_of_dtype("float8_e4m3fnuz")


def test_formats_are_frozen():
    import dataclasses

    with pytest.raises(dataclasses.FrozenInstanceError):
        FORMATS["fp32"].p = 11


@pytest.mark.parametrize("wide,narrow,held", [
    ("fp64", "fp32", True), ("fp32", "bf16", True), ("fp32", "fp16", True), ("fp32", "tf32", True),
    ("fp16", "bf16", False),  # fewer bits but a wider range
    ("bf16", "fp16", False),  # a wider range but more bits
    ("fp16", "fp8-e5m2", True), ("fp16", "fp8-e4m3", True), ("bf16", "fp8-e4m3", True),
    ("fp8-e4m3", "fp8-e5m2", False), ("fp8-e4m3", "fp4-e2m1", True), ("fp32", "fp64", False), ("fp32", "fp32", True),
    ("tf32", "fp16", True), ("bf16", "tf32", False),
])
def test_which_format_holds_which(wide, narrow, held):
    assert FORMATS[wide].holds(FORMATS[narrow]) is held


def test_the_validator_dtypes_are_the_torch_names_of_four_formats():
    assert validator_dtypes() == ("float64", "float32", "bfloat16", "float16")
    assert [format_of_dtype(d).name for d in validator_dtypes()] == list(VALIDATED) == ["fp64", "fp32", "bf16", "fp16"]


# ---- rounding at ties, subnormals and overflow -------------------------------------------------------

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


@pytest.mark.parametrize("narrow, held", [
    # the wide format: p = 8, emax = 10, emin = -10 (bottom quantum 2^(emin - p) = 2^-18, max 2040)
    (Format("same-bottom", p=4, emax=8, emin=-14), True),     # bottom quantum 2^-18: exactly as fine
    (Format("finer-bottom", p=4, emax=8, emin=-15), False),   # 2^-19: a subnormal the wide format lacks
    (Format("larger-max", p=4, emax=12, emin=-10), False),    # max 7680 > 2040
    (Format("more-bits", p=9, emax=8, emin=-8), False),       # one significand bit more
])
def test_holds_decides_on_each_of_its_three_conditions(narrow, held):
    """Synthetic formats that each fail exactly one condition of `holds` (the registry's pairs never
    put the bottom-quantum condition on its boundary)."""
    wide = Format("wide", p=8, emax=10, emin=-10)
    assert wide.holds(narrow) is held


def test_format_of_dtype_compares_names_by_value():
    """A dtype name built at run time (not the interned literal) finds its format."""
    assert format_of_dtype("".join(["bfloat", "16"])).name == "bf16"
