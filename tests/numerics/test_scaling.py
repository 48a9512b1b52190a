"""The scaling recipes: hand-computed blocks with exact values, orientation, the state of delayed
scaling, bad input. test_scaling_torchao.py checks the MX and NVFP4 recipes against torchao."""

import dataclasses

import numpy as np
import pytest
import torch

from pitcheck import PitcheckError
from pitcheck.numerics.scaling import RECIPES, Quantised, fake_quant, get_recipe, quantise

FP32 = np.float32


def wide_matrix(seed=0, shape=(64, 256), spread=3):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-spread, spread + 1, shape))
    return x.astype(FP32)


# ---- hand-computed blocks ----------------------------------------------------------------------------
def test_mx_blocks_by_hand():
    # amax 3: floor(log2 3) = 1, so X = 2^(1 - 8) in MXFP8 (E4M3, emax 8) and 2^(1 - 2) in MXFP4
    x = np.zeros(32)
    x[:6] = [3.0, 0.01, -1.1, 0.7, 0.2, 0.1]
    q8 = quantise(x, "mxfp8")
    assert q8.scale_codes.tolist() == [127 - 7] and q8.scales.tolist() == [2.0**-7]
    # x / X = 384, 1.28 -> 1.25, -140.8 -> -144, 89.6 -> 88, 25.6 -> 26, 12.8 -> 13
    assert q8.values[:6].tolist() == [384.0, 1.25, -144.0, 88.0, 26.0, 13.0]
    q4 = quantise(x, "mxfp4")
    # x / 0.5 = 6, 0.02 -> 0, -2.2 -> -2, 1.4 -> 1.5, 0.4 -> 0.5, 0.2 -> 0
    assert q4.scales.tolist() == [0.5] and q4.values[:6].tolist() == [6.0, 0.0, -2.0, 1.5, 0.5, 0.0]
    # the OCP rule can put the block's largest value out of range: 3.9 / 0.5 = 7.8 saturates to 6
    y = np.zeros(32)
    y[0] = 3.9
    assert quantise(y, "mxfp4").dequantise()[0] == 3.0
    # NVIDIA's ceil rule takes X = 2^ceil(log2(3.9 / 448)) = 2^-6 instead: 3.9 * 64 = 249.6 -> 256 (no clipping)
    assert quantise(y, "mxfp8-rceil").scales.tolist() == [2.0**-6] and quantise(y, "mxfp8-rceil").values[0] == 256.0
    # an all-zero block: scale 2^-127 (code 0), values 0
    z = quantise(np.zeros(32), "mxfp8")
    assert z.scale_codes.tolist() == [0] and not z.values.any()
    # the exponent is clamped to E8M0's range: 2^-150 gets 2^-127 (and flushes to 0), 2^200 gets 2^127
    # (and saturates); integer input is fine
    q = quantise(np.array([2.0**-150] + [0.0] * 31 + [2.0**200] + [0.0] * 31), "mxfp4")
    assert q.scale_codes.tolist() == [0, 254] and q.values[[0, 32]].tolist() == [0.0, 6.0]
    assert quantise(np.arange(32), "mxfp8").scale_codes.tolist() == [127 + 4 - 8]


@pytest.mark.parametrize("amax,code", [(448.0 * 16, 127 + 4), (np.nextafter(448.0 * 16, np.inf), 127 + 5),
                                       (np.nextafter(448.0 * 16, 0), 127 + 4), (448.0 * 8 + 1, 127 + 4),
                                       (448.0 * 8, 127 + 3), (2.0**12, 127 + 4), (2.0**-120, 0), (1.0, 127 - 8)])
def test_mx_ceil_scale_is_the_smallest_power_of_two_that_fits(amax, code):
    x = np.zeros(32)
    x[5] = amax
    q = quantise(x, "mxfp8-rceil")
    assert q.scale_codes.tolist() == [code]
    assert abs(q.values[5]) <= 448.0


def test_deepseek_blocks_by_hand():
    x = np.zeros((2, 256))
    x[0, :3] = [896.0, -1.0, 100.0]  # amax 896: scale 2, values x / 2: 448, -0.5, 50 -> 48 (spacing 4)
    x[1, 128:130] = [1.0, 0.3]  # amax 1: scale fp32(1/448); values 448 and 134.4 -> 128
    q = quantise(x, "block-1x128")
    s = float(FP32(1 / 448))
    assert q.scales.tolist() == [[2.0, 1.0], [1.0, s]]  # the all-zero blocks get scale 1
    assert q.values[0, :3].tolist() == [448.0, -0.5, 48.0] and q.values[1, 128:130].tolist() == [448.0, 128.0]
    assert q.dequantise()[1, 129] == 128.0 * s
    t = quantise(np.kron(np.array([[1.0, 2.0], [0.0, 4.0]]), np.ones((128, 128))), "block-128x128")
    assert t.scales.tolist() == [[float(FP32(1 / 448)), float(FP32(2 / 448))], [1.0, float(FP32(4 / 448))]]


