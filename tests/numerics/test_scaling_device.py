"""The scaling recipes on a tensor run where the tensor lives, with the host's bits: every recipe, both
roundings, both orientations, edge blocks, zero, subnormal, huge and non-finite entries, against the numpy
emulation; a delayed recipe's history and scale alike, kept on the device; and nothing is read to the host.
On CPU tensors here, and on CUDA where torch sees one."""

import numpy as np
import pytest
import torch

from pitcheck.numerics.formats import e8m0_decode, round_to
from pitcheck.numerics.placement import get_placement, through
from pitcheck.numerics.quantisers import Quantisers
from pitcheck.numerics.scaling import RECIPES, TensorDelayed, get_recipe

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _bits_equal(host: np.ndarray, device) -> bool:
    """The same float64 bits entry by entry (zeros' signs included), NaN where the host has NaN."""
    got = device.detach().cpu().numpy()
    nan = np.isnan(host)
    return (got.shape == host.shape and np.array_equal(nan, np.isnan(got))
            and np.array_equal(host[~nan].view(np.int64), got[~nan].view(np.int64)))


def _case(name: str) -> np.ndarray:
    rng = np.random.default_rng(7)
    if name == "wide":  # magnitudes over 2^-40..2^40 in one tensor: blocks of very different scales
        x = rng.standard_normal((64, 256)) * np.exp2(rng.integers(-40, 41, (64, 256)))
    elif name == "edges":  # partial blocks at both edges of every block recipe, zero rows and a zero block
        x = rng.standard_normal((131, 170))
        x[5] = 0.0
        x[9, 32:64] = 0.0
        x[:, -3:] *= -1e-3
    elif name == "tiny":  # subnormal and near-underflow entries: scales at E8M0's and fp32's ends
        x = rng.standard_normal((16, 96)) * 2.0**-140
        x[0, :4] = [5e-324, -5e-324, 2.0**-1070, 0.0]
    elif name == "huge":  # scales clamped to fp32's and E8M0's top, saturating elements
        x = rng.standard_normal((16, 96)) * 2.0**125
        x[1, 3] = 1e300
    elif name == "nonfinite":  # a NaN block, an infinite block: block recipes keep the other blocks
        x = rng.standard_normal((40, 64))
        x[3, 5] = np.nan
        x[20, 40] = -np.inf
    elif name == "cube":  # three axes: blocks run along the last (or the first)
        x = rng.standard_normal((3, 17, 40))
    else:
        raise ValueError(name)
    return x


CASES = ["wide", "edges", "tiny", "huge", "nonfinite", "cube"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("name", sorted(RECIPES))
def test_every_recipe_on_a_tensor_has_the_host_bits(name, case, device):
    x = _case(case)
    for axis in (-1, 0):
        if name.startswith("block-128") and x.ndim < 2:
            continue
        for rounding in ("nearest", "stochastic"):
            def rng():
                return np.random.default_rng(11) if rounding == "stochastic" else None

            want = get_recipe(name).fake_quant(x, axis=axis, rounding=rounding, rng=rng())
            got = get_recipe(name).fake_quant(torch.from_numpy(x).to(device), axis=axis, rounding=rounding, rng=rng())
            assert got.device.type == device and got.dtype == torch.float64
            assert _bits_equal(want, got), (name, case, axis, rounding)
        # the scales too, which a dequantised tensor can hide (an all-zero tensor's scale, say)
        host = get_recipe(name).quantise(x, axis=axis)
        if not np.isnan(host.values).all():  # a NaN tensor's scales: one NaN on the host, one per block here
            dev = get_recipe(name)._quantise(torch.from_numpy(x).to(device), axis, "nearest", None)
            assert _bits_equal(np.asarray(host.scales, dtype=np.float64), dev.scales)
            assert float(host.global_scale) == float(dev.global_scale)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name,options", [("tensor-current", {"element": "fp8-e5m2"}),
                                          ("tensor-current", {"amax_epsilon": 1e3}),
                                          ("block-1x128", {"element": "fp8-e5m2", "block": (16,)}),
                                          ("mxfp8", {"element": "fp8-e5m2", "scale_rounding": "ceil"}),
                                          ("tensor-delayed", {"margin": 2.0, "history_len": 3})])
def test_recipe_options_on_a_tensor_have_the_host_bits(name, options, device):
    x = _case("wide")
    want = get_recipe(name, **options).fake_quant(x)
    assert _bits_equal(want, get_recipe(name, **options).fake_quant(torch.from_numpy(x).to(device)))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("algo", ["max", "most_recent"])
