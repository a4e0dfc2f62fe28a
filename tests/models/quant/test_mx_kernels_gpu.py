"""Triton MXFP4 kernels (models.quant.kernels.mx) vs their torch references on the GPU.

Bit-identical codes, E8M0 scales and scaled values on fresh inputs of several scales and shapes
(8192 x 5120 included), for round to nearest and for stochastic rounding given the uniforms of the
kernels' Philox draw (re-implemented in numpy, quant_oracles.py); the emulated layer on the kernels
against the torch path, eager and compiled. Run on the GPU machine: ``pytest -m gpu tests/models/quant``.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from models.quant.gemm_spec import mxfp4_linear_spec
from models.quant.kernels.options import MX_OPTIONS

import quant_oracles as oracle

pytestmark = pytest.mark.gpu

SHAPES = [(32, 32), (96, 640), (256, 1152), (8192, 5120)]
SCALES = [2.0**-130, 1e-3, 1.0, 3e3, 2.0**100]


@pytest.fixture(scope="module")
def mx():
    pytest.importorskip("triton")
    from models.quant import kernels

    kernels.use_triton(True)
    assert kernels.enabled()
    return kernels.mx


def _input(shape, scale, dtype):
    x = oracle.fresh_input(shape[0], shape[1], scale, torch.float32, block=32)
    x[shape[0] // 2, :32] = torch.randn(32).sign() * (1 + 3 * torch.rand(32)) * 2.0**-126  # the smallest scale
    return x.to(dtype).cuda()


def _poison_allocator(numel_bytes: int) -> None:
    """Fill the caching allocator's free blocks with 0xFF bytes, so an unwritten output cannot pass."""
    torch.empty(numel_bytes * 3, dtype=torch.uint8, device="cuda").fill_(0xFF)
    torch.cuda.synchronize()


def _compare(out, reference, *, transposed: bool, what: str = ""):
    view = (lambda t: t.t()) if transposed else (lambda t: t)
    values, expected = view(out.values).float(), reference.scaled_values(out.values.dtype).float()
    same = (values == expected) | (values.isnan() & expected.isnan())
    assert same.all(), f"{what} values: {int((~same).sum())} of {same.numel()} differ"
    assert torch.equal(view(out.block_scales.view(torch.uint8)), reference.block_scales.view(torch.uint8)), \
        f"{what} E8M0 scales"
    assert torch.equal(view(out.codes), reference.codes), f"{what} E2M1 codes"


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rows_kernel_bit_identical(mx, shape, scale, dtype):
    x = _input(shape, scale, dtype)
    _poison_allocator(x.numel() * 4)
    _compare(mx.quantize_rows(x, write_codes=True), mx.quantize_rows_ref(x), transposed=False)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("use_rht", [False, True])
def test_columns_kernel_bit_identical(mx, shape, scale, dtype, use_rht):
    x = _input(shape, scale, dtype)
    reference = mx.quantize_columns_ref(x, rht=use_rht)
    for bf16_rounding in ("integer", "hardware") if use_rht and dtype == torch.bfloat16 else ("hardware",):
        options = dataclasses.replace(MX_OPTIONS, bf16_rounding=bf16_rounding)
        _poison_allocator(x.numel() * 4)
        out = mx.quantize_columns(x, rht=use_rht, write_codes=True, out_dtype=torch.float32, options=options)
        _compare(out, reference, transposed=True, what=bf16_rounding)


