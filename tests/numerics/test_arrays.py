"""pitcheck.numerics.arrays: the numpy and torch namespaces agree op by op, and the reduced-precision
matmul emulation rounds exactly as the hardware contract says (tf32 operands to 11 bits, ties to even;
bf16/fp16 operands cast and the fp32-accumulated product rounded back to the low format)."""
import numpy as np
import pytest
import torch

from pitcheck.numerics.arrays import NumpyOps, TorchOps, ops_for, round_float32
from pitcheck.numerics.formats import FORMATS, Format, round_to

TF32, BF16, FP16 = FORMATS["tf32"], FORMATS["bf16"], FORMATS["fp16"]


def _t32(values):
    return torch.tensor(values, dtype=torch.float32)


# ---- tf32 operand rounding ---------------------------------------------------------------------------
# tf32 keeps 11 significand bits: near 1 the spacing is 2^-10, so 1 + 2^-11 is an exact tie. Ties go to the
# even neighbour (both directions of a tie, both signs); in [1/2, 1) the spacing is 2^-11. Off a tie the
# nearest wins (1 + 2^-11 +- 2^-20); values with 11 bits are kept exactly.
Q11 = 2.0**-11
TF32_ROUNDING = [  # (x, rounded to tf32)
    (1 + Q11, 1.0), (1 + 3 * Q11, 1 + 4 * Q11), (1 + 5 * Q11, 1 + 4 * Q11), (-(1 + Q11), -1.0),
    (-(1 + 3 * Q11), -(1 + 4 * Q11)), (2 + 2 * Q11, 2.0), (0.75 + Q11 / 2, 0.75), (0.75 + 3 * Q11 / 2, 0.75 + 2 * Q11),
    (1 + Q11 + 2.0**-20, 1 + 2 * Q11), (1 + Q11 - 2.0**-20, 1.0), (1 + 2 * Q11, 1 + 2 * Q11), (1 + 2.0**-23, 1.0),
    (3.0, 3.0), (-1.5, -1.5),
]


def test_tf32_rounding_of_exact_ties_goes_to_even():
    """The ties of the table, all in one tensor (the bit trick works on whole tensors)."""
    x = _t32([x for x, _ in TF32_ROUNDING[:8]])
    want = [w for _, w in TF32_ROUNDING[:8]]
    assert round_float32(x, TF32).tolist() == want
    # the same through the module's general rounding (the reference the bit trick must agree with)
    assert round_to(x, TF32).tolist() == want


@pytest.mark.parametrize("x, want", TF32_ROUNDING)
def test_tf32_rounding_keeps_11_bits_not_12(x, want):
    assert round_float32(_t32([x]), TF32).item() == want
    assert round_to(_t32([x]), TF32).item() == want


def test_round_float32_bf16_ties_and_non_finite_pass_through():
    q = 2.0**-8  # bf16: 8 bits, spacing 2^-7 near 1
    x = _t32([1 + q, 1 + 3 * q, float("inf"), float("-inf"), float("nan"), 0.0, -0.0])
    y = round_float32(x, BF16)
    assert y[:4].tolist() == [1.0, 1 + 4 * q, float("inf"), float("-inf")]
    assert torch.isnan(y[4]) and y[5].item() == 0.0 and torch.signbit(y[6])


@pytest.mark.parametrize("fmt", [TF32, BF16])
def test_round_float32_on_a_cpu_tensors_memory_gives_torchs_bits(fmt):
    """The numpy path (CPU tensors without grad) against the torch kernels (a tensor that requires grad takes
    them): every bit pattern class, NaN payloads and both infinities, strided views included."""
    rng = np.random.default_rng(5)
    patterns = rng.integers(-2**31, 2**31 - 1, size=200_002, dtype=np.int64).astype(np.int32)  # + 9 = 7 x 28573
    specials = np.array([0x7F800000, -0x800000, 0x7FFFFFFF, -1, 0x7FC00000, 0x7F7FFFFF, 1, 0, -2**31], np.int32)
    x = torch.from_numpy(np.concatenate([patterns, specials]).view(np.float32).copy())
    for view in (x, x.reshape(-1, 7)[:, 1:5], x.reshape(-1, 7).T):
        fast = round_float32(view, fmt)
        with_grad = round_float32(view.clone().requires_grad_(True), fmt).detach()
        assert fast.shape == view.shape and torch.equal(fast.view(torch.int32), with_grad.view(torch.int32))
    assert np.array_equal(x.numpy().view(np.int32), np.concatenate([patterns, specials]))  # x untouched