def test_a_delayed_recipe_on_a_tensor_keeps_the_host_history(algo, device):
    """Eight casts in a row, an infinite and a NaN tensor among them (the newest amax NaN keeps the scale, an
    older NaN is passed over, as Python's max over the host's history does), then a restored checkpoint's
    floats: the same values, history and scale after each, kept on the device (0-d tensors)."""
    host, dev = (get_recipe("tensor-delayed", history_len=3, algo=algo) for _ in range(2))
    rng = np.random.default_rng(0)
    for k in range(8):
        if k == 6:  # a resume: the history as the checkpoint holds it, floats, then device amaxes again
            dev.history, dev.scale = [float(a) for a in dev.history], float(dev.scale)
        # falling amaxes, so that the window's maximum leaves it: the NaN step's older entries would give a new
        # scale, which the host's rule does not take
        x = rng.standard_normal((8, 64)) * 10.0 ** (3 - k)
        if k == 3:
            x[1, 1] = np.nan
        if k == 7:
            x[0, 0] = np.inf
        assert _bits_equal(host.fake_quant(x), dev.fake_quant(torch.from_numpy(x).to(device)))
        assert np.array_equal(np.array(host.history), np.array([float(a) for a in dev.history]), equal_nan=True)
        assert float(dev.scale) == host.scale and torch.is_tensor(dev.scale) and torch.is_tensor(dev.history[0])
        assert np.isnan(host.history).any() == (k in (3, 4, 5))  # the NaN newest, then older, then gone


@pytest.mark.parametrize("device", DEVICES)
def test_whole_tensor_failures_on_a_tensor_are_the_hosts(device):
    """A NaN or an infinity anywhere makes a per-tensor (or NVFP4's global) scale NaN, and so every value;
    an all-zero tensor keeps scale 1 and gives zeros; an empty one gives an empty one."""
    for name in ("tensor-current", "tensor-current-pow2", "nvfp4"):
        for bad in (np.nan, np.inf, -np.inf):
            x = np.ones((4, 32))
            x[2, 7] = bad
            got = get_recipe(name).fake_quant(torch.from_numpy(x).to(device))
            assert torch.isnan(got).all() and _bits_equal(get_recipe(name).fake_quant(x), got)
    for name in sorted(RECIPES):
        for shape in ((4, 32), (0, 32), (4, 0)):
            x = np.zeros(shape)
            assert _bits_equal(get_recipe(name).fake_quant(x), get_recipe(name).fake_quant(torch.from_numpy(x).to(device)))
            host = get_recipe(name).quantise(x)
            dev = get_recipe(name)._quantise(torch.from_numpy(x).to(device), -1, "nearest", None)
            assert _bits_equal(np.asarray(host.scales, dtype=np.float64), dev.scales)


def test_e8m0_decode_of_a_tensor_and_stochastic_noise_from_a_numpy_generator():
    codes = np.array([0, 1, 126, 127, 128, 254, 255], dtype=np.uint8)
    assert _bits_equal(e8m0_decode(codes), e8m0_decode(torch.from_numpy(codes)))
    with pytest.raises(Exception, match="uint8"):
        e8m0_decode(torch.zeros(3, dtype=torch.int32))
    x = np.random.default_rng(1).standard_normal(1000)
    want = round_to(x, "fp8-e4m3", mode="stochastic", rng=np.random.default_rng(5))
    assert _bits_equal(want, round_to(torch.from_numpy(x), "fp8-e4m3", mode="stochastic", rng=np.random.default_rng(5)))


class _Reads:
    """Every read of a tensor's values to the host while active: numpy(), item(), tolist(), float(), bool()."""

    def __init__(self, monkeypatch):
        self.shapes = []
        for method in ("numpy", "item", "tolist", "__float__", "__bool__"):
            original = getattr(torch.Tensor, method)

            def recorded(t, *args, _original=original, **kw):
                self.shapes.append(tuple(t.shape))
                return _original(t, *args, **kw)

            monkeypatch.setattr(torch.Tensor, method, recorded)


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_a_tensor_is_quantised_without_reading_it_to_the_host(monkeypatch, name):
    """No recipe reads anything: a delayed recipe's amax history and scale stay on the device."""
    x = torch.from_numpy(_case("edges"))
    reads = _Reads(monkeypatch)
    get_recipe(name).fake_quant(x, rounding="stochastic", rng=np.random.default_rng(0))
    recipe = get_recipe(name)
    for _ in range(3):
        recipe.fake_quant(x)
    assert reads.shapes == []


