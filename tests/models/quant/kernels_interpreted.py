"""The Triton kernels against their torch references under Triton's interpreter, on the CPU.

Run by test_kernels_interpreted.py in a subprocess with TRITON_INTERPRET=1 (the variable must be
set before the kernels are defined), so CI checks the kernels' arithmetic on every change without a
GPU; the GPU tests (test_quant_kernels_gpu.py, test_fp8_torch_gpu.py) check the compiled kernels on
large tensors. Small shapes keep it to about a minute. Prints "ok <check>" per check; any mismatch
raises.

    TRITON_INTERPRET=1 PYTHONPATH=.:tests/models/quant python tests/models/quant/kernels_interpreted.py
"""

from __future__ import annotations

import itertools
import math
import os

import torch

import dataclasses

import quant_oracles as oracle
from models.quant import kernels
from models.quant.formats import E2M1_GRID, quantize
from models.quant.fp8_operand import Fp8Operand
from models.quant.kernels import epilogue, mx, nvfp4, nvfp4_amax
from models.quant.kernels import fp8 as fp8_kernels
from models.quant.kernels.fp8 import quantize_ref as fp8_quantize_ref
from models.quant.kernels.nvfp4 import quantize_columns_ref, quantize_rows_ref
from models.quant.kernels.options import MX_OPTIONS, NVFP4_OPTIONS, Fp8Options
from models.quant.rht import rht

assert os.environ.get("TRITON_INTERPRET") == "1", "run under TRITON_INTERPRET=1"
kernels.use_triton(True)


