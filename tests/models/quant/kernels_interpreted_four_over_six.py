"""The NVFP4 kernels with Four Over Six against the torch reference, under Triton's interpreter, on the CPU.

Run by test_kernels_interpreted.py in a subprocess with TRITON_INTERPRET=1, as kernels_interpreted.py is;
the GPU tests (test_quant_kernels_gpu.py) check the compiled kernels. Every check is bit for bit:
values q * s_b, E4M3 block scale codes, E2M1 codes and the decode scale.

    TRITON_INTERPRET=1 PYTHONPATH=.:tests/models/quant python tests/models/quant/kernels_interpreted_four_over_six.py
"""

from __future__ import annotations

import dataclasses
import math
import os

import torch

import quant_oracles as oracle
from kernels_interpreted import compare_nvfp4, run_checks, same_bits
from models.quant import kernels
from models.quant.formats import quantize, quantize_scaled_values
from models.quant.gemm_spec import OperandSpec
from models.quant.kernels import nvfp4, nvfp4_amax
from models.quant.kernels.nvfp4 import quantize_columns_ref, quantize_rows_ref
from models.quant.formats.elements import fp32, round_e4m3
from models.quant.formats.four_over_six import FOUR_OVER_SIX_BOUND, candidate_error
from models.quant.formats.nvfp4 import block_reciprocal, nvfp4_global_scales
from models.quant.kernels.fp4_common import load_16_rows
from models.quant.kernels.nvfp4_four_over_six import candidate_errors, divide_by_1536
from models.quant.kernels.options import NVFP4_OPTIONS
from models.quant.kernels.triton_common import tl, triton
from models.quant.rht import rht

assert os.environ.get("TRITON_INTERPRET") == "1", "run under TRITON_INTERPRET=1"
kernels.use_triton(True)
ERRORS = ("mse", "mae")


def _input(rows: int, cols: int, scale: float, dtype: torch.dtype) -> torch.Tensor:
    return oracle.fresh_input(rows, cols, scale, torch.float32).to(dtype)


def check_rows_and_2d_round_to_nearest() -> None:
    # Tiles of 4 blocks (64 columns) over 80 columns: the last tile of each row band is partial.
    options = dataclasses.replace(NVFP4_OPTIONS, rows_four_over_six=(8, 64, 4), two_d_four_over_six=(16, 64, 4))
    for rows, cols, scale, dtype, errors in [(32, 80, 1.0, torch.bfloat16, ERRORS),
                                             (16, 48, 3e3, torch.float32, ("mse",))]:
        x = _input(rows, cols, scale, dtype)
        for error in errors:
            what = f"4/6-{error} {rows}x{cols} {dtype} scale {scale}"
            reference = quantize_rows_ref(x, four_over_six=error)
            chosen = reference.block_scales.float() != quantize(x, "nvfp4").block_scales.float()
            assert chosen.any(), f"{what}: no block took map-to-4"
            compare_nvfp4(nvfp4.quantize_rows(x, write_codes=True, four_over_six=error, options=options), reference,
                          False, f"rows {what}")
            compare_nvfp4(nvfp4.quantize_rows(x, two_d=True, write_codes=True, four_over_six=error, options=options),
                          quantize_rows_ref(x, two_d=True, four_over_six=error), False, f"2D {what}")


def check_columns_with_and_without_rht() -> None:
    for rows, cols, dtype, cases in [(32, 64, torch.bfloat16, [(e, r) for e in ERRORS for r in (False, True)]),
                                     (32, 48, torch.float32, [("mse", True)])]:
        x = _input(rows, cols, 1.0, dtype)
        for error, use_rht in cases:
            what = f"columns 4/6-{error} rht={use_rht} {rows}x{cols} {dtype}"
            compare_nvfp4(nvfp4.quantize_columns(x, rht=use_rht, write_codes=True, four_over_six=error),
                          quantize_columns_ref(x, rht=use_rht, four_over_six=error), True, what)


def check_tensor_amax_near_the_range_ends() -> None:
    """Tensors whose amax sits near fp32's ends, where a block's dequantization units leave the normal
    range and the kernels divide per element (``nvfp4_four_over_six``): still the reference bit for bit.
    Each input's blocks span 2^-24 .. 1 of its amax, so tiles of one tensor fall on both sides."""
    options = dataclasses.replace(NVFP4_OPTIONS, rows_four_over_six=(8, 64, 4), two_d_four_over_six=(16, 64, 4))
    generator = torch.Generator().manual_seed(7)
    for amax_exponent in (-100, -112, -120, 112, 120, 126):
        x = torch.randn(32, 64, generator=generator, dtype=torch.float64)
        x = x * torch.exp2(-torch.randint(0, 25, (32, 4), generator=generator).double()).repeat_interleave(16, 1)
        x = (x / x.abs().max() * 2.0**amax_exponent).float()
        what = f"4/6 amax 2^{amax_exponent}"
        compare_nvfp4(nvfp4.quantize_rows(x, write_codes=True, four_over_six="mse", options=options),
                      quantize_rows_ref(x, four_over_six="mse"), False, f"rows {what}")
        compare_nvfp4(nvfp4.quantize_rows(x, two_d=True, write_codes=True, four_over_six="mae", options=options),
                      quantize_rows_ref(x, two_d=True, four_over_six="mae"), False, f"2D {what}")
        compare_nvfp4(nvfp4.quantize_columns(x, rht=True, write_codes=True, four_over_six="mse"),
                      quantize_columns_ref(x, rht=True, four_over_six="mse"), True, f"columns {what}")


