"""Triton NVFP4 kernels vs their torch references (models.quant.kernels.nvfp4's *_ref) on the GPU.

RNE: bit-identical codes, E4M3 block scales, scaled values and decode scale, on fresh inputs of
several scales and shapes (8192x5120 included). SR: always a neighbour, unbiased.
Run on the GPU machine: ``pytest -m gpu tests/models/quant``.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from models.quant import formats
from models.quant.formats import quantize
from models.quant.gemm_spec import nvfp4_linear_spec
from models.quant.rht import rht

import quant_oracles as oracle

pytestmark = pytest.mark.gpu

SHAPES = [(16, 16), (80, 400), (256, 1024), (8192, 5120)]
SCALES = [1e-3, 1.0, 3e3]


def _options(kernels, **changes):
    return dataclasses.replace(kernels.options.NVFP4_OPTIONS, **changes)


def _poison_allocator(numel_bytes: int) -> None:
    """Fill the caching allocator's free blocks with NaN bytes, so an unwritten output cannot pass."""
    torch.empty(numel_bytes * 3, dtype=torch.uint8, device="cuda").fill_(0xFF)
    torch.cuda.synchronize()


def _compare(out, reference, *, transposed: bool):
    view = (lambda t: t.t()) if transposed else (lambda t: t)
    oracle.assert_bits_equal(view(out.values), reference.scaled_values(out.values.dtype), "scaled values")
    oracle.assert_bits_equal(
        view(out.block_scales.view(torch.uint8)), reference.block_scales.view(torch.uint8), "E4M3 scale bits"
    )
    assert torch.equal(view(out.codes), reference.codes), "E2M1 codes"
    oracle.assert_bits_equal(out.decode_scale.reshape(()), reference.tensor_scale, "decode scale")


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("two_d", [False, True])
def test_rows_kernel_bit_identical(kernels, shape, scale, dtype, two_d):
    x = oracle.cuda_input(shape, scale, dtype)
    _poison_allocator(x.numel() * 4)
    out = kernels.nvfp4.quantize_rows(x, two_d=two_d, write_codes=True, out_dtype=torch.bfloat16)
    reference = kernels.nvfp4.quantize_rows_ref(x, two_d=two_d)
    _compare(out, reference, transposed=False)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("use_rht", [False, True])
def test_columns_kernel_bit_identical(kernels, shape, scale, dtype, use_rht):
    x = oracle.cuda_input(shape, scale, dtype)
    reference = kernels.nvfp4.quantize_columns_ref(x, rht=use_rht)
    # bf16 input with the RHT: both ways of rounding the transform to bf16 (Nvfp4Options.bf16_rounding)
    for bf16_rounding in ("integer", "hardware") if use_rht and dtype == torch.bfloat16 else ("integer",):
        _poison_allocator(x.numel() * 4)
        out = kernels.nvfp4.quantize_columns(x, rht=use_rht, write_codes=True, out_dtype=torch.float32,
                                             options=_options(kernels, bf16_rounding=bf16_rounding))
        _compare(out, reference, transposed=True)


@pytest.mark.parametrize("bf16_rounding", ["integer", "hardware"])
def test_rht_rounding_to_bf16_ties_and_subnormals(kernels, bf16_rounding):
    """The transform's bf16 rounding on values that land on ties (1 + 2^-8 between 1 and 1 + 2^-7,
    and others), on bf16 subnormals and on random values, through the RHT amax pass (whose amax sets the
    decode scale) and the columns kernel, against torch's rht (a CUDA .to(bfloat16))."""
    options = _options(kernels, bf16_rounding=bf16_rounding)
    columns = []
    for first, second in [(1.0, 2.0**-8), (1.0, 3 * 2.0**-8), (1.5, 2.0**-8), (3.0, 2.0**-7), (1e-38, 1e-40),
                          (2.0**-126, 2.0**-133)]:
        column = torch.zeros(16)
        column[0], column[1] = first, second  # the RHT output holds first +- second (over 4)
        columns.append(column)
    x = torch.stack(columns, dim=1).repeat(4, 8)  # [64, 48]
    x[:, -16:] = torch.randn(64, 16) * 1e-39  # subnormal inputs
    x = torch.cat([x, torch.randn(64, 80)], dim=1).to(torch.bfloat16).cuda()
    transformed = rht(x.t())
    _compare(kernels.nvfp4.quantize_columns(x, rht=True, write_codes=True, options=options),
             quantize(transformed, "nvfp4"), transposed=True)
    shared = kernels.nvfp4_amax.rows_and_rht_columns_scales(x, options=options)
    expected = quantize(transformed, "nvfp4")
    assert torch.equal(shared[1:2], expected.tensor_scale.reshape(1))