def test_round_float32_overflows_to_inf_at_float32_max():
    """float32's largest value is above tf32's largest plus half a tf32 spacing: it rounds to inf."""
    big = torch.finfo(torch.float32).max
    assert round_float32(_t32([big, -big]), TF32).tolist() == [float("inf"), float("-inf")]
    tf32_max = (2 - 2.0**-10) * 2.0**127
    assert round_float32(_t32([tf32_max]), TF32).item() == tf32_max


def test_round_float32_hands_other_formats_and_dtypes_to_round_to():
    """fp16 has its own exponent range (70000 overflows, 2^-20 is subnormal): not the bit trick's case;
    float64 input is rounded by round_to too."""
    x = _t32([70000.0, 2.0**-20 + 2.0**-30, 1 + 2.0**-11])
    assert round_float32(x, FP16).tolist() == [float("inf"), 2.0**-20, 1.0]
    d = torch.tensor([1 + 2.0**-11 + 2.0**-40], dtype=torch.float64)
    assert round_float32(d, TF32).dtype == torch.float64
    assert round_float32(d, TF32).item() == 1 + 2.0**-10
    # a format with fp32's range but not its emin/emax both (a made-up one) goes the general way too
    odd = Format("odd", 11, 127, -14)  # 2^-20 is subnormal there: quantum 2^-24, so 2^-25 is a tie (to even)
    assert round_float32(_t32([2.0**-20 + 2.0**-25]), odd).item() == 2.0**-20
    wide = Format("wide", 11, 127, -149)  # normal down to 2^-149: 2^-140 is kept (the bit trick would flush it)
    assert round_float32(_t32([2.0**-140]), wide).item() == 2.0**-140
    odd2 = Format("odd2", 11, 15, -126)
    assert round_float32(_t32([70000.0]), odd2).item() == float("inf")


def test_tf32_matmul_rounds_both_operands_then_multiplies_in_fp32():
    q = 2.0**-11
    ops = TorchOps(matmul_format=TF32)
    a = _t32([[1 + q, 1 + 3 * q]])
    b = _t32([[1.0], [1 + q]])
    # operands: [1, 1 + 4q] and [1, 1]: 2 + 4q (exact in fp32)
    assert ops.matmul(a, b).tolist() == [[2 + 4 * q]]
    assert TorchOps().matmul(a, b).item() == (1 + q) + (1 + 3 * q) * (1 + q)


# ---- bf16 / fp16 matmul emulation ------------------------------------------------------------------
def test_emulated_bf16_matmul_rounds_its_product():
    """Operands exact in bf16; the fp32 product 1 + 3 2^-9 is not: bf16's nearest is 1 + 2^-7."""
    ops = TorchOps(matmul_dtype=torch.bfloat16, native=False)
    a = _t32([[1.0, 2.0**-8, 2.0**-9]])
    b = _t32([[1.0], [1.0], [1.0]])
    out = ops.matmul(a, b)
    assert out.dtype == torch.float32
    assert out.item() == 1 + 2.0**-7


def test_emulated_bf16_matmul_casts_its_operands_first():
    """1 + 2^-10 is 1 in bf16: each operand cast before the fp32 accumulation, 2 (1) = 2."""
    ops = TorchOps(matmul_dtype=torch.bfloat16, native=False)
    a = _t32([[1 + 2.0**-10, 1 + 2.0**-10]])
    assert ops.matmul(a, _t32([[1.0], [1.0]])).item() == 2.0
    # accumulation in fp32, not in bf16: 256 ones and a 1 sum to 257 in fp32, which bf16 rounds to 256;
    # summing in bf16 would stop at 256 long before: both give 256, so check a sum bf16 cannot hold exactly
    # midway but fp32 can: 1 + 2^-8 (bf16 tie, to even: 1) vs 1 + 2^-8 + 2^-9 (-> 1 + 2^-7)
    a = _t32([[1.0, 2.0**-8, 2.0**-10, 2.0**-10]])
    assert ops.matmul(a, _t32([[1.0]] * 4)).item() == 1 + 2.0**-7


def test_emulated_fp16_matmul_rounds_its_product_and_overflows():
    ops = TorchOps(matmul_dtype=torch.float16, native=False)
    a = _t32([[1.0, 2.0**-11, 2.0**-12]])  # 1 + 3 2^-12: fp16 spacing 2^-10 near 1 -> 1 + 2^-10
    assert ops.matmul(a, _t32([[1.0]] * 3)).item() == 1 + 2.0**-10
    big = _t32([[60000.0, 60000.0]])  # 120000 is past fp16's largest, 65504
    assert ops.matmul(big, _t32([[1.0], [1.0]])).item() == float("inf")


