"""The NVFP4 kernels with UE5M3 block scales (``fmt="nvfp4_ue5m3"``) against the torch reference, under
Triton's interpreter, on the CPU.

Run by test_kernels_interpreted.py in a subprocess with TRITON_INTERPRET=1, as kernels_interpreted.py is;
test_quant_kernels_gpu.py checks the compiled kernels. Every check is bit for bit: values q * s_b, UE5M3
block scale codes, E2M1 codes and the decode scale.

    TRITON_INTERPRET=1 PYTHONPATH=.:tests/models/quant python tests/models/quant/kernels_interpreted_ue5m3.py
"""

from __future__ import annotations

import math
import os

import numpy as np
import torch

import quant_oracles as oracle
from kernels_interpreted import compare_nvfp4, run_checks, same_bits
from models.quant import kernels
from models.quant.formats import elements, quantize_scaled_values
from models.quant.gemm_spec import OperandSpec
from models.quant.kernels import nvfp4, nvfp4_amax
from models.quant.kernels.nvfp4 import quantize_columns_ref, quantize_rows_ref
from models.quant.rht import rht

assert os.environ.get("TRITON_INTERPRET") == "1", "run under TRITON_INTERPRET=1"
kernels.use_triton(True)
FMT = "nvfp4_ue5m3"