def test_ties_bit_identical(kernels):
    """Exact E2M1 and E4M3 ties (see the CPU test of the same name) through the kernels."""
    ties = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
    block0 = [3.0] + [t / 2 for t in ties] + [-t / 2 for t in ties] + [0.0]
    rows = [block0, [17 / 64] * 16, [19 / 64] * 16, [1.5 * 2.0**-15] * 16, [7.0] + [0.0] * 15]
    x = torch.tensor(rows).reshape(1, 80).repeat(16, 1).cuda()
    out = kernels.nvfp4.quantize_rows(x, write_codes=True)
    _compare(out, quantize(x, "nvfp4"), transposed=False)
    out = kernels.nvfp4.quantize_columns(x.t().contiguous(), write_codes=True)
    _compare(out, quantize(x, "nvfp4"), transposed=True)


def test_gpu_reference_matches_cpu_reference():
    """The torch reference itself is device-independent (CUDA casts and division included)."""
    x = oracle.fresh_input(64, 256, 1.0, torch.bfloat16)
    for tile in [(1, 16), (16, 16)]:
        cpu = quantize(x, "nvfp4", tile=tile)
        gpu = quantize(x.cuda(), "nvfp4", tile=tile)
        assert torch.equal(gpu.codes.cpu(), cpu.codes)
        assert torch.equal(gpu.block_scales.view(torch.uint8).cpu(), cpu.block_scales.view(torch.uint8))
        assert torch.equal(gpu.dequantize().cpu(), cpu.dequantize())
    assert torch.equal(rht(x.cuda()).cpu(), rht(x))
    for fmt in ["mxfp4", "mxfp8", "fp8_block", "fp8_tensor"]:
        x128 = oracle.fresh_input(128, 256, 1.0, torch.float32)
        assert torch.equal(quantize(x128.cuda(), fmt).dequantize().cpu(), quantize(x128, fmt).dequantize()), fmt


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_non_finite_input_gives_nan_everywhere(kernels, bad):
    x = torch.randn(64, 128, device="cuda", dtype=torch.bfloat16)
    x[7, 9] = bad
    with_rht = [kernels.nvfp4.quantize_columns(x, rht=True, write_codes=True,
                                               options=_options(kernels, bf16_rounding=bf16_rounding))
                for bf16_rounding in ("integer", "hardware")]
    for out in (
        kernels.nvfp4.quantize_rows(x, write_codes=True),
        kernels.nvfp4.quantize_rows(x, two_d=True, write_codes=True),
        *with_rht,
    ):
        assert out.decode_scale.isnan().all()
        assert (out.values.float() * out.decode_scale).isnan().all()
    _compare(kernels.nvfp4.quantize_rows(x, write_codes=True), quantize(x, "nvfp4"), transposed=False)


def _check_stochastic(q: torch.Tensor, v: torch.Tensor) -> None:
    """q [draws, n] grid values drawn for the scaled inputs v [n]: neighbours and unbiased."""
    grid = torch.tensor(formats.E2M1_GRID, device=v.device)
    magnitude = v.abs()
    index = torch.searchsorted(grid, magnitude, right=True)
    lower, upper = grid[index - 1], grid[index.clamp(max=7)]
    assert ((q.abs() == lower) | (q.abs() == upper)).all()
    # unbiased: |mean - v| within 6 standard errors, plus 3 draws' worth of slack for tiny
    # round-up probabilities where the normal approximation of the count is poor
    draws = q.shape[0]
    variance = (upper - magnitude) * (magnitude - lower)
    error = (q.mean(0) - v).abs()
    assert (error <= 6 * (variance / draws).sqrt() + 3 * (upper - lower) / draws + 1e-6).all()
    assert (q.std(0) > 0).any()


