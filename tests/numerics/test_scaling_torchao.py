"""The MX and NVFP4 recipes against a second implementation: torchao's reference (an optional test
dependency: these tests skip without it). torchao 0.18's CPU path; its CUDA kernels are not used."""
import warnings

import numpy as np
import pytest
import torch

from pitcheck.numerics.scaling import quantise
from tests.numerics.test_scaling import wide_matrix


def _torchao():
    pytest.importorskip("torchao", reason="torchao (optional) is the second implementation of the MX recipes")
    warnings.filterwarnings("ignore")
    from torchao.prototype.mx_formats import mx_tensor, nvfp4_tensor
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.prototype.mx_formats.kernels import f4_unpacked_to_f32, unpack_uint4

    return mx_tensor, nvfp4_tensor, ScaleCalculationMode, lambda d, shape: f4_unpacked_to_f32(unpack_uint4(d)).numpy().reshape(shape)


@pytest.mark.parametrize("recipe,dtype,mode", [("mxfp8", "float8_e4m3fn", "FLOOR"), ("mxfp8-e5m2", "float8_e5m2", "FLOOR"),
                                               ("mxfp4", "float4_e2m1fn_x2", "FLOOR"), ("mxfp8-rceil", "float8_e4m3fn", "RCEIL")])
@pytest.mark.parametrize("axis", [-1, 0])
def test_mx_matches_torchao(recipe, dtype, mode, axis):
    mx_tensor, _, Mode, unpack4 = _torchao()
    x = wide_matrix(1, spread=20)
    x[5, :32] = 0.0  # an all-zero block
    x[6, 40] = 1.9 * 2.0**7  # a block whose largest value saturates under the floor rule
    q = quantise(x, recipe, axis=axis)
    xt = torch.from_numpy(np.ascontiguousarray(x if axis == -1 else x.T))
    scale, data = mx_tensor.to_mx(xt, getattr(torch, dtype), 32, getattr(Mode, mode))
    values = unpack4(data, xt.shape) if "float4" in dtype else data.float().numpy()
    codes = scale.view(torch.uint8).numpy()
    if axis == 0:
        values, codes = values.T, codes.T
    assert np.array_equal(q.scale_codes, codes)
    assert np.array_equal(q.values, values)


@pytest.mark.parametrize("axis", [-1, 0])
def test_nvfp4_matches_torchao(axis):
    _, nvfp4, _, unpack4 = _torchao()
    x = wide_matrix(2, spread=3)  # torchao clamps a block scale below 2^-6 up to it: kept out of range here
    q = quantise(x, "nvfp4", axis=axis)
    xt = torch.from_numpy(np.ascontiguousarray(x if axis == -1 else x.T))
    g = nvfp4.per_tensor_amax_to_scale(xt.abs().max())
    scales, data = nvfp4.nvfp4_quantize(xt, 16, g)
    values, scales = unpack4(data, xt.shape), scales.float().numpy()
    if axis == 0:
        values, scales = values.T, scales.T
    assert q.global_scale == float(g) and q.scales.min() >= 2.0**-6
    assert np.array_equal(q.scales, scales) and np.array_equal(q.values, values)
