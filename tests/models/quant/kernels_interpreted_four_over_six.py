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
from models.quant.kernels.options import NVFP4_OPTIONS
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
          check_global_scales_and_shared_scales, check_stochastic_rounding, check_non_finite,
          check_operand_interface]

if __name__ == "__main__":
    run_checks(CHECKS)
