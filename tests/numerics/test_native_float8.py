"""pitcheck.numerics.native_float8: torch's float8 casts and _scaled_mm against the bit-exact emulation.

The element casts must agree bit for bit with pitcheck.numerics.formats.round_to on float32 input (every finite
value, every midpoint and its float32 neighbours, overflow, infinities, NaN); the scaled operands must
equal the emulation exactly for power-of-two scales and equal its fp32-product model otherwise; the GEMM
must stay within gamma_n u_fp32 |A||W|^T of the float64 product of the same dequantised operands.
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from pitcheck.infra.errors import PitcheckError  # noqa: E402
from pitcheck.numerics.formats import FORMATS, round_to  # noqa: E402
from pitcheck.numerics.native_float8 import cast, gemm_error_bound, quantise, scaled_mm  # noqa: E402
from pitcheck.numerics.scaling import fake_quant  # noqa: E402

ELEMENTS = ("fp8-e4m3", "fp8-e5m2")


def _all_values(element):
    """Every finite value of the format, ascending, from its 256 bit patterns (float32)."""
    bits = torch.arange(256, dtype=torch.uint8).view(getattr(torch, FORMATS[element].torch_name))
    v = bits.float()
    return torch.unique(v[torch.isfinite(v)])


def _probe_inputs(element):
    """The values, the midpoints between neighbours, each midpoint's float32 neighbours, values beyond
    the largest finite one, infinities, NaN and random float32s over the whole range."""
    v = _all_values(element).double()
    mid = ((v[1:] + v[:-1]) / 2).float()  # exact in float32 (fp8 values have 3 significand bits)
    up, down = torch.nextafter(mid, torch.tensor(np.inf)), torch.nextafter(mid, torch.tensor(-np.inf))
    fmax = FORMATS[element].max
    edge = torch.tensor([fmax * 1.0625, fmax * 1.125, fmax * 2, 3e38, np.inf, -np.inf, np.nan, -0.0, 0.0,
                         FORMATS[element].smallest_subnormal / 2, FORMATS[element].smallest_subnormal / 4])
    g = torch.Generator().manual_seed(0)
    random = (torch.rand(20000, generator=g) * 2 - 1) * torch.exp2(torch.randint(-24, 18, (20000,), generator=g))
    x = torch.cat([v.float(), mid, up, down, edge.float(), random.float()])
    return torch.cat([x, -x])


@pytest.mark.parametrize("element", ELEMENTS)
def test_native_saturating_cast_equals_the_emulation_bit_for_bit_on_float32(element):
    x = _probe_inputs(element)
    native = cast(x, element).double().numpy()
    emulated = round_to(x.double().numpy(), FORMATS[element], saturate=True)
    nan = np.isnan(emulated)
    assert np.array_equal(np.isnan(native), nan)
    # bit for bit, the sign of zero included
    assert np.array_equal(np.signbit(native[~nan]), np.signbit(emulated[~nan]))
    assert np.array_equal(native[~nan], emulated[~nan]), int((native[~nan] != emulated[~nan]).sum())


def test_torchs_own_conversion_saturates_e4m3_and_overflows_e5m2():
    """What cast(..., saturate=False) leaves to torch, pinned so that a change in torch shows here."""
    x = torch.tensor([500.0, np.inf, -1e9])
    assert cast(x, "fp8-e4m3", saturate=False).float().tolist() == [448.0, 448.0, -448.0]
    y = torch.tensor([61440.0, np.inf])
    assert torch.isinf(cast(y, "fp8-e5m2", saturate=False).float()).all()
    # the non-saturating emulation of E5M2 agrees with torch's raw conversion
    z = _probe_inputs("fp8-e5m2")
    native = cast(z, "fp8-e5m2", saturate=False).double().numpy()
    emulated = round_to(z.double().numpy(), FORMATS["fp8-e5m2"])
    both = ~np.isnan(emulated)
    assert np.array_equal(np.isnan(native), ~both) and np.array_equal(native[both], emulated[both])


def test_inputs_native_casts_refuse():
    with pytest.raises(PitcheckError, match="float32 input"):
        cast(torch.zeros(3, dtype=torch.float64), "fp8-e4m3")
    with pytest.raises(PitcheckError, match="no native cast for fp4-e2m1"):
        cast(torch.zeros(3), "fp4-e2m1")
    with pytest.raises(PitcheckError, match="no native path"):
        quantise(torch.zeros(4, 4), "tensor-delayed")
    with pytest.raises(PitcheckError, match="M x K and N x K"):
        scaled_mm(torch.zeros(4, 4), torch.zeros(4, 5), "tensor-current", "tensor-current")


def _operand(M, K, seed):
    g = torch.Generator().manual_seed(seed)
    # rows of very different scales, so that block scales differ from row to row
    return torch.randn(M, K, generator=g) * torch.exp2(torch.randint(-6, 6, (M, 1), generator=g).float())


@pytest.mark.parametrize("recipe", ["mxfp8", "mxfp8-rceil", "mxfp8-e5m2", "tensor-current-pow2"])
def test_power_of_two_scales_give_the_emulations_operand_exactly(recipe):
    x = _operand(37, 200, 1)
    values, scales, length, per_row = quantise(x, recipe)
    divisor = scales.double().repeat_interleave(length, dim=1)[:, :200] if per_row else scales.double()
    native = values.double() * divisor
    assert torch.equal(native, fake_quant(x, recipe))


@pytest.mark.parametrize("recipe", ["tensor-current", "block-1x128", "block-128x128"])
def test_fp32_scales_give_the_fp32_product_rounded_once_more(recipe):
    """The hardware rounds x * s (or x / s) to fp32 before the cast: native equals that model exactly, and
    differs from the emulation (one rounding of the float64 product) only where the model does, by at
    most one fp8 step."""
    x = _operand(300, 260, 2)
    values, scales, length, per_row = quantise(x, recipe)
    native = values.double()
    emulated = fake_quant(x, recipe)
    divisor = scales.repeat_interleave(length, dim=1)[:, :260] if per_row else scales
    if recipe == "tensor-current":
        from pitcheck.numerics.native_float8 import _tensor_encode_scale
        from pitcheck.numerics.scaling import get_recipe

        product = x * _tensor_encode_scale(get_recipe(recipe), x)  # fp32, as the hardware forms it
    else:
        product = x / divisor
    model = round_to(product.double().numpy(), FORMATS["fp8-e4m3"], saturate=True)
    assert np.array_equal(native.numpy(), model)
    native_hat = native * (divisor.double() if per_row else float(scales))
    if recipe == "tensor-current":  # the decode scale is fp32(1 / s), not 1 / s: compare values instead
        ratio = (native_hat - emulated).abs().max() / emulated.abs().max()
        assert ratio <= FORMATS["fp8-e4m3"].u * 2
    else:
        differ = native_hat != emulated
        assert differ.float().mean() < 1e-3  # double roundings are rare
        step = (native_hat - emulated).abs()[differ]
        assert (step <= emulated.abs()[differ] * 2 * FORMATS["fp8-e4m3"].u * 2 + 1e-300).all()


PAIRS = [("tensor-current", "tensor-current"), ("block-1x128", "block-128x128"), ("mxfp8", "mxfp8"),
         ("mxfp8-rceil", "mxfp8-rceil"), ("tensor-current", "mxfp8")]


@pytest.mark.parametrize("pair", PAIRS, ids=["-".join(p) for p in PAIRS])
@pytest.mark.parametrize("shape", [(50, 40, 30), (64, 300, 48)], ids=["small", "K300"])
def test_scaled_mm_is_the_dequantised_product_to_fp32_accumulation(pair, shape):
    M, K, N = shape
    a, w = _operand(M, K, 3), _operand(N, K, 4)
    out = scaled_mm(a, w, *pair).double()
    parts = []
    for x, recipe in ((a, pair[0]), (w, pair[1])):
        values, scales, length, per_row = quantise(x, recipe)
        divisor = scales.double().repeat_interleave(length, dim=1)[:, :K] if per_row else scales.double()
        parts.append((values.double() * divisor).numpy())
    exact = parts[0] @ parts[1].T
    block = min(quantise(a, pair[0])[2], quantise(w, pair[1])[2])
    bound = gemm_error_bound(parts[0], parts[1], block)
    ratio = np.max(np.abs(out.numpy() - exact) / np.maximum(bound, 1e-300))
    assert ratio <= 1.0, ratio
    # and the product is not trivially close: fp8 quantisation is visible against the fp32 GEMM
    assert np.abs(exact - (a.double() @ w.double().T).numpy()).max() > 100 * bound.max()


def test_mx_scaled_mm_matches_the_emulated_head_to_accumulation():
    """With power-of-two scales the native operands are the emulation's: the native GEMM is
    pitcheck.numerics.placement's float64 FP8 head up to fp32 accumulation."""
    a, w = _operand(40, 96, 5), _operand(24, 96, 6)
    exact = (fake_quant(a, "mxfp8") @ fake_quant(w, "mxfp8").T).numpy()
    bound = gemm_error_bound(fake_quant(a, "mxfp8").numpy(), fake_quant(w, "mxfp8").numpy(), 32)
    assert np.all(np.abs(scaled_mm(a, w, "mxfp8", "mxfp8").double().numpy() - exact) <= bound)