def same_bits(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
    a, e = actual.float(), expected.float()
    same = (a == e) | (a.isnan() & e.isnan())
    assert same.all(), f"{what}: {int((~same).sum())} of {same.numel()} differ"


def compare_nvfp4(out, reference, transposed: bool, what: str) -> None:
    view = (lambda t: t.t()) if transposed else (lambda t: t)
    same_bits(view(out.values), reference.scaled_values(out.values.dtype), f"{what} values")
    same_bits(view(out.block_scales.view(torch.uint8)), nvfp4.block_scale_codes(reference), f"{what} scales")
    assert torch.equal(view(out.codes), reference.codes), f"{what} codes"
    same_bits(out.decode_scale.reshape(()), reference.tensor_scale, f"{what} decode scale")


def check_nvfp4_round_to_nearest() -> None:
    # 48 x 608: three 256-column tiles of the rows kernels, the last one partial.
    for rows, cols, scale, dtype in [(32, 64, 1.0, torch.bfloat16), (32, 64, 1.0, torch.float32),
                                     (48, 160, 3e3, torch.bfloat16), (48, 608, 1.0, torch.bfloat16)]:
        x = oracle.fresh_input(rows, cols, scale, torch.float32).to(dtype)
        what = f"{rows}x{cols} {dtype} scale {scale}"
        compare_nvfp4(nvfp4.quantize_rows(x, write_codes=True), quantize_rows_ref(x), False, f"rows {what}")
        compare_nvfp4(nvfp4.quantize_rows(x, two_d=True, write_codes=True), quantize_rows_ref(x, two_d=True),
                      False, f"2D {what}")
        compare_nvfp4(nvfp4.quantize_columns(x, write_codes=True), quantize_columns_ref(x), True, f"columns {what}")
        compare_nvfp4(nvfp4.quantize_columns(x, rht=True, write_codes=True), quantize_columns_ref(x, rht=True), True,
                      f"columns RHT {what}")
    # Other launches (tiles that leave partial tiles, other groupings) give the same outputs.
    x = oracle.fresh_input(48, 160, 1.0, torch.float32).to(torch.bfloat16)
    options = dataclasses.replace(NVFP4_OPTIONS, rows=(32, 64, 2), rows_narrow=(16, 32, 1), two_d=(16, 32, 1),
                                  columns=(1, 64, 2))
    compare_nvfp4(nvfp4.quantize_rows(x, write_codes=True, options=options), quantize_rows_ref(x), False, "rows, other launch")
    compare_nvfp4(nvfp4.quantize_rows(x, two_d=True, write_codes=True, options=options),
                  quantize_rows_ref(x, two_d=True), False, "2D, other launch")
    compare_nvfp4(nvfp4.quantize_columns(x, rht=True, write_codes=True, options=options),
                  quantize_columns_ref(x, rht=True), True, "columns RHT, other launch")


def check_nvfp4_amax_passes() -> None:
    """The amax pass gives the reference's outputs (tensor_amax_ref, and through the quantize call),
    also with many programs, each several steps, and a ragged tail; a NaN gives a NaN decode scale.
    The RHT amax pass gives rht_global_scales_ref."""
    for chunk, max_programs in [((64, 2, 4), 3), ((4096, 4, 8), 4096)]:
        options = dataclasses.replace(NVFP4_OPTIONS, amax_chunk=chunk, amax_max_programs=max_programs)
        for rows, cols in [(64, 256), (37, 48)]:
            x = oracle.fresh_input(rows, cols, 1.0, torch.float32).to(torch.bfloat16)
            what = f"amax {chunk} {rows}x{cols}"
            compare_nvfp4(nvfp4.quantize_rows(x, write_codes=True, options=options), quantize_rows_ref(x), False, what)
            same_bits(nvfp4_amax.tensor_amax(x, options=options), nvfp4_amax.tensor_amax_ref(x), what)
            x[rows // 2, cols - 1] = math.nan
            same_bits(nvfp4_amax.tensor_amax(x, options=options), nvfp4_amax.tensor_amax_ref(x), f"{what} NaN")
            assert nvfp4.quantize_rows(x, options=options).decode_scale.isnan().all(), what
    for dtype in (torch.bfloat16, torch.float32):
        x = oracle.fresh_input(64, 96, 5.0, torch.float32).to(dtype)
        same_bits(nvfp4_amax.rht_global_scales(x)[:2], nvfp4_amax.rht_global_scales_ref(x), f"RHT global scales {dtype}")


def check_shared_scales_of_both_orientations() -> None:
    """One read for both orientations (nvfp4_amax.rows_and_rht_columns_scales): element 2 is max |x|
    (what tensor_amax gives), elements 0-1 are rht_global_scales(x); the rows call given that amax and
    the RHT columns call given those scales equal the reference bit for bit (RNE) and draw the same
    stochastic roundings as without them; a NaN reaches both decode scales. Launches where each
    persistent program takes several steps and the last tiles are partial, too."""
    for config, (rows, cols), dtype in [((4, 64, 4), (64, 160), torch.bfloat16), ((1, 16, 1), (96, 48), torch.float32),
                                        ((2, 32, 2), (80, 608), torch.bfloat16)]:
        options = dataclasses.replace(NVFP4_OPTIONS, rht_plain_amax=config, rht_plain_amax_fp32=config)
        x = oracle.fresh_input(rows, cols, 7.0, torch.float32).to(dtype)
        what = f"shared scales {config} {rows}x{cols} {dtype}"
        scales = nvfp4_amax.rows_and_rht_columns_scales(x, options=options)
        assert scales.shape == (4,) and scales.dtype == torch.float32, what
        same_bits(scales[2:3], x.float().abs().amax().reshape(1), f"{what} plain amax")
        separate = nvfp4_amax.rht_global_scales(x)
        same_bits(scales[[0, 1, 3]], separate[[0, 1, 3]], f"{what} RHT scales and amax")
        compare_nvfp4(nvfp4.quantize_rows(x, write_codes=True, amax=scales[2:]), quantize_rows_ref(x), False,
                      f"{what} rows")
        compare_nvfp4(nvfp4.quantize_columns(x, rht=True, write_codes=True, global_scales=scales),
                      quantize_columns_ref(x, rht=True), True, f"{what} columns RHT")
        for given, alone in [(nvfp4.quantize_rows(x, stochastic=True, seed=5, amax=scales[2:]),
                              nvfp4.quantize_rows(x, stochastic=True, seed=5)),
                             (nvfp4.quantize_columns(x, rht=True, stochastic=True, seed=5, global_scales=scales),
                              nvfp4.quantize_columns(x, rht=True, stochastic=True, seed=5))]:
            same_bits(given.values, alone.values, f"{what} SR values")
            same_bits(given.decode_scale, alone.decode_scale, f"{what} SR decode scale")
        x[rows - 1, 0] = math.nan
        scales = nvfp4_amax.rows_and_rht_columns_scales(x, options=options)
        assert scales[2].isinf(), what
        assert nvfp4.quantize_rows(x, amax=scales[2:]).decode_scale.isnan().all(), what
        assert nvfp4.quantize_columns(x, rht=True, global_scales=scales).decode_scale.isnan().all(), what


def check_tensor_parallel_shards_quantize_as_the_whole() -> None:
    """A tensor-parallel shard through the kernels with the group's amax (nvfp4.group_scales: the shard's own
    amax pass, its RHT amax for Wgrad's columns, made the group's by a reduction, here the max over the two
    shards' amaxes as the all-reduce takes it) quantizes to its slice of the whole tensor's values and decode
    scale, bit for bit, in every orientation a sharded operand takes and in every NVFP4 variant; a NaN in
    one shard makes both shards' decode scales NaN."""
    from models.quant.gemm_spec import OperandSpec

    # (tile, rht, transpose, the dim of x that is split): W / dY rows split by rows or by the reduction, W's
    # 16x16 tiles and their transpose, X^T / dY^T along tokens with the RHT, split along the features.
    cases = [((1, 16), False, False, 0), ((1, 16), False, False, 1), ((16, 16), False, False, 0),
             ((16, 16), False, False, 1), ((16, 16), False, True, 1), ((1, 16), True, True, 1)]
    for (tile, rht_on, transpose, dim), (fmt, four_over_six) in itertools.product(
            cases, [("nvfp4", None), ("nvfp4", "mse"), ("nvfp4_ue5m3", None)]):
        spec = OperandSpec(fmt, tile, rht=rht_on, four_over_six=four_over_six)
        what = f"tp shard {spec.describe()} transpose={transpose} split dim {dim}"
        x = oracle.fresh_input(64, 96, 5.0, torch.float32).to(torch.bfloat16)
        quantize = dict(spec=spec, transpose=transpose, seed=None, generator=None, out_dtype=torch.float32, name="X")
        whole, whole_decode = nvfp4.quantize_operand(x, scales=None, **quantize)
        shards = x.split(x.shape[dim] // 2, dim=dim)
        local = []
        for shard in shards:  # each shard's own amax, as the kernels take it
            nvfp4.group_scales(shard.contiguous(), spec, transpose, lambda amax: local.append(amax.clone()) or amax)
        group = torch.maximum(*local)
        transformed = (rht(x.t()) if rht_on else x).float()  # the RHT in x's dtype, as the kernels round it
        same_bits(group, transformed.abs().amax().reshape(1), f"{what}: the group's amax")
        offset = 0
        for shard, shard_amax in zip(shards, local):
            scales = nvfp4.group_scales(shard.contiguous(), spec, transpose, lambda amax: group)
            # the same in two steps, as linear.phase_amaxes takes them: the local amax, the scales from the group's
            same_bits(nvfp4.local_amax(shard.contiguous(), spec, transpose), shard_amax, f"{what}: local amax")
            defined = [0, 1, 3] if transpose and tile == (1, 16) else slice(None)  # [S_enc, S_dec, unset, amax]
            same_bits(nvfp4.scales_from_amax(group, spec, transpose)[defined], scales[defined],
                      f"{what}: scales from the amax")
            values, decode = nvfp4.quantize_operand(shard.contiguous(), scales=scales, **quantize)
            # the operand is x (or x^T): a split of x along dim is a split of the operand along dim (1 - dim)
            along = dim if not transpose else 1 - dim
            same_bits(values, whole.narrow(along, offset, values.shape[along]), f"{what}: values")
            same_bits(decode, whole_decode, f"{what}: decode scale")
            offset += values.shape[along]
        assert offset == whole.shape[along], what
        x.narrow(dim, 0, 1)[0, 0] = math.nan  # a NaN in the first shard only
        shards = x.split(x.shape[dim] // 2, dim=dim)
        local = []
        for shard in shards:
            nvfp4.group_scales(shard.contiguous(), spec, transpose, lambda amax: local.append(amax.clone()) or amax)
        group = torch.maximum(*local)
        assert group.isinf().all(), what
        scales = nvfp4.group_scales(shards[1].contiguous(), spec, transpose, lambda amax: group)
        assert nvfp4.quantize_operand(shards[1].contiguous(), scales=scales, **quantize)[1].isnan().all(), what
    columns = OperandSpec("nvfp4", (1, 16))  # columns without the RHT: the torch reference takes them
    assert nvfp4.group_scales(x, columns, True, lambda amax: amax) is None
    assert nvfp4.local_amax(x, columns, True) is None and nvfp4.scales_from_amax(x.new_ones(1), columns, True) is None


def check_nvfp4_ties() -> None:
    ties = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
    block0 = [3.0] + [t / 2 for t in ties] + [-t / 2 for t in ties] + [0.0]
    rows = [block0, [17 / 64] * 16, [19 / 64] * 16, [1.5 * 2.0**-15] * 16, [7.0] + [0.0] * 15]
    x = torch.tensor(rows).reshape(1, 80).repeat(16, 1)
    compare_nvfp4(nvfp4.quantize_rows(x, write_codes=True), quantize(x, "nvfp4"), False, "ties rows")
    compare_nvfp4(nvfp4.quantize_columns(x.t().contiguous(), write_codes=True), quantize(x, "nvfp4"), True,
                  "ties columns")


if kernels.has_triton():
    from models.quant.kernels.fp4_common import round_e2m1
    from models.quant.kernels.triton_common import tl, triton

    @triton.jit
    def _round_e2m1_probe(scaled_ptr, uniform_ptr, values_ptr, codes_ptr, n, STOCHASTIC: tl.constexpr,
                          BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        scaled = tl.load(scaled_ptr + offsets, mask=mask, other=0.0)
        uniform = tl.load(uniform_ptr + offsets, mask=mask, other=0.0)
        value, code = round_e2m1(scaled, uniform, STOCHASTIC)
        tl.store(values_ptr + offsets, value, mask=mask)
        tl.store(codes_ptr + offsets, code, mask=mask)


def check_e2m1_rounding_of_every_kind_of_value() -> None:
    """The kernels' element rounding (by the value's bits) against the reference's codes
    (formats.elements.round_e2m1, a comparison ladder in torch) on every multiple of 2^-12 in [0, 8], the
    ties, random fp32, subnormals, +-0, +-Inf and NaN, both signs; stochastic rounding with given
    uniforms, including the 8-bit midpoints (b + 1/2) / 256 the kernels draw."""
    from models.quant.formats.elements import round_e2m1 as reference_codes

    generator = torch.Generator().manual_seed(0)
    magnitudes = torch.cat([
        torch.arange(0, 8 * 4096 + 1, dtype=torch.float32) / 4096,
        torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 1e-40, 2.0**-126, 3e38, math.inf]),
        torch.rand(20000, generator=generator) * 7,
        torch.rand(2000, generator=generator) * 2.0**-20,
    ])
    scaled = torch.cat([magnitudes, -magnitudes, torch.tensor([math.nan, -math.nan])])
    uniform_draws = torch.rand(scaled.numel(), generator=generator)
    midpoints = (torch.randint(0, 256, (scaled.numel(),), generator=generator).float() + 0.5) / 256
    grid = torch.tensor(E2M1_GRID)
    for stochastic, uniform in [(False, uniform_draws), (True, uniform_draws), (True, midpoints)]:
        values = torch.empty_like(scaled)
        codes = torch.empty(scaled.shape, dtype=torch.uint8)
        block = 1024
        _round_e2m1_probe[(triton.cdiv(scaled.numel(), block),)](
            scaled, uniform, values, codes, scaled.numel(), STOCHASTIC=stochastic, BLOCK=block)
        expected = reference_codes(scaled, "stochastic" if stochastic else "nearest", uniform)
        what = f"E2M1 rounding stochastic={stochastic}"
        assert torch.equal(codes, expected), f"{what}: {int((codes != expected).sum())} codes differ"
        decoded = torch.where((expected & 8) != 0, -grid[(expected & 7).long()], grid[(expected & 7).long()])
        same_bits(values, decoded, what)


def check_nvfp4_non_finite() -> None:
    for bad in (math.nan, math.inf):
        x = torch.randn(32, 64, dtype=torch.bfloat16)
        x[7, 9] = bad
        for out in (nvfp4.quantize_rows(x), nvfp4.quantize_rows(x, two_d=True),
                    nvfp4.quantize_columns(x, rht=True)):
            assert out.decode_scale.isnan().all(), bad
            assert (out.values.float() * out.decode_scale).isnan().all(), bad


def check_nvfp4_stochastic_rounding() -> None:
    """Same seed, same draws; another seed, other draws; every value one of its two grid neighbours;
    in rows, columns and columns with RHT."""
    grid = torch.tensor(E2M1_GRID)
    x = oracle.fresh_input(32, 64, 1.0, torch.float32).to(torch.bfloat16)
    for name, run, target in [
        ("rows", lambda seed: nvfp4.quantize_rows(x, stochastic=True, seed=seed, write_codes=True), x),
        ("columns", lambda seed: nvfp4.quantize_columns(x, stochastic=True, seed=seed, write_codes=True), x),
        ("columns RHT", lambda seed: nvfp4.quantize_columns(x, rht=True, stochastic=True, seed=seed,
                                                            write_codes=True), rht(x.t()).t()),
    ]:
        first, again, other = run(1), run(1), run(2)
        assert torch.equal(first.codes, again.codes), f"{name}: not deterministic"
        assert not torch.equal(first.codes, other.codes), f"{name}: the seed is ignored"
        scales = first.block_scales.float()
        block_scale = (scales.repeat_interleave(16, dim=1) if name.startswith("rows")
                       else scales.repeat_interleave(16, dim=0))
        # Blocks whose E4M3 scale underflowed to 0 dequantize to 0 whatever their codes (the
        # reciprocal saturates at FLT_MAX, as in TE); the neighbour check is for the others.
        scaled_blocks = block_scale > 0
        magnitude = torch.where(scaled_blocks, target.float().abs() / (block_scale * first.decode_scale),
                                torch.zeros(())).clamp(max=6.0)
        index = torch.searchsorted(grid, magnitude, right=True)
        lower, upper = grid[index - 1], grid[index.clamp(max=7)]
        value = grid[(first.codes & 7).long()]
        tolerance = 1e-6 * (1 + magnitude)  # the reciprocal's rounding at a grid point
        neighbour = (value >= lower - tolerance) & (value <= upper + tolerance)
        assert (neighbour | ~scaled_blocks).all(), f"{name}: not a neighbour"
        assert scaled_blocks.float().mean() > 0.5, f"{name}: too few scaled blocks to check"


def check_fp8_blockwise() -> None:
    x = oracle.fresh_input(256, 256, 1.0, torch.float32).to(torch.bfloat16)
    # A rows-only and a columns-only pass of several tile shapes (Fp8Options); 128x128 tiles read once.
    two_passes = ((32, 32), (64, 16), (64, 64), (128, 128))
    for (tile_2d, kind), two_pass in itertools.product(((False, "1x128"), (True, "128x128")), two_passes):
        options = Fp8Options(rows_pass_tile_rows=two_pass[0], columns_pass_tile_cols=two_pass[1])
        row_codes, row_scales, col_codes, col_scales = fp8_kernels.fp8_block_quantize(
            x, tile_2d=tile_2d, rows=True, columns=True, options=options)
        for actual, expected, what in (
            (Fp8Operand(row_codes, row_scales, kind), fp8_quantize_ref(x, kind), f"{kind} rows"),
            (Fp8Operand(col_codes, col_scales, kind), fp8_quantize_ref(x, kind, transpose=True), f"{kind} columns"),
        ):
            assert torch.equal(actual.data.view(torch.uint8), expected.data.view(torch.uint8)), f"{what} codes"
            same_bits(actual.natural_scales(), expected.natural_scales(), f"{what} scales")
    for bad in (48, 256, 8):  # a pass tile that does not divide 128 would skip part of the tensor
        try:
            Fp8Options(columns_pass_tile_cols=bad)
        except ValueError as error:
            assert "columns_pass_tile_cols" in str(error), error
        else:
            raise AssertionError(f"columns_pass_tile_cols={bad} was accepted")


def check_fp8_per_tensor() -> None:
    """kernels.fp8.fp8_tensor_quantize against its quantize_ref(x, "tensor"): codes and decode scale."""
    x = oracle.fresh_input(256, 384, 1.0, torch.float32).to(torch.bfloat16)
    zeros = torch.zeros(128, 128)
    overflow = torch.full((128, 256), 3e38)  # finite; 448 / amax is the smallest normal region
    # 448 / 1e-37 overflows fp32: the scale is FLT_MAX, not the bf16 maximum (normal, so the interpreter,
    # which flushes bf16 subnormals on load, computes it as the GPU does).
    tiny = torch.full((128, 128), 1e-37, dtype=torch.bfloat16)
    with_nan = x[:128, :256].float().clone()
    with_nan[3, 5] = math.nan
    cases = [(x, True, True), (x.float().t(), True, True), (zeros, True, True), (overflow, True, True),
             (tiny, True, True), (with_nan, True, True), (x[:200], True, False)]  # the last: ragged rows only
    for (tensor, rows, columns), two_pass in itertools.product(cases, ((32, 32), (64, 64), (128, 128))):
        options = Fp8Options(rows_pass_tile_rows=two_pass[0], columns_pass_tile_cols=two_pass[1])
        row_codes, col_codes, decode = fp8_kernels.fp8_tensor_quantize(tensor, rows=rows, columns=columns,
                                                                        options=options)
        expected = fp8_quantize_ref(tensor, "tensor")
        same_bits(decode, expected.scale, f"decode scale of {list(tensor.shape)}")
        assert torch.equal(row_codes.view(torch.uint8), expected.data.view(torch.uint8)), list(tensor.shape)
        if columns:
            expected_t = fp8_quantize_ref(tensor, "tensor", transpose=True)
            assert torch.equal(col_codes.view(torch.uint8), expected_t.data.view(torch.uint8)), list(tensor.shape)
        else:
            assert col_codes is None


def check_gemm_output_epilogue() -> None:
    """kernels.epilogue.scale_gemm_output against torch's mul-then-cast (and Wgrad's -then-widen, in place)."""
    out = torch.randn(33, 2064) * 37.0
    out.view(-1)[::97] = 0.0
    out.view(-1)[1::101] = -0.0
    out.view(-1)[5], out.view(-1)[7] = math.nan, math.inf
    decode = torch.rand(()) * torch.rand(())
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        expected = torch.mul(out, decode, out=torch.empty(out.shape, dtype=dtype))
        got = epilogue.scale_gemm_output(out.clone(), decode, dtype)
        assert got.dtype == dtype
        same_bits(got, expected, f"epilogue to {dtype}")
        zeros = expected.float() == 0
        assert torch.equal(torch.signbit(got.float()[zeros]), torch.signbit(expected.float()[zeros])), dtype
    # The two operands' decode scales multiplied inside the kernel: (out * (a * b)), not (out * a) * b.
    decode_a, decode_b = torch.rand(()) * 3.0, torch.rand(()) / 7.0
    for dtype in (torch.bfloat16, torch.float32):
        expected = torch.mul(out, decode_a * decode_b, out=torch.empty(out.shape, dtype=dtype))
        same_bits(epilogue.scale_gemm_output(out.clone(), decode_a, dtype, decode_b=decode_b), expected,
                  f"epilogue with two decode scales to {dtype}")
    buffer = out.clone()
    widened = epilogue.scale_gemm_output(buffer, decode, torch.bfloat16, widen_to=torch.float32)
    assert widened.dtype == torch.float32 and widened.data_ptr() == buffer.data_ptr()
    same_bits(widened, torch.mul(out, decode, out=torch.empty(out.shape, dtype=torch.bfloat16)).float(), "widened")
    # No decode scale (MX formats): the rounding alone, as the cast; widened in place too.
    for dtype in (torch.bfloat16, torch.float16):
        same_bits(epilogue.scale_gemm_output(out.clone(), None, dtype), out.to(dtype), f"epilogue, no scale, to {dtype}")
    buffer = out.clone()
    widened = epilogue.scale_gemm_output(buffer, None, torch.bfloat16, widen_to=torch.float32)
    assert widened.data_ptr() == buffer.data_ptr()
    same_bits(widened, out.to(torch.bfloat16).float(), "widened, no scale")
    same_bits(epilogue.scale_gemm_output_ref(out, None, torch.bfloat16, widen_to=torch.float32), widened, "reference")


def check_fp8_quantize_ops() -> None:
    """The opaque ops compiled code calls (kernels.fp8.block_quantize_op / tensor_quantize_op): in a
    compiled graph (Dynamo + AOTAutograd, fullgraph) their outputs equal the kernels' bit for bit,
    and their fakes give the real outputs' shapes, strides and dtypes (what the graph plans)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    x = oracle.fresh_input(256, 384, 1.0, torch.float32).to(torch.bfloat16)
    cases = [("1x128", True, True, x), ("1x128", True, False, x[:200]), ("1x128", False, True, x),
             ("128x128", True, True, x), ("128x128", False, True, x), ("tensor", True, True, x),
             ("tensor", True, False, x[:200])]
    for kind, rows, columns, tensor in cases:
        if kind == "tensor":
            def op(t):
                return fp8_kernels.tensor_quantize_op(t, rows=rows, columns=columns)
            direct = fp8_kernels.fp8_tensor_quantize(tensor, rows=rows, columns=columns)
        else:
            def op(t):
                return fp8_kernels.block_quantize_op(t, tile_2d=kind == "128x128", rows=rows, columns=columns)
            direct = fp8_kernels.fp8_block_quantize(tensor, tile_2d=kind == "128x128", rows=rows, columns=columns)
        torch._dynamo.reset()
        compiled = torch.compile(op, backend="aot_eager", fullgraph=True)(tensor)
        with FakeTensorMode() as fake_mode:
            planned = op(fake_mode.from_tensor(tensor))
        what = f"{kind} rows={rows} columns={columns} {list(tensor.shape)}"
        for got, want, fake in zip(compiled, direct, planned):
            assert (got is None) == (want is None) == (fake is None), what
            if got is None:
                continue
            layout = (got.shape, got.stride(), got.dtype)
            assert layout == (want.shape, want.stride(), want.dtype) == (fake.shape, fake.stride(), fake.dtype), what
            if got.dtype == torch.float8_e4m3fn:
                assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), what
            else:
                same_bits(got, want, what)


# ------------------------------------------------------------------------------------------------
# MXFP4 (kernels.mx): bit for bit against quantize(..., "mxfp4"), stochastic rounding included,
# given the uniforms of the kernels' Philox draw re-implemented in numpy (quant_oracles).


def compare_mx(out, reference, transposed: bool, what: str) -> None:
    view = (lambda t: t.t()) if transposed else (lambda t: t)
    same_bits(view(out.values), reference.scaled_values(out.values.dtype), f"{what} values")
    assert torch.equal(view(out.block_scales.view(torch.uint8)), reference.block_scales.view(torch.uint8)), \
        f"{what} E8M0 scales"
    assert torch.equal(view(out.codes), reference.codes), f"{what} codes"


def _mx_input(rows: int, cols: int, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """fresh_input in 32-element blocks, plus a block of the smallest scale, 2^-127 (amax in
    [2^-126, 2^-124): subnormal scaled values q * X), and for fp32 a block of subnormal inputs (the
    interpreter mis-loads bf16 subnormals: those are the GPU tests' to check)."""
    x = oracle.fresh_input(rows, cols, scale, torch.float32, block=32)
    x[rows // 3, 64:96] = torch.randn(32).sign() * (1 + 3 * torch.rand(32)) * 2.0**-126
    if dtype == torch.float32:
        x[rows // 2, 32:64] *= 2.0**-140 / scale
    return x.to(dtype)


def check_mx_round_to_nearest() -> None:
    # 32 x 608: the narrow launch (608 is not a multiple of 256), partial 128-wide tiles.
    for rows, cols, scale, dtype, out_dtypes in [(64, 96, 1.0, torch.bfloat16, (torch.bfloat16, torch.float32)),
                                                 (64, 96, 1.0, torch.float32, (torch.bfloat16, torch.float32)),
                                                 (32, 608, 2.0**-100, torch.float32, (torch.float32,)),
                                                 (64, 160, 2.0**100, torch.bfloat16, (torch.bfloat16,))]:
        x = _mx_input(rows, cols, scale, dtype)
        what = f"mx {rows}x{cols} {dtype} scale {scale}"
        for out_dtype in out_dtypes:
            compare_mx(mx.quantize_rows(x, write_codes=True, out_dtype=out_dtype), mx.quantize_rows_ref(x), False,
                       f"rows {what} -> {out_dtype}")
            for use_rht in (False, True):
                compare_mx(mx.quantize_columns(x, rht=use_rht, write_codes=True, out_dtype=out_dtype),
                           mx.quantize_columns_ref(x, rht=use_rht), True, f"columns rht={use_rht} {what} -> {out_dtype}")
    x = _mx_input(64, 160, 1.0, torch.bfloat16)
    options = dataclasses.replace(MX_OPTIONS, rows=(32, 64, 2), rows_narrow=(16, 32, 1), columns=(2, 32, 1))
    compare_mx(mx.quantize_rows(x, write_codes=True, options=options), mx.quantize_rows_ref(x), False, "rows, other launch")
    compare_mx(mx.quantize_columns(x, rht=True, write_codes=True, options=options), mx.quantize_columns_ref(x, rht=True),
               True, "columns RHT, other launch")
    integer = dataclasses.replace(MX_OPTIONS, bf16_rounding="integer")
    compare_mx(mx.quantize_columns(x, rht=True, write_codes=True, options=integer), mx.quantize_columns_ref(x, rht=True),
               True, "columns RHT, integer bf16 rounding")


def check_mx_ties_and_non_finite() -> None:
    ties = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
    block0 = [3.0] + [t / 2 for t in ties] + [-t / 2 for t in ties] + [0.0] + [-0.0] * 16
    rows = [block0, [17 / 64] * 32, [6.5] + [1.0] * 31, [2.0**-130] * 32, [7.0] + [0.0] * 31]
    x = torch.tensor(rows).reshape(1, 160).repeat(32, 1)
    compare_mx(mx.quantize_rows(x, write_codes=True), mx.quantize_rows_ref(x), False, "mx ties rows")
    compare_mx(mx.quantize_columns(x.t().contiguous(), write_codes=True), mx.quantize_rows_ref(x), True,
               "mx ties columns")
    for bad in (math.nan, math.inf, -math.inf):
        x = _mx_input(64, 96, 1.0, torch.bfloat16)
        x[7, 9] = bad
        x[40, 70] = bad
        compare_mx(mx.quantize_rows(x, write_codes=True), mx.quantize_rows_ref(x), False, f"mx rows with {bad}")
        compare_mx(mx.quantize_columns(x, rht=True, write_codes=True), mx.quantize_columns_ref(x, rht=True), True,
                   f"mx columns RHT with {bad}")
        values = mx.quantize_rows(x).values.float()
        assert values[7, :32].isnan().all() and not values[7, 32:].isnan().any(), bad  # that block only


def check_mx_stochastic_rounding() -> None:
    """The kernels' stochastic rounding equals the reference's given the uniforms of the documented
    Philox draw (re-implemented in numpy); the seed's high 32 bits count; another seed, other draws."""
    for rows, cols, dtype, seed in [(64, 96, torch.bfloat16, 7), (32, 608, torch.float32, 2**40 + 12345)]:
        x = _mx_input(rows, cols, 3.0, dtype)
        what = f"mx SR {rows}x{cols} {dtype} seed {seed}"
        compare_mx(mx.quantize_rows(x, stochastic=True, seed=seed, write_codes=True),
                   mx.quantize_rows_ref(x, uniform=oracle.mx_rows_uniforms(seed, rows, cols)), False, f"rows {what}")
        for use_rht in (False, True):
            compare_mx(mx.quantize_columns(x, rht=use_rht, stochastic=True, seed=seed, write_codes=True),
                       mx.quantize_columns_ref(x, rht=use_rht, uniform=oracle.mx_columns_uniforms(seed, rows, cols)),
                       True, f"columns rht={use_rht} {what}")
    x = _mx_input(32, 96, 3.0, torch.bfloat16)
    low, high = (mx.quantize_rows(x, stochastic=True, seed=seed, write_codes=True).codes for seed in (5, 5 + 2**32))
    assert not torch.equal(low, high), "the seed's high 32 bits are ignored"


def check_mx_operand_interface() -> None:
    """kernels.mx.quantize_operand, as QuantLinear calls it, against formats.quantize_scaled_values of
    the operand: Fprop X and W (rows), Dgrad W^T (columns), Wgrad X^T (columns with the RHT)."""
    from models.quant.formats import quantize_scaled_values
    from models.quant.gemm_spec import OperandSpec

    x = _mx_input(64, 96, 1.0, torch.bfloat16)
    for spec, transpose in [(OperandSpec("mxfp4"), False), (OperandSpec("mxfp4"), True),
                            (OperandSpec("mxfp4", rht=True), True)]:
        values, decode = mx.quantize_operand(x, spec, transpose=transpose, seed=None, generator=None,
                                             out_dtype=torch.bfloat16, scales=mx.shared_scales(x, spec, spec), name="op")
        operand = x.t() if transpose else x
        expected, expected_decode = quantize_scaled_values(rht(operand) if spec.rht else operand, "mxfp4")
        assert decode is None and expected_decode is None
        same_bits(values, expected, f"operand {spec.describe()} transpose={transpose}")


CHECKS = [check_nvfp4_round_to_nearest, check_nvfp4_amax_passes, check_shared_scales_of_both_orientations,
          check_tensor_parallel_shards_quantize_as_the_whole,
          check_nvfp4_ties, check_e2m1_rounding_of_every_kind_of_value,
          check_nvfp4_non_finite, check_nvfp4_stochastic_rounding, check_fp8_blockwise,
          check_fp8_per_tensor, check_fp8_quantize_ops, check_gemm_output_epilogue, check_mx_round_to_nearest,
          check_mx_ties_and_non_finite, check_mx_stochastic_rounding, check_mx_operand_interface]

def run_checks(checks) -> None:
    """Run each check, printing "ok <name>" per check and "all N checks passed" at the end (what
    test_kernels_interpreted.py reads)."""
    for check in checks:
        check()
        print(f"ok {check.__name__}", flush=True)
    print(f"all {len(checks)} checks passed")


if __name__ == "__main__":
    run_checks(CHECKS)