def test_per_tensor_current_by_hand():
    x = np.array([1.0, -3.0, 0.5, 0.0])
    s = float(FP32(448 / 3))  # 149.33333587646484
    q = quantise(x, "tensor-current")
    # 149.33 -> 144 (spacing 16), -448.0000076 -> -448 (saturated), 74.67 -> 72 (spacing 8)
    assert q.values.tolist() == [144.0, -448.0, 72.0, 0.0] and q.scales.ravel().tolist() == [float(FP32(1 / s))]
    p = quantise(x, "tensor-current-pow2")  # scale 128: exact products, -384 fits
    assert p.values.tolist() == [128.0, -384.0, 64.0, 0.0] and p.scales.ravel().tolist() == [2.0**-7]
    assert quantise(np.zeros(3), "tensor-current").scales.ravel().tolist() == [1.0]
    tiny = get_recipe("tensor-current", amax_epsilon=1.0).quantise(np.array([0.25]))
    assert tiny.values.tolist() == [112.0]  # scale 448 / max(0.25, 1) = 448: 0.25 * 448 = 112
    huge = quantise(np.array([1e-44, 0.0]), "tensor-current")  # 448 / 1e-44 overflows fp32: fp32's max
    assert huge.scales.ravel().tolist() == [float(FP32(1 / np.finfo(FP32).max))] and huge.values.tolist() == [0.0, 0.0]


def test_nvfp4_by_hand():
    x = np.zeros(32)
    x[0], x[1], x[16] = 2688.0, 1000.0, 6.0  # tensor amax 2688 = 6 * 448: global scale 1
    q = quantise(x, "nvfp4")
    assert q.global_scale == 1.0
    # block 0: scale 2688 / 6 = 448 (E4M3), 1000 / 448 = 2.23 -> 2; block 1: scale 1, 6 -> 6
    assert q.scales.tolist() == [448.0, 1.0]
    assert q.values[[0, 1, 16]].tolist() == [6.0, 2.0, 6.0]
    assert q.dequantise()[[0, 1, 16]].tolist() == [2688.0, 896.0, 6.0]
    # a block far below the tensor's amax: its E4M3 scale rounds to 0 and the block to 0
    y = np.zeros(32)
    y[0], y[16] = 1e6, 1e-6
    tiny = quantise(y, "nvfp4")
    assert tiny.scales[1] == 0.0 and tiny.values[16] == 0.0 and tiny.dequantise()[16] == 0.0
    assert quantise(np.zeros(16), "nvfp4").global_scale == 1.0
    # a global scale other than 1: amax 5376 = 2 (6 * 448); block 1's scale 22.8 / 12 = 1.9 -> 1.875
    w = np.zeros(32)
    w[0], w[16], w[17] = 5376.0, 22.8, 1.0
    q = quantise(w, "nvfp4")
    assert q.global_scale == 2.0 and q.scales.tolist() == [448.0, 1.875]
    # 22.8 / 3.75 = 6.08 -> 6, 1 / 3.75 = 0.27 -> 0.5
    assert q.values[[16, 17]].tolist() == [6.0, 0.5] and q.dequantise()[[0, 16, 17]].tolist() == [5376.0, 22.5, 1.875]
    assert quantise(w / 8192, "nvfp4").global_scale == 2.0**-12  # below 1 too
    with pytest.raises(dataclasses.FrozenInstanceError):
        q.values = w


# ---- orientation ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("recipe,outlier", [("block-1x128", 1e6), ("mxfp8", 1e6), ("mxfp4", 100.0), ("nvfp4", 100.0)])
def test_quantise_then_transpose_differs_from_transpose_then_quantise(recipe, outlier):
    x = wide_matrix(3, shape=(128, 256), spread=0).astype(np.float64)
    # an outlier flushes the rest of its block towards zero: its row's block in one orientation, its
    # column's in the other (smaller for NVFP4, whose global scale it would otherwise set for all blocks)
    x[7, 3] = outlier
    rows = fake_quant(x, recipe, axis=-1)
    cols = fake_quant(x, recipe, axis=0)
    assert np.array_equal(fake_quant(x.T, recipe, axis=-1).T, cols)
    assert not np.array_equal(rows, cols)
    # the outlier's neighbours lose: along its row when blocks run along rows, along its column otherwise
    err_rows, err_cols = np.abs(rows - x), np.abs(cols - x)
    err_rows[7, 3] = err_cols[7, 3] = 0.0
    b = get_recipe(recipe).block[0]
    assert err_rows[7, :b].sum() > 3 * err_cols[7, :b].sum()
    assert err_cols[:b, 3].sum() > 3 * err_rows[:b, 3].sum()