def test_native_low_precision_matmul_returns_the_working_dtype():
    """native=True computes in the low dtype itself (tensor cores); the result comes back in a's dtype."""
    ops = TorchOps(matmul_dtype=torch.bfloat16, native=True)
    a = _t32([[1.0, 2.0**-8, 2.0**-9]])
    out = ops.matmul(a, _t32([[1.0]] * 3))
    assert out.dtype == torch.float32 and out.item() in (1 + 2.0**-7, 1.0)
    assert ops.matmul(_t32([[1 + 2.0**-10]]), _t32([[1.0]])).item() == 1.0
    # float64 operands: the emulation accumulates in float64 (2^30 + 1 - 2^30 = 1, exact in bf16); the
    # native matmul runs in bf16 with at most fp32 accumulation, where the 1 is lost
    a, b = torch.tensor([[2.0**30, 1.0, -(2.0**30)]], dtype=torch.float64), torch.ones(3, 1, dtype=torch.float64)
    assert TorchOps(matmul_dtype=torch.bfloat16, native=False).matmul(a, b).item() == 1.0
    assert ops.matmul(a, b).item() == 0.0


def test_low_precision_matmul_in_its_own_dtype_is_a_plain_matmul():
    """Operands already in the matmul dtype: no cast, no emulation."""
    ops = TorchOps(matmul_dtype=torch.bfloat16, native=False)
    a = torch.tensor([[1.0, 2.0**-8]], dtype=torch.bfloat16)
    out = ops.matmul(a, torch.ones(2, 1, dtype=torch.bfloat16))
    assert out.dtype == torch.bfloat16
    # float64 operands under a bf16 policy: cast to bf16, accumulated in float64, rounded to bf16
    ops = TorchOps(matmul_dtype=torch.bfloat16, native=False)
    d = torch.tensor([[1.0, 2.0**-8, 2.0**-9]], dtype=torch.float64)
    out = ops.matmul(d, torch.ones(3, 1, dtype=torch.float64))
    assert out.dtype == torch.float64 and out.item() == 1 + 2.0**-7


def test_torch_ops_default_has_no_emulation():
    ops = TorchOps()
    assert ops.matmul_format is None and ops.matmul_dtype is None and ops.native is True
    a = _t32([[1 + 2.0**-20]])
    assert ops.matmul(a, _t32([[1.0]])).item() == 1 + 2.0**-20


# ---- the common namespace ----------------------------------------------------------------------------
def _spd(n=3, seed=0):
    a = np.random.default_rng(seed).standard_normal((n, n))
    return a @ a.T + n * np.eye(n)


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_every_op_agrees_with_numpy_float64(kind):
    ops = NumpyOps() if kind == "numpy" else TorchOps()
    conv = (lambda a: a) if kind == "numpy" else (lambda a: torch.from_numpy(np.array(a, dtype=np.float64)))
    back = ops.to_numpy
    rng = np.random.default_rng(3)
    A = rng.standard_normal((5, 3))
    S = _spd()
    Lo = np.linalg.cholesky(S)
    x = np.array([-2.0, -0.5, -0.0, 0.0, 0.5, 40.0])
    assert ops.name == kind
    np.testing.assert_allclose(back(ops.matmul(conv(A.T), conv(A))), A.T @ A, rtol=1e-15)
    eye = ops.eye(3, like=conv(A))
    assert back(eye).tolist() == np.eye(3).tolist() and eye.dtype == conv(A).dtype
    assert ops.dtype_unit_roundoff(conv(A)) == 2.0**-53
    assert back(ops.cat([conv(A), conv(A)], 0)).shape == (10, 3)
    assert back(ops.cat([conv(A), conv(A)], 1)).shape == (5, 6)
    np.testing.assert_array_equal(back(ops.diag(conv(S))), np.diag(S))
    np.testing.assert_array_equal(back(ops.diag(conv(np.array([1.0, 2.0])))), np.diag([1.0, 2.0]))
    np.testing.assert_array_equal(back(ops.tril(conv(S))), np.tril(S))
    np.testing.assert_array_equal(back(ops.tril(conv(S), -1)), np.tril(S, -1))
    np.testing.assert_array_equal(back(ops.sqrt(conv(np.array([4.0, 2.0])))), [2.0, np.sqrt(2.0)])
    sign = back(ops.sign_nonzero(conv(x)))
    assert sign.tolist() == [-1.0, -1.0, 1.0, 1.0, 1.0, 1.0]
    assert ops.sign_nonzero(conv(x)).dtype == conv(x).dtype
    assert ops.norm(conv(np.array([[3.0, 4.0]]))) == 5.0
    U, s, Vt = ops.svd(conv(A))
    assert back(U).shape == (5, 3) and back(Vt).shape == (3, 3)
    np.testing.assert_allclose(back(s), np.linalg.svd(A, compute_uv=False), rtol=1e-14)
    Q, R = ops.qr(conv(A))
    assert back(Q).shape == (5, 3) and back(R).shape == (3, 3)
    np.testing.assert_allclose(back(Q) @ back(R), A, atol=1e-14)
    w, _ = ops.eigh(conv(S))
    np.testing.assert_allclose(back(w), np.linalg.eigvalsh(S), rtol=1e-14)
    np.testing.assert_allclose(back(ops.cholesky(conv(S))), Lo, rtol=1e-14)
    b = rng.standard_normal((3, 2))
    np.testing.assert_allclose(back(ops.solve(conv(S), conv(b))), np.linalg.solve(S, b), rtol=1e-12)
    np.testing.assert_allclose(back(ops.solve_triangular(conv(Lo), conv(b), lower=True)),
                               np.linalg.solve(Lo, b), rtol=1e-12)
    np.testing.assert_allclose(back(ops.solve_triangular(conv(Lo.T), conv(b), lower=False)),
                               np.linalg.solve(Lo.T, b), rtol=1e-12)
    np.testing.assert_allclose(back(ops.softplus(conv(x))), np.log1p(np.exp(x)), rtol=1e-15)
    np.testing.assert_allclose(back(ops.sigmoid(conv(x))), 1 / (1 + np.exp(-x)), rtol=1e-15)
    assert back(ops.sigmoid(conv(np.array([0.0])))).tolist() == [0.5]
    assert ops.isfinite_all(conv(A)) is True
    for bad in (np.nan, np.inf, -np.inf):
        y = A.copy()
        y[2, 1] = bad
        assert ops.isfinite_all(conv(y)) is False
    assert ops.isfinite_all(conv(np.zeros((0, 3)))) is True
    assert back(conv(A)).dtype == np.float64