def _input(rows: int, cols: int, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """fresh_input with rows spread over 2^-36 .. 1 of each other, so that block scales fall below E4M3's
    range (where UE5M3 differs from it) and into UE5M3's subnormals (below 2^-31 of the tensor's amax)."""
    x = oracle.fresh_input(rows, cols, scale, torch.float32)
    x *= torch.logspace(-36, 0, rows, base=2.0)[torch.randperm(rows)][:, None]
    return x.to(dtype)


if kernels.has_triton():
    from models.quant.kernels.triton_common import tl, triton, ue5m3_round

    @triton.jit
    def _ue5m3_round_probe(value_ptr, rounded_ptr, code_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        rounded, code = ue5m3_round(tl.load(value_ptr + offsets, mask=mask, other=0.0))
        tl.store(rounded_ptr + offsets, rounded, mask=mask)
        tl.store(code_ptr + offsets, code.to(tl.uint8), mask=mask)


def check_ue5m3_rounding_of_every_kind_of_value() -> None:
    """``ue5m3_round`` against ``elements.round_ue5m3`` / ``ue5m3_codes`` on every UE5M3 value, every midpoint
    (the ties) and its fp32 neighbours, random values over the whole range, values past the largest, fp32
    subnormals, zero, Inf and NaN."""
    grid = oracle.ue5m3_values().astype(np.float32)
    midpoints = ((grid[:-1].astype(np.float64) + grid[1:]) / 2).astype(np.float32)
    rng = np.random.default_rng(0)
    values = np.concatenate([
        grid, midpoints, np.nextafter(midpoints, np.float32(0)), np.nextafter(midpoints, np.float32(np.inf)),
        np.exp2(rng.uniform(-20, 17.5, 20000)), [114688.0, 120000.0, 2e5, 3e38, 0.0, 1e-40, 2.0**-126, math.inf],
    ]).astype(np.float32)
    value = torch.cat([torch.from_numpy(values), torch.tensor([math.nan])])
    rounded = torch.empty_like(value)
    codes = torch.empty(value.shape, dtype=torch.uint8)
    _ue5m3_round_probe[(triton.cdiv(value.numel(), 1024),)](value, rounded, codes, value.numel(), BLOCK=1024)
    expected = elements.round_ue5m3(value)
    same_bits(rounded, expected, "UE5M3 rounding")
    assert torch.equal(codes, elements.ue5m3_codes(expected)), "UE5M3 codes"


def check_rows_2d_and_columns_round_to_nearest() -> None:
    for rows, cols, scale, dtype in [(32, 64, 1.0, torch.bfloat16), (32, 64, 1.0, torch.float32),
                                     (48, 608, 3e3, torch.bfloat16)]:
        x = _input(rows, cols, scale, dtype)
        what = f"UE5M3 {rows}x{cols} {dtype} scale {scale}"
        reference = quantize_rows_ref(x, fmt=FMT)
        subnormal = reference.block_scales < elements.UE5M3_MIN_NORMAL
        assert (subnormal & (reference.block_scales > 0)).any(), f"{what}: no subnormal UE5M3 block scale"
        compare_nvfp4(nvfp4.quantize_rows(x, write_codes=True, fmt=FMT), reference, False, f"rows {what}")
        compare_nvfp4(nvfp4.quantize_rows(x, two_d=True, write_codes=True, fmt=FMT),
                      quantize_rows_ref(x, two_d=True, fmt=FMT), False, f"2D {what}")
        for use_rht in (False, True):
            compare_nvfp4(nvfp4.quantize_columns(x, rht=use_rht, write_codes=True, fmt=FMT),
                          quantize_columns_ref(x, rht=use_rht, fmt=FMT), True, f"columns rht={use_rht} {what}")


def check_global_scales_and_shared_scales() -> None:
    """The RHT amax pass with UE5M3's bound (S_enc = 688128 / amax); one read for both orientations gives
    the outputs of the separate passes."""
    for dtype in (torch.bfloat16, torch.float32):
        x = _input(32, 64, 1.0, dtype)
        scales = nvfp4_amax.rht_global_scales(x, fmt=FMT)
        same_bits(scales[:2], nvfp4_amax.rht_global_scales_ref(x, fmt=FMT), f"UE5M3 RHT scales {dtype}")
        shared = nvfp4_amax.rows_and_rht_columns_scales(x, fmt=FMT)
        compare_nvfp4(nvfp4.quantize_rows(x, amax=shared[2:], write_codes=True, fmt=FMT),
                      quantize_rows_ref(x, fmt=FMT), False, f"rows from shared scales {dtype}")
        compare_nvfp4(nvfp4.quantize_columns(x, rht=True, global_scales=shared, write_codes=True, fmt=FMT),
                      quantize_columns_ref(x, rht=True, fmt=FMT), True, f"columns from shared scales {dtype}")


def check_stochastic_rounding() -> None:
    """With the uniforms of the kernels' Philox draws (re-implemented in numpy), stochastic rounding equals
    the reference's."""
    rows, cols, seed = 32, 64, 2**40 + 777
    x = _input(rows, cols, 1.0, torch.bfloat16)
    compare_nvfp4(nvfp4.quantize_rows(x, stochastic=True, seed=seed, write_codes=True, fmt=FMT),
                  quantize_rows_ref(x, fmt=FMT, rounding="stochastic", uniform=oracle.mx_rows_uniforms(seed, rows, cols)),
                  False, "UE5M3 SR rows")
    for use_rht in (False, True):
        compare_nvfp4(
            nvfp4.quantize_columns(x, rht=use_rht, stochastic=True, seed=seed, write_codes=True, fmt=FMT),
            quantize_columns_ref(x, rht=use_rht, fmt=FMT, rounding="stochastic",
                                 uniform=oracle.mx_columns_uniforms(seed, rows, cols).t()),
            True, f"UE5M3 SR columns rht={use_rht}")


def check_non_finite_and_bad_combinations() -> None:
    for bad in (math.nan, math.inf):
        x = torch.randn(32, 64, dtype=torch.bfloat16)
        x[7, 9] = bad
        for out in (nvfp4.quantize_rows(x, fmt=FMT), nvfp4.quantize_rows(x, two_d=True, fmt=FMT),
                    nvfp4.quantize_columns(x, rht=True, fmt=FMT)):
            assert out.decode_scale.isnan().all(), bad
            assert (out.values.float() * out.decode_scale).isnan().all(), bad
    x = torch.randn(32, 64)
    for call in (lambda: nvfp4.quantize_rows(x, fmt=FMT, four_over_six="mse"),
                 lambda: nvfp4.quantize_columns(x, fmt="mxfp4")):
        try:
            call()
        except ValueError as error:
            assert "nvfp4" in str(error), error
        else:
            raise AssertionError("a format the NVFP4 kernels do not quantize was accepted")


def check_operand_interface() -> None:
    """kernels.nvfp4.quantize_operand with UE5M3 specs, as QuantLinear calls it, against
    formats.quantize_scaled_values of the operand (a 16x16 W^T: W quantized, then transposed)."""
    x = _input(32, 64, 1.0, torch.bfloat16)
    for spec, transpose in [(OperandSpec(FMT), False), (OperandSpec(FMT, (16, 16)), False),
                            (OperandSpec(FMT, (16, 16)), True), (OperandSpec(FMT, rht=True), True)]:
        assert nvfp4.operand_supported(x, spec, transpose) or not x.is_cuda
        values, decode = nvfp4.quantize_operand(x, spec, transpose=transpose, seed=None, generator=None,
                                                out_dtype=torch.bfloat16, scales=None, name="op")
        if transpose and spec.tile == (16, 16):
            expected, expected_decode = quantize_scaled_values(x, FMT, tile=spec.tile)
            expected = expected.t()
        else:
            operand = x.t() if transpose else x
            expected, expected_decode = quantize_scaled_values(rht(operand) if spec.rht else operand, FMT,
                                                               tile=spec.tile)
        same_bits(values, expected, f"operand {spec.describe()} transpose={transpose}")
        same_bits(decode, expected_decode, f"decode {spec.describe()}")


CHECKS = [check_ue5m3_rounding_of_every_kind_of_value, check_rows_2d_and_columns_round_to_nearest,
          check_global_scales_and_shared_scales, check_stochastic_rounding, check_non_finite_and_bad_combinations,
          check_operand_interface]

if __name__ == "__main__":
    run_checks(CHECKS)