def _grid_values(codes: torch.Tensor) -> torch.Tensor:
    grid = torch.tensor(formats.E2M1_GRID, device=codes.device)
    magnitude = grid[(codes & 7).long()]
    return torch.where((codes & 8) != 0, -magnitude, magnitude)


def _stochastic_rows(kernels, draws: int, seed: int):
    """One random bf16 row of 64 quantized `draws` times with SR: (out, grid values, scaled targets v)."""
    row = (torch.randn(1, 64, device="cuda") * 2).to(torch.bfloat16)
    out = kernels.nvfp4.quantize_rows(row.expand(draws, 64).contiguous(), stochastic=True, write_codes=True, seed=seed)
    reciprocal = torch.minimum(
        1.0 / (out.block_scales.float()[0].repeat_interleave(16) * out.decode_scale), torch.tensor(formats.FLT_MAX)
    )
    return out, row, _grid_values(out.codes), (row.float()[0] * reciprocal).clamp(-6, 6)


def test_stochastic_rows_neighbours_and_unbiased(kernels):
    draws = 20000
    out, row, q, v = _stochastic_rows(kernels, draws, seed=1)
    _check_stochastic(q, v)
    again = kernels.nvfp4.quantize_rows(row.expand(draws, 64).contiguous(), stochastic=True, write_codes=True, seed=2)
    assert not torch.equal(again.codes, out.codes)


def test_stochastic_columns_with_rht_neighbours_and_unbiased(kernels):
    draws = 20000
    column = (torch.randn(16, 1, device="cuda") * 2).to(torch.bfloat16)
    x = column.expand(16, draws).contiguous()  # every column is one independent draw
    out = kernels.nvfp4.quantize_columns(x, rht=True, stochastic=True, write_codes=True)
    transformed = rht(column.t()).float()[0]  # [16]
    scale = out.block_scales.float()[0, 0]
    reciprocal = torch.minimum(1.0 / (scale * out.decode_scale), torch.tensor(formats.FLT_MAX))
    v = (transformed * reciprocal).clamp(-6, 6)
    _check_stochastic(_grid_values(out.codes).t(), v)


def _assert_draws_independent(q: torch.Tensor, v: torch.Tensor) -> None:
    """Rounding-up decisions of different elements are uncorrelated over the draws.

    q: [draws, n] rounded grid values, v: [n] the scaled targets. One Philox call serves a
    16-element block (a byte of its four words each); if two of them were handed the same bits,
    their up/down decisions would be correlated (~0.5 and more), which unbiasedness alone would
    not reveal.
    """
    up = (q.abs() > v.abs()).float()
    p = up.mean(0)
    varied = (p > 0.05) & (p < 0.95)
    assert varied.sum() >= 4, "too few elements with a real choice between neighbours"
    correlation = torch.corrcoef(up[:, varied].t())
    off_diagonal = correlation - torch.diag(torch.diag(correlation))
    assert off_diagonal.abs().max() < 0.05, off_diagonal.abs().max()


def test_stochastic_draws_independent_within_philox_calls(kernels):
    draws = 20000
    _assert_draws_independent(*_stochastic_rows(kernels, draws, seed=3)[2:])

    column = (torch.randn(16, 1, device="cuda") * 2).to(torch.bfloat16)
    out = kernels.nvfp4.quantize_columns(column.expand(16, draws).contiguous(), rht=True, stochastic=True,
                                         write_codes=True, seed=3)
    reciprocal = torch.minimum(1.0 / (out.block_scales.float()[0, 0] * out.decode_scale), torch.tensor(formats.FLT_MAX))
    _assert_draws_independent(_grid_values(out.codes).t(), (rht(column.t()).float()[0] * reciprocal).clamp(-6, 6))