if triton is not None:
    @triton.jit
    def _candidate_errors_kernel(x_ptr, scales_ptr, errors_ptr, amax_ptr, BLOCKS: tl.constexpr, ERROR: tl.constexpr):
        """x [BLOCKS, 16]; scales [4, BLOCKS]: s4, r4, s6, r6 -> errors [2, BLOCKS]: err4, err6."""
        block = tl.arange(0, BLOCKS)
        x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15 = load_16_rows(
            x_ptr + block * 16, 1, block < BLOCKS)
        error_4, error_6 = candidate_errors(
            x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15,
            tl.load(scales_ptr + block), tl.load(scales_ptr + BLOCKS + block),
            tl.load(scales_ptr + 2 * BLOCKS + block), tl.load(scales_ptr + 3 * BLOCKS + block),
            tl.load(amax_ptr), ERROR)
        tl.store(errors_ptr + block, error_4)
        tl.store(errors_ptr + BLOCKS + block, error_6)


    @triton.jit
    def _divide_by_1536_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out_ptr + offsets, divide_by_1536(tl.load(x_ptr + offsets, mask=offsets < n)), mask=offsets < n)


def check_division_by_1536() -> None:
    """divide_by_1536 against IEEE fp32 division on 2^20 random bit patterns (every exponent, subnormals,
    zeros, Inf, NaN) and every product q * s (E2M1 x E4M3) times powers of two down to the subnormals."""
    generator = torch.Generator().manual_seed(3)
    patterns = torch.randint(-2**31, 2**31, (2**20,), generator=generator, dtype=torch.int64).to(torch.int32)
    specials = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-45, -1e-45, 3.4028234663852886e38,
                             1536.0, 4608.0, 1.1754942e-38, 2**-126 * 1536], dtype=torch.float32)
    grid = torch.tensor([0.5, 1, 1.5, 2, 3, 4, 6], dtype=torch.float32)
    e4m3 = torch.arange(1, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    products = (grid[:, None] * e4m3[None, :]).reshape(-1)
    powers = torch.exp2(torch.arange(-150, 120, 7, dtype=torch.float32))
    for what, x in (("random bits", patterns.view(torch.float32)), ("specials", specials),
                    ("q * s * 2^k", (products[:, None] * powers[None, :]).reshape(-1))):
        out = torch.empty_like(x)
        _divide_by_1536_kernel[(triton.cdiv(x.numel(), 4096),)](x, out, x.numel(), BLOCK=4096)
        expected = (x.double() / 1536.0).float()  # one rounding of the fp64 quotient: IEEE fp32 division
        same = (out.view(torch.int32) == expected.view(torch.int32)) | (out.isnan() & expected.isnan())
        assert same.all(), f"divide_by_1536 on {what}: {int((~same).sum())} of {x.numel()} differ"


def check_candidate_errors_at_every_range() -> None:
    """The kernels' two candidate errors per block (by the dequantization units where every block allows,
    else a division per element) against the reference's fp32 sums, bit for bit, for tensor amaxes from
    2^-140 to 2^127: the units' range ends are crossed on both sides, and one block out of range sends
    its program to the division."""
    generator = torch.Generator().manual_seed(11)
    blocks = 64
    for amax_exponent in (-140, -130, -126, -122, -118, -100, 0, 100, 118, 122, 127):
        x = torch.randn(blocks, 16, generator=generator, dtype=torch.float64)
        x = x * torch.exp2(-torch.randint(0, 25, (blocks, 1), generator=generator).double())
        x = (x / x.abs().max() * 2.0**amax_exponent * 0.999).float()
        blocked = x.view(blocks, 1, 1, 16)
        block_amax = blocked.abs().amax(dim=(1, 3), keepdim=True)
        amax = block_amax.amax()
        encode, decode = nvfp4_global_scales(amax, FOUR_OVER_SIX_BOUND)
        base = (block_amax / fp32(6.0, x.device)) * encode
        scale_4 = round_e4m3(base * fp32(1.5, x.device)).float()
        scale_6 = round_e4m3(base).float()
        reciprocal_4, reciprocal_6 = block_reciprocal(scale_4, decode), block_reciprocal(scale_6, decode)
        scales = torch.stack([t.reshape(blocks) for t in (scale_4, reciprocal_4, scale_6, reciprocal_6)])
        for code, error in ((1, "mse"), (2, "mae")):
            errors = torch.empty(2, blocks)
            _candidate_errors_kernel[(1,)](x, scales, errors, amax.reshape(1), BLOCKS=blocks, ERROR=code)
            expected = torch.stack([candidate_error(blocked, scale, reciprocal, amax, error).reshape(blocks)
                                    for scale, reciprocal in ((scale_4, reciprocal_4), (scale_6, reciprocal_6))])
            same_bits(errors, expected, f"4/6 candidate errors ({error}), amax 2^{amax_exponent}")


def check_global_scales_and_shared_scales() -> None:
    """The RHT amax pass with Four Over Six's bound: [S_enc, S_dec] = 1536 / amax, 1 / S_enc, element 3 the
    amax; one read for both orientations gives the outputs of the separate passes."""
    for dtype in (torch.bfloat16,):
        x = _input(32, 64, 1.0, dtype)
        scales = nvfp4_amax.rht_global_scales(x, four_over_six=True)
        same_bits(scales[:2], nvfp4_amax.rht_global_scales_ref(x, four_over_six=True), f"4/6 RHT scales {dtype}")
        same_bits(scales[3], rht(x.t()).float().abs().amax(), f"RHT amax {dtype}")
        shared = nvfp4_amax.rows_and_rht_columns_scales(x, four_over_six=True)
        compare_nvfp4(nvfp4.quantize_rows(x, amax=shared[2:], write_codes=True, four_over_six="mse"),
                      quantize_rows_ref(x, four_over_six="mse"), False, f"rows from shared scales {dtype}")
        compare_nvfp4(nvfp4.quantize_columns(x, rht=True, global_scales=shared, write_codes=True, four_over_six="mse"),
                      quantize_columns_ref(x, rht=True, four_over_six="mse"), True, f"columns from shared scales {dtype}")


def check_stochastic_rounding() -> None:
    """With the uniforms of the kernels' Philox draws (re-implemented in numpy), stochastic rounding equals
    the reference's, whose choice of candidate is the round-to-nearest one."""
    for rows, cols, dtype, seed in [(32, 64, torch.bfloat16, 2**40 + 12345)]:
        x = _input(rows, cols, 1.0, dtype)
        what = f"4/6 SR {rows}x{cols} {dtype} seed {seed}"
        compare_nvfp4(nvfp4.quantize_rows(x, stochastic=True, seed=seed, write_codes=True, four_over_six="mse"),
                      quantize_rows_ref(x, four_over_six="mse", rounding="stochastic",
                                        uniform=oracle.mx_rows_uniforms(seed, rows, cols)), False, f"rows {what}")
        for use_rht in (False, True):
            compare_nvfp4(
                nvfp4.quantize_columns(x, rht=use_rht, stochastic=True, seed=seed, write_codes=True,
                                       four_over_six="mse"),
                quantize_columns_ref(x, rht=use_rht, four_over_six="mse", rounding="stochastic",
                                     uniform=oracle.mx_columns_uniforms(seed, rows, cols).t()),
                True, f"columns rht={use_rht} {what}")


def check_non_finite() -> None:
    for bad in (math.nan, math.inf):
        x = torch.randn(32, 64, dtype=torch.bfloat16)
        x[7, 9] = bad
        for out in (nvfp4.quantize_rows(x, four_over_six="mse"), nvfp4.quantize_rows(x, two_d=True, four_over_six="mae"),
                    nvfp4.quantize_columns(x, rht=True, four_over_six="mse")):
            assert out.decode_scale.isnan().all(), bad
            assert (out.values.float() * out.decode_scale).isnan().all(), bad


def check_operand_interface() -> None:
    """kernels.nvfp4.quantize_operand with a Four Over Six spec, as QuantLinear calls it, against
    formats.quantize_scaled_values of the operand (a 16x16 W^T: W quantized, then transposed)."""
    x = _input(32, 64, 1.0, torch.bfloat16)
    for spec, transpose in [(OperandSpec("nvfp4", four_over_six="mse"), False),
                            (OperandSpec("nvfp4", (16, 16), four_over_six="mae"), False),
                            (OperandSpec("nvfp4", (16, 16), four_over_six="mse"), True),
                            (OperandSpec("nvfp4", rht=True, four_over_six="mse"), True)]:
        values, decode = nvfp4.quantize_operand(x, spec, transpose=transpose, seed=None, generator=None,
                                                out_dtype=torch.bfloat16, scales=None, name="op")
        if transpose and spec.tile == (16, 16):
            expected, expected_decode = quantize_scaled_values(x, "nvfp4", tile=spec.tile, four_over_six=spec.four_over_six)
            expected = expected.t()
        else:
            operand = x.t() if transpose else x
            expected, expected_decode = quantize_scaled_values(rht(operand) if spec.rht else operand, "nvfp4",
                                                               tile=spec.tile, four_over_six=spec.four_over_six)
        same_bits(values, expected, f"operand {spec.describe()} transpose={transpose}")
        same_bits(decode, expected_decode, f"decode {spec.describe()}")


CHECKS = [check_rows_and_2d_round_to_nearest, check_columns_with_and_without_rht,
          check_tensor_amax_near_the_range_ends, check_division_by_1536, check_candidate_errors_at_every_range,
          check_global_scales_and_shared_scales, check_stochastic_rounding, check_non_finite,
          check_operand_interface]

if __name__ == "__main__":
    run_checks(CHECKS)