def test_unit_roundoff_is_half_eps_per_dtype():
    assert NumpyOps().dtype_unit_roundoff(np.zeros(1, np.float32)) == 2.0**-24
    t = TorchOps()
    assert t.dtype_unit_roundoff(torch.zeros(1, dtype=torch.float32)) == 2.0**-24
    assert t.dtype_unit_roundoff(torch.zeros(1, dtype=torch.bfloat16)) == 2.0**-8
    assert NumpyOps().eye(2, like=np.zeros(1, np.float32)).dtype == np.float32


def test_torch_ops_to_numpy_is_float64_and_detached():
    x = torch.tensor([1.5, -2.0], dtype=torch.float32, requires_grad=True)
    y = TorchOps().to_numpy(x)
    assert y.dtype == np.float64 and y.tolist() == [1.5, -2.0]
    assert NumpyOps().to_numpy([1, 2]).dtype == np.float64


@pytest.mark.parametrize("values, finite", [
    ([float("inf"), 1.0], False), ([1.0, float("-inf")], False), ([float("nan"), 1.0], False), ([1.0, 2.0], True),
    ([float("nan")], False),  # one entry: not the empty case
    ([3.0], True),
])
def test_isfinite_all_torch_sees_one_bad_entry_at_either_end(values, finite):
    assert TorchOps().isfinite_all(torch.tensor(values)) is finite


def test_ops_for_picks_the_library_of_its_argument():
    assert isinstance(ops_for(torch.zeros(1)), TorchOps)
    assert isinstance(ops_for(np.zeros(1)), NumpyOps)
    assert isinstance(ops_for([1.0]), NumpyOps)
    ops = ops_for(torch.zeros(1))
    assert ops.matmul_format is None and ops.matmul_dtype is None


def test_numpy_triangular_solve_does_not_check_finiteness():
    """NaN in, NaN out: the guards upstream decide what a non-finite state means, not a ValueError here."""
    L = np.array([[2.0, 0.0], [1.0, 1.0]])
    out = NumpyOps().solve_triangular(L, np.array([[np.nan], [1.0]]), lower=True)
    assert np.isnan(out).all()


def test_isfinite_all_on_the_torch_reduction_path():
    """A tensor numpy cannot view (one that requires grad; a CUDA one) is judged by its min and max."""
    ops = TorchOps()
    for values, finite in (([1.0, -2.0], True), ([1.0, float("nan")], False), ([float("inf"), 0.0], False),
                           ([0.0, float("-inf")], False)):
        x = torch.tensor(values, requires_grad=True)
        assert ops.isfinite_all(x) is finite
    assert ops.isfinite_all(torch.zeros(0, requires_grad=True)) is True


def test_linalg_errors_name_numpys_and_torchs_factorisation_failures():
    from pitcheck.numerics.arrays import linalg_errors

    assert linalg_errors() == (np.linalg.LinAlgError, torch.linalg.LinAlgError)
