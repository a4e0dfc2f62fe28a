"""The NVFP4 Triton kernels with Four Over Six vs the torch reference (formats.four_over_six) on the GPU.

Bit for bit: E2M1 codes, E4M3 block scales, scaled values and the decode scale, on fresh inputs of
several scales and shapes (8192x5120 included), for both candidate errors, every launch configuration
tried; stochastic rounding with the documented Philox draws. Run on the GPU machine:
``pytest -m gpu tests/models/quant``.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from models.quant.gemm_spec import nvfp4_linear_spec
from models.quant.kernels.triton_common import tl, triton
from models.quant.linear import QuantLinear

import quant_oracles as oracle

pytestmark = pytest.mark.gpu

SHAPES = [(16, 16), (80, 400), (256, 1024), (8192, 5120)]

if triton is not None:
    from models.quant.kernels.nvfp4_four_over_six import divide_by_1536

    @triton.jit
    def _divide_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out_ptr + offsets, divide_by_1536(tl.load(x_ptr + offsets, mask=offsets < n)), mask=offsets < n)


def _compare(out, reference, *, transposed: bool, what: str):
    view = (lambda t: t.t()) if transposed else (lambda t: t)
    oracle.assert_bits_equal(view(out.values), reference.scaled_values(out.values.dtype), f"{what} scaled values")
    oracle.assert_bits_equal(view(out.block_scales.view(torch.uint8)), reference.block_scales.view(torch.uint8),
                             f"{what} scales")
    assert torch.equal(view(out.codes), reference.codes), f"{what} codes"
    oracle.assert_bits_equal(out.decode_scale.reshape(()), reference.tensor_scale, f"{what} decode scale")


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("error", ["mse", "mae"])
@pytest.mark.parametrize("scale", [1e-3, 1.0, 3e3])
def test_rows_2d_and_columns_equal_the_reference(kernels, shape, dtype, error, scale):
    nvfp4 = kernels.nvfp4
    x = oracle.cuda_input(shape, scale, dtype)
    _compare(nvfp4.quantize_rows(x, write_codes=True, four_over_six=error),
             nvfp4.quantize_rows_ref(x, four_over_six=error), transposed=False, what="rows")
    _compare(nvfp4.quantize_rows(x, two_d=True, write_codes=True, four_over_six=error),
             nvfp4.quantize_rows_ref(x, two_d=True, four_over_six=error), transposed=False, what="2D")
    for rht in (False, True):
        _compare(nvfp4.quantize_columns(x, rht=rht, write_codes=True, four_over_six=error),
                 nvfp4.quantize_columns_ref(x, rht=rht, four_over_six=error), transposed=True,
                 what=f"columns rht={rht}")


@pytest.mark.parametrize("launch", [(16, 256, 4), (4, 64, 2), (32, 512, 8)])
def test_every_launch_gives_the_same_bits(kernels, launch):
    nvfp4 = kernels.nvfp4
    options = dataclasses.replace(kernels.options.NVFP4_OPTIONS, rows_four_over_six=launch,
                                  two_d_four_over_six=(16, launch[1], launch[2]))
    x = oracle.cuda_input((256, 1152), 1.0, torch.bfloat16)
    _compare(nvfp4.quantize_rows(x, write_codes=True, four_over_six="mse", options=options),
             nvfp4.quantize_rows_ref(x, four_over_six="mse"), transposed=False, what=f"rows {launch}")
    _compare(nvfp4.quantize_rows(x, two_d=True, write_codes=True, four_over_six="mse", options=options),
             nvfp4.quantize_rows_ref(x, two_d=True, four_over_six="mse"), transposed=False, what=f"2D {launch}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_stochastic_rounding_with_the_documented_draws(kernels, dtype):
    nvfp4 = kernels.nvfp4
    rows, cols, seed = 256, 1024, 2**40 + 7
    x = oracle.cuda_input((rows, cols), 1.0, dtype)
    _compare(nvfp4.quantize_rows(x, stochastic=True, seed=seed, write_codes=True, four_over_six="mse"),
             nvfp4.quantize_rows_ref(x, four_over_six="mse", rounding="stochastic",
                                     uniform=oracle.mx_rows_uniforms(seed, rows, cols).cuda()),
             transposed=False, what="rows SR")
    for rht in (False, True):
        _compare(nvfp4.quantize_columns(x, rht=rht, stochastic=True, seed=seed, write_codes=True, four_over_six="mse"),
                 nvfp4.quantize_columns_ref(x, rht=rht, four_over_six="mse", rounding="stochastic",
                                            uniform=oracle.mx_columns_uniforms(seed, rows, cols).t().cuda()),
                 transposed=True, what=f"columns rht={rht} SR")


@pytest.mark.parametrize("amax_exponent", [-130, -120, -100, 100, 118, 127])
def test_tensor_amax_near_the_range_ends(kernels, amax_exponent):
    """Where the blocks' dequantization units leave fp32's normal range, the kernels take the
    per-element quotients (kernels.nvfp4_four_over_six): still the reference bit for bit."""
    nvfp4 = kernels.nvfp4
    generator = torch.Generator().manual_seed(amax_exponent + 1000)
    x = torch.randn(256, 1024, generator=generator, dtype=torch.float64)
    x = x * torch.exp2(-torch.randint(0, 25, (256, 64), generator=generator).double()).repeat_interleave(16, 1)
    x = (x / x.abs().max() * 2.0**amax_exponent).float().cuda()
    _compare(nvfp4.quantize_rows(x, write_codes=True, four_over_six="mse"),
             nvfp4.quantize_rows_ref(x, four_over_six="mse"), transposed=False, what=f"rows 2^{amax_exponent}")
    _compare(nvfp4.quantize_rows(x, two_d=True, write_codes=True, four_over_six="mae"),
             nvfp4.quantize_rows_ref(x, two_d=True, four_over_six="mae"), transposed=False,
             what=f"2D 2^{amax_exponent}")
    _compare(nvfp4.quantize_columns(x, rht=True, write_codes=True, four_over_six="mse"),
             nvfp4.quantize_columns_ref(x, rht=True, four_over_six="mse"), transposed=True,
             what=f"columns 2^{amax_exponent}")


def test_division_by_1536_equals_ieee_division(kernels):
    """divide_by_1536 (integer and fp64 steps) against the GPU's IEEE fp32 division, on 2^24 random bit
    patterns: every exponent, subnormals, zeros of both signs, Inf and NaN."""
    generator = torch.Generator().manual_seed(5)
    bits = torch.randint(-2**31, 2**31, (2**24,), generator=generator, dtype=torch.int64)
    x = bits.to(torch.int32).view(torch.float32).cuda()
    out = torch.empty_like(x)
    _divide_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)
    # The oracle divides in fp64 on the CPU and rounds once to fp32 (exact: 53 >= 2 * 24 + 2 bits, so the
    # double rounding is innocuous). Not `x / 1536.0` on the GPU: torch multiplies a CUDA tensor by the
    # reciprocal of a CPU scalar divisor, which is off by one unit on about a third of these inputs.
    expected = (x.cpu().double() / 1536.0).float().cuda()
    same = (out.view(torch.int32) == expected.view(torch.int32)) | (out.isnan() & expected.isnan())
    assert same.all(), f"{int((~same).sum())} of {x.numel()} differ"


def test_shared_scales_equal_the_separate_passes(kernels):
    nvfp4, amax = kernels.nvfp4, kernels.nvfp4_amax
    x = oracle.cuda_input((8192, 5120), 3.0, torch.bfloat16)
    scales = amax.rows_and_rht_columns_scales(x, four_over_six=True)
    separate = amax.rht_global_scales(x, four_over_six=True)
    assert torch.equal(scales[[0, 1, 3]], separate[[0, 1, 3]]) and torch.equal(scales[2:3], amax.tensor_amax(x))
    _compare(nvfp4.quantize_rows(x, amax=scales[2:], write_codes=True, four_over_six="mse"),
             nvfp4.quantize_rows_ref(x, four_over_six="mse"), transposed=False, what="rows, shared")
    _compare(nvfp4.quantize_columns(x, rht=True, global_scales=scales, write_codes=True, four_over_six="mse"),
             nvfp4.quantize_columns_ref(x, rht=True, four_over_six="mse"), transposed=True, what="columns, shared")


def test_layer_with_kernels_equals_the_torch_path(kernels):
    """A QuantLinear of the full recipe + 4/6 with the kernels against the torch path (quant_oracles)."""
    spec = nvfp4_linear_spec(stochastic_rounding=False, four_over_six=("x", "w", "dy"))
    torch.manual_seed(0)
    module = QuantLinear(1024, 512, bias=False, dtype=torch.bfloat16, spec=spec, name="layers.0.mixer.in_proj").cuda()
    x = oracle.cuda_input((2048, 1024), 1.0, torch.bfloat16)
    dy = oracle.cuda_input((2048, 512), 1e-2, torch.bfloat16)
    oracle.assert_layer_kernels_match_torch_path(kernels, module, x, dy)