def test_quant_linear_kernels_match_torch_path(kernels):
    from models.quant.linear import QuantLinear

    torch.manual_seed(0)
    module = QuantLinear(256, 384, bias=False, spec=nvfp4_linear_spec(stochastic_rounding=False)).cuda()
    x = torch.randn(4, 64, 256, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(4, 64, 384, device="cuda", dtype=torch.bfloat16)
    oracle.assert_layer_kernels_match_torch_path(kernels, module, x, dy)


@pytest.mark.parametrize("shape", [(256, 384), (8192, 5120)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_shared_scales_equal_the_separate_passes(kernels, shape, dtype):
    """One read for an operand's two orientations (nvfp4_amax.rows_and_rht_columns_scales, what
    QuantLinear takes for X and dY) gives the separate passes' scales, and the quantize calls given
    them the very outputs of the calls that take their own, stochastic rounding's draws included."""
    nvfp4, amax = kernels.nvfp4, kernels.nvfp4_amax
    x = oracle.cuda_input(shape, 3.0, dtype)
    scales = amax.rows_and_rht_columns_scales(x)
    separate = amax.rht_global_scales(x)
    assert torch.equal(scales[[0, 1, 3]], separate[[0, 1, 3]]) and torch.equal(scales[2:3], amax.tensor_amax(x))
    for stochastic in (False, True):
        pairs = [(nvfp4.quantize_rows(x, stochastic=stochastic, seed=11, amax=scales[2:], write_codes=True),
                  nvfp4.quantize_rows(x, stochastic=stochastic, seed=11, write_codes=True)),
                 (nvfp4.quantize_columns(x, rht=True, stochastic=stochastic, seed=11, global_scales=scales,
                                         write_codes=True),
                  nvfp4.quantize_columns(x, rht=True, stochastic=stochastic, seed=11, write_codes=True))]
        for given, alone in pairs:
            assert torch.equal(given.codes, alone.codes) and torch.equal(given.values, alone.values)
            assert torch.equal(given.block_scales.view(torch.uint8), alone.block_scales.view(torch.uint8))
            oracle.assert_bits_equal(given.decode_scale, alone.decode_scale, "decode scale")


def _kernel_launches(run) -> dict:
    """Launches of each Triton kernel while run() runs: {kernel name: count} from torch's profiler."""
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as profile:
        run()
        torch.cuda.synchronize()
    counts = {}
    for event in profile.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            counts[event.name] = counts.get(event.name, 0) + 1
    return counts


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_quant_linear_reads_each_operand_once_for_its_global_scales(kernels, dtype):
    """Per fwd+bwd, X and dY each take one RHT amax pass that also gives their rows' amax, and only W
    (2D) a plain amax pass; under no_grad X and W take one plain pass each. The outputs and gradients
    equal the torch path's (RNE), the fp32 input taking the shared pass's fp32 launch."""
    from models.quant.linear import QuantLinear

    torch.manual_seed(0)
    module = QuantLinear(256, 384, bias=False, spec=nvfp4_linear_spec(stochastic_rounding=False)).cuda()
    x = torch.randn(4, 64, 256, device="cuda", dtype=dtype) * 3
    dy = torch.randn(4, 64, 384, device="cuda", dtype=dtype) * 1e-3

    def step():
        module.weight.grad = None
        xi = x.clone().requires_grad_(True)
        y = module(xi)
        y.backward(dy)
        return y, xi.grad, module.weight.grad.clone()

    step()  # compiles the kernels outside the profiled run
    launches = _kernel_launches(step)
    assert launches.get("_amax_columns_rht_kernel", 0) == 2, launches
    assert launches.get("_amax_chunks_kernel", 0) == 1, launches
    with torch.no_grad():
        launches = _kernel_launches(lambda: module(x))
    assert launches.get("_amax_columns_rht_kernel", 0) == 0 and launches.get("_amax_chunks_kernel", 0) == 2, launches
    fast = step()
    try:
        kernels.use_triton(False)
        reference = step()
    finally:
        kernels.use_triton(True)
    assert torch.equal(fast[0], reference[0]) and torch.equal(fast[1], reference[1])
    # Wgrad's operands are bit-identical; cuBLAS may sum the transposed views in another order.
    torch.testing.assert_close(fast[2], reference[2], rtol=2**-7, atol=0)


@pytest.mark.parametrize("with_consumers", [False, True])
@pytest.mark.parametrize("stochastic_rounding", [False, True])
def test_quant_linear_compiled_with_inductor_matches_eager(kernels, stochastic_rounding, with_consumers):
    """The kernels inside torch.compile (Inductor compiles each user Triton kernel from spliced
    source: a helper imported under an alias once broke exactly this) give the eager results.
    with_consumers: the layer inside a function that doubles X and the output in fp32 (exact), so
    Inductor fuses the traced output scaling of Fprop and Dgrad into those ops; a lost bf16 rounding
    would show bit for bit."""
    from models.quant.linear import QuantLinear

    torch.manual_seed(0)
    module = QuantLinear(256, 384, bias=False, spec=nvfp4_linear_spec(stochastic_rounding=stochastic_rounding)).cuda()

    def around(inputs):
        return module(inputs * 2).float() * 2

    eager = around if with_consumers else module
    compiled = torch.compile(eager, backend="inductor", fullgraph=True)  # one graph: the SR seed is a tensor
    x = torch.randn(4, 64, 256, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(4, 64, 384, device="cuda", dtype=torch.bfloat16)
    results = []
    for run in (eager, compiled):
        if hasattr(module, "set_step"):
            module.set_step(7)  # the same stochastic-rounding draws in both runs
        module.weight.grad = None
        xi = x.clone().requires_grad_(True)
        y = run(xi)
        y.backward(dy.to(y.dtype))  # bf16 values: 2 dY is exact in fp32 and bf16
        results.append((y, xi.grad, module.weight.grad.clone()))
    (y_eager, dx_eager, dw_eager), (y_compiled, dx_compiled, dw_compiled) = results
    assert torch.isfinite(y_compiled).all() and torch.isfinite(dw_compiled).all()
    assert torch.equal(y_compiled, y_eager) and torch.equal(dx_compiled, dx_eager)
    torch.testing.assert_close(dw_compiled, dw_eager, rtol=2**-7, atol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_gemm_output_epilogue_bit_identical(kernels, dtype):
    """kernels.epilogue.scale_gemm_output against torch's mul-then-cast (and, for Wgrad, -then-widen) on a
    fresh fp32 GEMM output with zeros of both signs, NaN, Inf and values near bf16 ties."""
    out = torch.randn(1000, 2064, device="cuda") * 37.0
    out.view(-1)[::97] = 0.0
    out.view(-1)[1::101] = -0.0
    out.view(-1)[5], out.view(-1)[7] = math.nan, math.inf
    decode = torch.rand((), device="cuda") * torch.rand((), device="cuda")
    expected = torch.mul(out, decode, out=torch.empty(out.shape, dtype=dtype, device="cuda"))
    got = kernels.epilogue.scale_gemm_output(out.clone(), decode, dtype)
    assert got.dtype == dtype
    oracle.assert_bits_equal(got, expected, f"epilogue to {dtype}")
    zeros = expected.float() == 0
    assert torch.equal(torch.signbit(got.float()[zeros]), torch.signbit(expected.float()[zeros]))
    if dtype == torch.bfloat16:
        buffer = out.clone()
        widened = kernels.epilogue.scale_gemm_output(buffer, decode, dtype, widen_to=torch.float32)
        assert widened.dtype == torch.float32 and widened.data_ptr() == buffer.data_ptr()  # in place
        oracle.assert_bits_equal(widened, expected.float(), "epilogue widened to fp32")
    # No decode scale (MX formats): the rounding alone.
    no_scale = kernels.epilogue.scale_gemm_output(out.clone(), None, dtype)
    oracle.assert_bits_equal(no_scale, out.to(dtype), f"epilogue without a scale to {dtype}")
    if dtype == torch.bfloat16:
        buffer = out.clone()
        widened = kernels.epilogue.scale_gemm_output(buffer, None, dtype, widen_to=torch.float32)
        oracle.assert_bits_equal(widened, out.to(dtype).float(), "epilogue without a scale widened to fp32")