@pytest.mark.parametrize("placement", ["grad-nvfp4", "grad-nvfp4-sr", "adam-fp8", "adam-fp8-delayed", "store-nvfp4"])
def test_a_placements_tensors_stay_where_they_are_with_the_host_bits(placement):
    """The engine's calls: the gradients (seeded stochastic noise), a moment, a copy of Z through the
    placement's recipes, on tensors and on arrays alike."""
    p = get_placement(placement)
    x = _case("edges")
    host, dev = Quantisers(p, seed=3), Quantisers(p, seed=3)
    if p.gradients:
        grads = {"Z": x, "L": np.tril(x[:40, :40])}
        want = host.gradients(grads, step=9)
        got = dev.gradients({k: torch.from_numpy(v) for k, v in grads.items()}, step=9)
        assert all(_bits_equal(want[k], got[k]) for k in grads)
    if p.moments:
        host.hold_moments(("mZ",))
        dev.hold_moments(("mZ",))
        for _ in range(3):
            assert _bits_equal(host.moment("mZ", x), dev.moment("mZ", torch.from_numpy(x)))
        want, got = host.state_dict(), dev.state_dict()  # a checkpoint's arrays: the device's entries read
        assert want.keys() == got.keys() and all(np.array_equal(want[k], got[k]) for k in want)
    if p.z_copy:
        assert _bits_equal(through(x, p.z_copy), through(torch.from_numpy(x), p.z_copy))


@pytest.mark.parametrize("name", ["tensor-current", "tensor-current-pow2", "block-1x128", "block-128x128", "mxfp8",
                                  "mxfp8-rceil", "mxfp8-e5m2"])
def test_the_native_path_reads_nothing_to_the_host(monkeypatch, name):
    """torch's float8 casts take their scales from the recipe's rule, computed where the operand is."""
    from pitcheck.numerics import native_float8

    x = torch.from_numpy(_case("edges")).float()
    reads = _Reads(monkeypatch)
    native_float8.fake_quant(x, name)
    assert reads.shapes == []


def test_a_delayed_recipe_observes_a_float32_tensors_amax_in_float64():
    """The forward logits GEMM observes a float32 Z's amax on the device: the scale is the host's, computed in
    float64 from the same value (float32 arithmetic would round fmax / amax twice), for any amax."""
    rng = np.random.default_rng(3)
    amaxes = np.exp(rng.uniform(-30, 30, 2000)).astype(np.float32)
    for a in amaxes:
        host, dev = get_recipe("tensor-delayed"), get_recipe("tensor-delayed")
        host.observe(float(a))
        dev.observe(torch.tensor(a))
        assert float(dev.scale) == host.scale and dev.scale.dtype == torch.float64, a


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name,options,amax", [
    ("tensor-current", {}, 505.05346370537046),  # torch's float / tensor is 1/b times a: two roundings
    ("tensor-delayed", {}, 505.05346370537046),
    ("tensor-delayed", {"margin": 0.5}, 505.05346370537046),
    ("block-1x128", {}, 455.4044151306153),  # on CUDA a tensor / float is a times 1/b
    ("nvfp4", {}, 3160.1624221801762),
])
def test_scales_from_float64_amaxes_where_a_scalar_division_would_round_twice(name, options, amax, device):
    """Each scale is one IEEE division of the amax, as on the host: a Python float beside a tensor would make
    torch divide by a reciprocal (these amaxes are ones where that lands on the other side of an fp32 midpoint)."""
    x = np.array([[amax, -0.3 * amax, 0.77 * amax, 0.01 * amax] + [0.0] * 12])
    host, dev = get_recipe(name, **options), get_recipe(name, **options)
    for _ in range(2):  # a delayed recipe: the second cast uses the scale the first left
        assert _bits_equal(host.fake_quant(x), dev.fake_quant(torch.from_numpy(x).to(device)))


def test_bad_amax_epsilons_are_refused_and_numpy_generators_of_either_kind_give_numpys_noise():
    for bad in (float("nan"), float("inf"), -1.0, True, "1"):
        with pytest.raises(Exception, match="amax_epsilon must be a finite number >= 0"):
            get_recipe("tensor-current", amax_epsilon=bad)
    for bad in (float("nan"), float("inf"), -1100, 2000.0, None):
        with pytest.raises(Exception, match=r"margin must be a number in \[-1000, 1000\]"):
            get_recipe("tensor-delayed", margin=bad)
    for fine in (np.float32(1e-6), np.int64(0), 0, 1e-12):  # numpy's numbers are numbers
        assert get_recipe("tensor-current", amax_epsilon=fine).amax_epsilon == fine
    amax = torch.tensor(2.0, dtype=torch.float64)
    recipe = get_recipe("tensor-delayed")
    recipe.observe(amax)
    amax += 100  # the caller's tensor changed in place: the history kept its own value
    assert float(recipe.history[0]) == 2.0
    x = np.full(4096, 1.0625, np.float32)
    for make in (np.random.default_rng, np.random.RandomState):
        want = round_to(x, "fp8-e4m3", mode="stochastic", rng=make(5))
        got = round_to(torch.from_numpy(x), "fp8-e4m3", mode="stochastic", rng=make(5))
        assert _bits_equal(np.asarray(want, dtype=np.float64), got.double())
