"""The NVFP4 Triton kernels with UE5M3 block scales (``fmt="nvfp4_ue5m3"``) vs the torch reference on the GPU.

Bit for bit: E2M1 codes, UE5M3 block scale codes, scaled values and the decode scale, on fresh inputs of
several scales and shapes (8192x5120 included), rows spread over 2^-36 .. 1 of each other so that block
scales reach UE5M3's subnormals; stochastic rounding with the documented Philox draws; a QuantLinear with
the kernels against the torch path. Run on the GPU machine: ``pytest -m gpu tests/models/quant``.
"""

from __future__ import annotations

import pytest
import torch

from models.quant.gemm_spec import nvfp4_linear_spec
from models.quant.linear import QuantLinear

import quant_oracles as oracle

pytestmark = pytest.mark.gpu

FMT = "nvfp4_ue5m3"
SHAPES = [(16, 16), (80, 400), (256, 1024), (8192, 5120)]


def _input(shape, scale: float, dtype: torch.dtype) -> torch.Tensor:
    x = oracle.fresh_input(shape[0], shape[1], scale, torch.float32)
    x *= torch.logspace(-36, 0, shape[0], base=2.0)[torch.randperm(shape[0])][:, None]
    return x.to(dtype).cuda()


def _compare(nvfp4, out, reference, *, transposed: bool, what: str):
    view = (lambda t: t.t()) if transposed else (lambda t: t)
    oracle.assert_bits_equal(view(out.values), reference.scaled_values(out.values.dtype), f"{what} scaled values")
    assert torch.equal(view(out.block_scales), nvfp4.block_scale_codes(reference)), f"{what} UE5M3 scale codes"
    assert torch.equal(view(out.codes), reference.codes), f"{what} codes"
    oracle.assert_bits_equal(out.decode_scale.reshape(()), reference.tensor_scale, f"{what} decode scale")


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("scale", [1e-3, 1.0, 3e3])
def test_rows_2d_and_columns_equal_the_reference(kernels, shape, dtype, scale):
    nvfp4 = kernels.nvfp4
    x = _input(shape, scale, dtype)
    _compare(nvfp4, nvfp4.quantize_rows(x, write_codes=True, fmt=FMT), nvfp4.quantize_rows_ref(x, fmt=FMT),
             transposed=False, what="rows")
    _compare(nvfp4, nvfp4.quantize_rows(x, two_d=True, write_codes=True, fmt=FMT),
             nvfp4.quantize_rows_ref(x, two_d=True, fmt=FMT), transposed=False, what="2D")
    for rht in (False, True):
        _compare(nvfp4, nvfp4.quantize_columns(x, rht=rht, write_codes=True, fmt=FMT),
                 nvfp4.quantize_columns_ref(x, rht=rht, fmt=FMT), transposed=True, what=f"columns rht={rht}")


def test_stochastic_rounding_with_the_documented_draws(kernels):
    nvfp4 = kernels.nvfp4
    rows, cols, seed = 256, 1024, 2**40 + 11
    x = _input((rows, cols), 1.0, torch.bfloat16)
    _compare(nvfp4, nvfp4.quantize_rows(x, stochastic=True, seed=seed, write_codes=True, fmt=FMT),
             nvfp4.quantize_rows_ref(x, fmt=FMT, rounding="stochastic",
                                     uniform=oracle.mx_rows_uniforms(seed, rows, cols).cuda()),
             transposed=False, what="rows SR")
    for rht in (False, True):
        _compare(nvfp4, nvfp4.quantize_columns(x, rht=rht, stochastic=True, seed=seed, write_codes=True, fmt=FMT),
                 nvfp4.quantize_columns_ref(x, rht=rht, fmt=FMT, rounding="stochastic",
                                            uniform=oracle.mx_columns_uniforms(seed, rows, cols).t().cuda()),
                 transposed=True, what=f"columns rht={rht} SR")


def test_shared_scales_equal_the_separate_passes(kernels):
    nvfp4, amax = kernels.nvfp4, kernels.nvfp4_amax
    x = _input((8192, 5120), 3.0, torch.bfloat16)
    scales = amax.rows_and_rht_columns_scales(x, fmt=FMT)
    separate = amax.rht_global_scales(x, fmt=FMT)
    assert torch.equal(scales[[0, 1, 3]], separate[[0, 1, 3]]) and torch.equal(scales[2:3], amax.tensor_amax(x))
    _compare(nvfp4, nvfp4.quantize_rows(x, amax=scales[2:], write_codes=True, fmt=FMT),
             nvfp4.quantize_rows_ref(x, fmt=FMT), transposed=False, what="rows, shared")
    _compare(nvfp4, nvfp4.quantize_columns(x, rht=True, global_scales=scales, write_codes=True, fmt=FMT),
             nvfp4.quantize_columns_ref(x, rht=True, fmt=FMT), transposed=True, what="columns, shared")


def test_layer_with_kernels_equals_the_torch_path(kernels):
    """A QuantLinear of the full recipe with UE5M3 scales, kernels against the torch path (quant_oracles)."""
    spec = nvfp4_linear_spec(stochastic_rounding=False, fmt=FMT)
    torch.manual_seed(0)
    module = QuantLinear(1024, 512, bias=False, dtype=torch.bfloat16, spec=spec, name="layers.0.mixer.in_proj").cuda()
    x = oracle.cuda_input((2048, 1024), 1.0, torch.bfloat16)
    dy = oracle.cuda_input((2048, 512), 1e-2, torch.bfloat16)
    oracle.assert_layer_kernels_match_torch_path(kernels, module, x, dy)