def test_blocks_of_different_lengths_are_refused():
    with pytest.raises(PitcheckError, match="blocks along K differ"):
        scaled_mm(torch.ones(16, 64), torch.ones(16, 64), "mxfp8", "block-1x128")


@pytest.mark.parametrize("recipe", ["mxfp8", "mxfp8-rceil", "tensor-current", "block-1x128", "block-128x128"])
def test_placement_through_takes_the_native_path_with_the_emulations_values(recipe, monkeypatch):
    """What a CUDA run's copies of Z and L go through (placement.through, native for CUDA tensors), forced
    on the CPU: the emulation's values (a float32 master, so the operand is exact in fp32)."""
    from pitcheck.numerics import native_float8
    from pitcheck.numerics.placement import through

    calls = []
    real = native_float8.fake_quant
    monkeypatch.setattr(native_float8, "fake_quant", lambda x, r: calls.append(r) or real(x, r))
    x = _operand(130, 40, 7).double()
    assert native_float8.has_native_path(recipe)
    emulated = through(x, recipe)  # a CPU tensor: the emulation by default
    assert calls == []
    native = through(x, recipe, native=True)
    assert calls == [recipe]
    assert native.dtype == torch.float64 and torch.equal(native, emulated)


def test_placement_through_falls_back_to_the_emulation_without_a_native_path():
    from pitcheck.numerics.native_float8 import has_native_path
    from pitcheck.numerics.placement import through

    x = _operand(32, 64, 8).double()
    for recipe in ("nvfp4", "mxfp4", "tensor-delayed"):
        assert not has_native_path(recipe)
        assert torch.equal(through(x, recipe, native=True), through(x, recipe, native=False))