def test_square_tiles_commute_with_transpose():
    x = wide_matrix(4, shape=(256, 384))
    x[7, 3] = 5000.0
    assert np.array_equal(fake_quant(x.T, "block-128x128").T, fake_quant(x, "block-128x128"))


def test_partial_blocks_at_the_edges():
    x = np.arange(1.0, 41.0)
    x[-1] = 100.0
    q = quantise(x, "mxfp8")
    assert q.scales.shape == (2,) and q.scale_codes.tolist() == [127 + 5 - 8, 127 + 6 - 8]  # amax 32, 100
    assert quantise(np.ones((3, 130)), "block-128x128").scales.shape == (1, 2)
    assert quantise(np.ones((3, 130)), "block-1x128", axis=0).scales.shape == (1, 130)
    assert quantise(np.ones((2, 2, 128, 128)), "block-128x128").block == (1, 1, 128, 128)
    empty = quantise(np.zeros(0), "tensor-current")
    assert empty.values.shape == (0,) and empty.scales.tolist() == [1.0]


def test_stacked_matrices_are_blocked_matrix_by_matrix():
    x = np.ones((3, 128, 64))
    x[1] *= 896.0
    q = quantise(x, "block-128x128")
    assert q.block == (1, 128, 128) and q.scales.ravel().tolist() == [float(FP32(1 / 448)), 2.0, float(FP32(1 / 448))]
    m = quantise(x, "mxfp8", axis=1)
    assert m.scales.shape == (3, 4, 64) and np.array_equal(m.dequantise(), x)


# ---- delayed scaling -----------------------------------------------------------------------------------
def test_delayed_scaling_uses_the_history_of_earlier_calls():
    r = get_recipe("tensor-delayed", history_len=3)
    assert quantise(np.array([2.0, 0.3]), r).values.tolist() == [2.0, 0.3125]  # first call: scale 1
    assert r.scale == 224.0 and r.history == [2.0]
    # the tensor grew: cast with 224 from the history, 4 * 224 = 896 saturates to 448
    assert quantise(np.array([4.0]), r).values.tolist() == [448.0] and r.scale == 112.0
    for expected in (112.0, 112.0, 448.0):  # the amax 4 leaves the 3-long window after three calls
        quantise(np.array([1.0]), r)
        assert r.scale == expected
    recent = get_recipe("tensor-delayed", algo="most_recent")
    quantise(np.array([4.0]), recent)
    quantise(np.array([1.0]), recent)
    assert recent.scale == 448.0
    margin = get_recipe("tensor-delayed", margin=1)
    quantise(np.array([4.0]), margin)
    assert margin.scale == 56.0  # 448 / 4 / 2^1
    quantise(np.zeros(2), margin)  # amax 0: the history's max is still 2
    inf = get_recipe("tensor-delayed")
    # the scale comes from earlier tensors, so an infinity saturates like any overflow; the history's
    # infinite amax leaves the scale as it was (not 448 / inf = 0)
    assert quantise(np.array([np.inf, 1.0]), inf).values.tolist() == [448.0, 1.0] and inf.scale == 1.0
    zero = get_recipe("tensor-delayed", history_len=1)
    quantise(np.array([2.0]), zero)
    quantise(np.zeros(2), zero)
    assert zero.scale == 224.0 and zero.history == [0.0]  # a zero amax keeps the previous scale
    quantise(np.zeros(0), zero)
    assert zero.history == [0.0]
    assert get_recipe("tensor-delayed").history == []  # a fresh recipe has a fresh history


# ---- rounding, inputs, non-finite values ---------------------------------------------------------------
def test_stochastic_rounding_through_a_recipe_is_seeded_and_unbiased():
    x = np.full((64, 32), 1 + 0.25 * 0.125)  # X = 2^(0 - 8): x / X = 256 + 8, between 256 and 288
    a = quantise(x, "mxfp8", rounding="stochastic", rng=np.random.default_rng(0))
    b = quantise(x, "mxfp8", rounding="stochastic", rng=np.random.default_rng(0))
    assert np.array_equal(a.values, b.values) and set(np.unique(a.values)) == {256.0, 288.0}
    assert abs(a.dequantise().mean() - x.mean()) < 0.005