@pytest.mark.parametrize("shape", [(64, 96), (1024, 1152)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("seed", [3, 2**45 + 17])
def test_stochastic_rounding_bit_identical_given_the_philox_uniforms(mx, shape, dtype, seed):
    x = _input(shape, 3.0, dtype)
    rows, cols = shape
    _compare(mx.quantize_rows(x, stochastic=True, seed=seed, write_codes=True),
             mx.quantize_rows_ref(x, uniform=oracle.mx_rows_uniforms(seed, rows, cols).cuda()), transposed=False,
             what="rows")
    columns_uniform = oracle.mx_columns_uniforms(seed, rows, cols).cuda()
    for use_rht in (False, True):
        _compare(mx.quantize_columns(x, rht=use_rht, stochastic=True, seed=torch.tensor([seed], device="cuda"),
                                     write_codes=True),
                 mx.quantize_columns_ref(x, rht=use_rht, uniform=columns_uniform), transposed=True,
                 what=f"columns rht={use_rht}")


def test_stochastic_rounding_is_unbiased(mx):
    """20,000 draws of one row: every value one of its two grid neighbours, the mean within 6
    standard errors of x / X (8 random bits: within 1/512 of a grid step besides)."""
    draws = 20000
    row = (torch.randn(1, 64, device="cuda") * 2).to(torch.bfloat16)
    out = mx.quantize_rows(row.expand(draws, 64).contiguous(), stochastic=True, write_codes=True, out_dtype=torch.float32)
    scale = out.block_scales.float()[0].repeat_interleave(32)
    v = (row.float()[0] / scale).clamp(-6, 6)
    q = out.values / scale
    grid = torch.tensor((0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0), device="cuda")
    index = torch.searchsorted(grid, v.abs(), right=True)
    lower, upper = grid[index - 1], grid[index.clamp(max=7)]
    assert ((q.abs() == lower) | (q.abs() == upper)).all()
    error = (q.mean(0) - v).abs()
    bound = 6 * ((upper - v.abs()) * (v.abs() - lower) / draws).sqrt() + (upper - lower) / 512 + 3 * (upper - lower) / draws
    assert (error <= bound + 1e-6).all()


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_non_finite_input_gives_nan_in_its_block_only(mx, bad):
    x = torch.randn(64, 128, device="cuda", dtype=torch.bfloat16)
    x[7, 9] = bad
    _compare(mx.quantize_rows(x, write_codes=True), mx.quantize_rows_ref(x), transposed=False)
    _compare(mx.quantize_columns(x, rht=True, write_codes=True), mx.quantize_columns_ref(x, rht=True), transposed=True)
    values = mx.quantize_rows(x).values.float()
    assert values[7, :32].isnan().all() and not values[7, 32:].isnan().any() and not values[8:].isnan().any()


def _layer_results(module, x, dy, *, compiled=False):
    run = torch.compile(module, backend="inductor", fullgraph=True) if compiled else module
    module.set_step(7)  # the same stochastic-rounding draws in every run
    module.weight.grad = None
    xi = x.clone().requires_grad_(True)
    y = run(xi)
    y.backward(dy)
    return y, xi.grad, module.weight.grad.clone()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_quant_linear_on_the_kernels_matches_the_torch_path(mx, dtype):
    """mxfp4 (RNE) through QuantLinear: the registry's kernel module against the torch reference."""
    from models.quant import kernels
    from models.quant.linear import QuantLinear

    torch.manual_seed(0)
    module = QuantLinear(256, 384, bias=False, spec=mxfp4_linear_spec(stochastic_rounding=False)).cuda()
    x = torch.randn(4, 64, 256, device="cuda", dtype=dtype)
    dy = torch.randn(4, 64, 384, device="cuda", dtype=dtype)
    fast = _layer_results(module, x, dy)
    try:
        kernels.use_triton(False)
        reference = _layer_results(module, x, dy)
    finally:
        kernels.use_triton(True)
    assert torch.equal(fast[0], reference[0]) and torch.equal(fast[1], reference[1])
    # Wgrad's operands are bit-identical; cuBLAS may sum the transposed views in another order.
    torch.testing.assert_close(fast[2], reference[2], rtol=2**-7, atol=0)


@pytest.mark.parametrize("stochastic_rounding", [False, True])
def test_quant_linear_compiled_with_inductor_matches_eager(mx, stochastic_rounding):
    from models.quant.linear import QuantLinear

    torch.manual_seed(0)
    module = QuantLinear(256, 384, bias=False, spec=mxfp4_linear_spec(stochastic_rounding=stochastic_rounding)).cuda()
    x = torch.randn(4, 64, 256, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(4, 64, 384, device="cuda", dtype=torch.bfloat16)
    eager = _layer_results(module, x, dy)
    compiled = _layer_results(module, x, dy, compiled=True)
    assert torch.isfinite(compiled[0]).all() and torch.isfinite(compiled[2]).all()
    assert torch.equal(compiled[0], eager[0]) and torch.equal(compiled[1], eager[1])
    torch.testing.assert_close(compiled[2], eager[2], rtol=2**-7, atol=0)