def test_gemm_error_bound_in_closed_form():
    """gamma_n u_fp32 |A||W|^T with n = min(block, K) + ceil(K / block) + 2."""
    u = 2.0**-24
    a, w = np.full((2, 300), -0.5), np.full((3, 300), 2.0)
    for block, n in ((32, 32 + 10 + 2), (128, 128 + 3 + 2), (300, 300 + 1 + 2), (512, 300 + 1 + 2)):
        expected = n * u / (1 - n * u) * 300.0
        assert np.array_equal(gemm_error_bound(a, w, block), np.full((2, 3), expected)), block


def test_scaled_mm_hands_torch_padded_shapes_and_a_column_major_second_operand(monkeypatch):
    """The CUDA kernels need every dimension a multiple of 16 and mat2 column-major: each call checked."""
    from pitcheck.numerics import native_float8

    assert native_float8.GEMM_MULTIPLE == 16
    calls, real = [], torch._scaled_mm

    def spy(a, b, **kw):
        calls.append((tuple(a.shape), tuple(b.shape), b.stride(), kw["scale_a"].shape, kw["scale_b"].shape))
        return real(a, b, **kw)

    monkeypatch.setattr(torch, "_scaled_mm", spy)
    scaled_mm(_operand(50, 70, 1), _operand(30, 70, 2), "mxfp8", "mxfp8")
    assert len(calls) == 3  # K = 70 in blocks of 32: 32, 32, 6
    for (m, k), (k2, n), stride, sa, sb in calls:
        assert (m, n) == (64, 32) and k == k2 and k % 16 == 0 and stride == (1, k)
        assert tuple(sa) == (64, 1) and tuple(sb) == (1, 32)


