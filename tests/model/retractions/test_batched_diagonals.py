"""StackedOps.on_diagonals: one call on a stack's diagonal view where that gives every matrix's own bits (a
CPU kernel's scalar remainder), the per-matrix loop elsewhere; the engine's softplus and sigmoid, bit for bit."""
import numpy as np
import pytest
import torch

from pitcheck.model.retractions import stacked as BR
from pitcheck.numerics.arrays import TorchOps
from pitcheck.model.retractions.stacked import StackedOps

SPECIAL = [np.inf, -np.inf, np.nan, 0.0, -0.0, 20.0, -20.0, 30.0, -88.0, 1e-45, 1e-30]


def _stack(B, D, dtype, seed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((B, D, D)) * 10.0 ** rng.integers(-8, 3, (B, D, D))
    special = rng.random((B, D, D)) < 0.1
    a[special] = rng.choice(SPECIAL, special.sum())
    return torch.from_numpy(a).to(dtype)


def _bits(x):
    return x.contiguous().view(torch.int32 if x.dtype == torch.float32 else torch.int64)


def _per_matrix(fn, x):
    return torch.stack([fn(torch.diag(m)) for m in x])


@pytest.mark.parametrize("dtype,D", [(torch.float32, D) for D in (1, 2, 7, 8, 15, 16, 32, 33)]
                         + [(torch.float64, D) for D in (1, 4, 7, 8, 16)])
@pytest.mark.parametrize("name", ["softplus", "sigmoid"])
def test_on_diagonals_is_each_matrix_own_call_bit_for_bit(dtype, D, name):
    ops = StackedOps(TorchOps())
    fn = getattr(ops.base, name)
    for B in (1, 2, 6, 7):
        x = _stack(B, D, dtype, seed=B * 100 + D)
        assert torch.equal(_bits(ops.on_diagonals(fn, x)), _bits(_per_matrix(fn, x)))


def test_the_one_call_is_taken_only_below_two_avx2_vectors(monkeypatch):
    ops = StackedOps(TorchOps())
    calls = []
    monkeypatch.setattr(torch, "diag", lambda m, _real=torch.diag: (calls.append(1), _real(m))[1])
    x = _stack(6, 8, torch.float32, seed=0)
    expected_one_call = BR._x86_simd()
    ops.on_diagonals(ops.base.sigmoid, x)
    assert (calls == []) == expected_one_call
    calls.clear()
    ops.on_diagonals(ops.base.sigmoid, _stack(6, 16, torch.float32, seed=0))  # 64 bytes: the loop
    assert len(calls) == 6
    calls.clear()
    ops.on_diagonals(ops.base.sigmoid, _stack(6, 8, torch.float64, seed=0))  # 64 bytes: the loop
    assert len(calls) == 6


def test_a_one_call_past_the_scalar_remainder_would_differ(monkeypatch):
    """Why the size rule: at D = 32 float32 (128 bytes, two AVX512 vectors) a lone diagonal is vectorised and
    the stack's strided view is not; lifting the rule there gives other bits (on an AVX512 machine)."""
    if torch.backends.cpu.get_cpu_capability() != "AVX512":
        pytest.skip("the vectorised path this shows is AVX512's")
    monkeypatch.setattr(BR, "SCALAR_TAIL_BYTES", 10**9)
    ops = StackedOps(TorchOps())
    x = _stack(6, 32, torch.float32, seed=1)
    assert not torch.equal(_bits(ops.on_diagonals(ops.base.softplus, x)), _bits(_per_matrix(ops.base.softplus, x)))


@pytest.mark.parametrize("D", [1, 2, 7, 8, 9, 16, 17, 33, 64])
@pytest.mark.parametrize("name", ["softplus", "sigmoid"])
def test_numpy_on_diagonals_is_each_matrix_own_call_bit_for_bit(D, name):
    from pitcheck.numerics.arrays import NumpyOps

    ops = StackedOps(NumpyOps())
    fn = getattr(ops.base, name)
    for B in (1, 6, 7):
        x = _stack(B, D, torch.float64, seed=B + D).numpy()
        with np.errstate(all="ignore"):
            one_call = ops.on_diagonals(fn, x)
            loop = np.stack([fn(np.diag(m)) for m in x])
        np.testing.assert_array_equal(np.ascontiguousarray(one_call).view(np.int64), loop.view(np.int64))