def test_torch_input_gives_the_same_values_as_a_float64_tensor():
    x = wide_matrix(5)
    for name in RECIPES:
        t = fake_quant(torch.from_numpy(x), name)
        assert t.dtype == torch.float64 and np.array_equal(t.numpy(), fake_quant(x, name)), name
        # the recipe's own verbs, defaults included, are the module's
        assert np.array_equal(get_recipe(name).fake_quant(x), fake_quant(x, name, axis=-1)), name


def test_blocks_run_along_the_last_axis_by_default():
    x = wide_matrix(7, shape=(2, 32, 64))
    for name in ("block-1x128", "mxfp8", "mxfp4", "nvfp4"):
        want = quantise(x, name, axis=2)
        for got in (quantise(x, name), get_recipe(name).quantise(x)):
            assert np.array_equal(got.values, want.values) and np.array_equal(got.scales, want.scales), name
        for got in (fake_quant(x, name), get_recipe(name).fake_quant(x)):
            assert np.array_equal(got, want.dequantise()), name
        assert not np.array_equal(quantise(x, name, axis=1).values, want.values)


def test_string_options_are_compared_by_value():
    algo, rounding = "".join(["ma", "x"]), "".join(["fl", "oor"])  # equal, not the same objects
    r = get_recipe("tensor-delayed", algo=algo)
    for amax in (4.0, 1.0):
        quantise(np.array([amax]), r)
    assert r.scale == 112.0  # the history's max, 4
    x = np.zeros(32)
    x[0] = 3.9  # floor: 2^(1 - 8); ceil would give 2^-6
    assert quantise(x, get_recipe("mxfp8", scale_rounding=rounding)).scales.tolist() == [2.0**-7]


def test_delayed_scaling_defaults_are_transformer_engines():
    r = get_recipe("tensor-delayed")
    assert (r.history_len, r.algo, r.margin, r.scale, r.element) == (1024, "max", 0.0, 1.0, "fp8-e4m3")


def test_nan_or_inf_poisons_only_its_block():
    x = np.ones((2, 64))
    x[0, 0], x[1, 40] = np.nan, np.inf
    for name in ("mxfp8", "block-1x128"):
        y = fake_quant(x, name)
        bad = np.zeros_like(x, dtype=bool)
        if name == "mxfp8":
            bad[0, :32] = bad[1, 32:] = True
        else:
            bad[:] = True
        assert np.isnan(y[bad]).all() and (y[~bad] == 1.0).all(), name
    for name in ("tensor-current", "nvfp4"):
        q = quantise(x, name)
        assert np.isnan(q.dequantise()).all() and q.scales.shape == (1, 1) and np.isnan(q.scales).all()


def test_bad_recipes_and_inputs_are_clear_errors():
    with pytest.raises(PitcheckError, match="unknown scaling recipe"):
        get_recipe("fp8")
    with pytest.raises(PitcheckError, match="no option"):
        get_recipe("mxfp8", blocksize=16)
    with pytest.raises(PitcheckError, match="no option"):
        get_recipe("tensor-delayed", history=[1.0])
    with pytest.raises(PitcheckError, match="bf16"):
        get_recipe("mxfp8", element="bf16")
    with pytest.raises(PitcheckError, match="unknown format"):
        get_recipe("mxfp8", element="fp6")
    with pytest.raises(PitcheckError, match="scale rounding"):
        get_recipe("mxfp8", scale_rounding="nearest")
    with pytest.raises(PitcheckError, match="most_recent"):
        get_recipe("tensor-delayed", algo="mean")
    with pytest.raises(PitcheckError, match="history"):
        get_recipe("tensor-delayed", history_len=0)
    with pytest.raises(PitcheckError, match="axis"):
        quantise(np.ones((2, 32)), "mxfp8", axis=2)
    with pytest.raises(PitcheckError, match="axis"):
        quantise(np.ones((2, 32)), "mxfp8", axis=-3)
    with pytest.raises(PitcheckError, match="axis"):
        quantise(np.ones((2, 32)), "mxfp8", axis=5)
    x = wide_matrix(6, shape=(64, 64))
    assert np.array_equal(fake_quant(x, "mxfp8", axis=-2), fake_quant(x, "mxfp8", axis=0))
    with pytest.raises(PitcheckError, match="matrix"):
        quantise(np.ones(128), "block-128x128")
    with pytest.raises(PitcheckError, match="one axis"):
        quantise(np.float64(1.0), "mxfp8")
    with pytest.raises(PitcheckError, match="quantise"):
        quantise(np.array(["a"]), "mxfp8")
    with pytest.raises(PitcheckError, match="rounding mode"):
        quantise(np.ones(32), "mxfp8", rounding="up")
    assert isinstance(quantise(np.ones(4), "tensor-current"), Quantised)