def test_a_torch_that_refuses_rowwise_scales_is_a_one_line_error(monkeypatch):
    """torch 2.11's CPU kernel (below pitcheck's floor) raised an internal assert for rowwise scales."""
    def old_torch(a, b, scale_a, scale_b, out_dtype):
        if scale_a.numel() != 1 or scale_b.numel() != 1:
            raise RuntimeError("(scale_a.numel() == 1 && scale_b.numel() == 1) INTERNAL ASSERT FAILED\n"
                               "Now _scaled_mm only supports per-tensor scaling for CPU backend.")
        return torch.zeros(a.shape[0], b.shape[1])

    monkeypatch.setattr(torch, "_scaled_mm", old_torch)
    with pytest.raises(PitcheckError, match="refuses rowwise scales .*only supports per-tensor.* torch 2.13"):
        scaled_mm(_operand(20, 64, 1), _operand(16, 64, 2), "mxfp8", "mxfp8")
    assert scaled_mm(_operand(20, 64, 1), _operand(16, 64, 2), "tensor-current", "tensor-current").shape == (20, 16)


@pytest.mark.parametrize("pair", [("mxfp8", "tensor-current"), ("tensor-current", "block-128x128")])
def test_a_per_tensor_operand_beside_a_blockwise_one_either_way_round(pair):
    a, w = _operand(20, 64, 9), _operand(40, 64, 10)
    out = scaled_mm(a, w, *pair).double().numpy()
    parts = [fake_quant(x, r).numpy() for x, r in ((a, pair[0]), (w, pair[1]))]
    block = 32 if "mxfp8" in pair else 128
    assert np.all(np.abs(out - parts[0] @ parts[1].T) <= gemm_error_bound(*parts, block))


def test_more_inputs_native_quantisation_refuses():
    for x in (torch.zeros(2, 3, 4), torch.zeros(4)):
        with pytest.raises(PitcheckError, match="takes a matrix"):
            quantise(x, "mxfp8")
    with pytest.raises(PitcheckError, match="float32 input"):
        quantise(torch.zeros(4, 4, dtype=torch.float64), "mxfp8")
    for a, w in ((torch.zeros(2, 4, 3), torch.zeros(5, 4)), (torch.zeros(5, 4), torch.zeros(2, 4, 3)),
                 (torch.zeros(4), torch.zeros(5, 4)), (torch.zeros(5, 4), torch.zeros(4)),
                 (torch.zeros(4, 5), torch.zeros(4, 4))):
        with pytest.raises(PitcheckError, match="M x K and N x K"):
            scaled_mm(a, w, "mxfp8", "mxfp8")
    with pytest.raises(PitcheckError, match="blocks along K differ"):
        scaled_mm(torch.ones(16, 64), torch.ones(16, 64), "block-1x128", "mxfp8")
