"""The native NVFP4 layer's kernel path under Triton's interpreter, on the CPU (run by
test_kernels_interpreted.py with TRITON_INTERPRET=1).

The layer asks the NVFP4 kernels for their codes (``nvfp4_torch.kernel_codes``) where QuantLinear asks them
for the scaled values (``kernels.nvfp4.quantize_operand``). Checked here for every orientation the layer
uses: round to nearest gives the packed bytes, swizzled scales and decode scale of the torch reference
(``nvfp4_torch.reference_codes``), Four Over Six included; stochastic rounding with a seed gives exactly the
values q * s_b the emulated layer's kernel call gives with that seed. The GPU test repeats this on CUDA.

    TRITON_INTERPRET=1 PYTHONPATH=.:tests/models/quant python tests/models/quant/kernels_interpreted_nvfp4_torch.py
"""

from __future__ import annotations

import os

import torch

import quant_oracles as oracle
from kernels_interpreted import run_checks
from models.quant import kernels, nvfp4_torch
from models.quant.gemm_spec import OperandSpec
from models.quant.kernels import nvfp4, nvfp4_amax

assert os.environ.get("TRITON_INTERPRET") == "1", "run under TRITON_INTERPRET=1"
kernels.use_triton(True)


def _same_operand(got: nvfp4_torch.Nvfp4Operand, want: nvfp4_torch.Nvfp4Operand, what: str) -> None:
    assert got.reduction == want.reduction and got.data.shape == want.data.shape, what
    assert torch.equal(got.data, want.data), f"{what}: packed codes"
    assert torch.equal(got.scale, want.scale), f"{what}: swizzled scales"
    assert torch.equal(got.decode.reshape(()), want.decode.reshape(())), f"{what}: decode scale"


# (spec, transpose) as the layer quantizes its operands: X and dY along rows, W 16x16 (and its transpose, the
# 16x16 tiling of W itself transposed), W 1x16 along K and, for Dgrad, along N; X^T and dY^T with the RHT.
CASES = [(OperandSpec("nvfp4", (1, 16)), False), (OperandSpec("nvfp4", (16, 16)), False),
         (OperandSpec("nvfp4", (16, 16)), True), (OperandSpec("nvfp4", (1, 16)), True),
         (OperandSpec("nvfp4", (1, 16), rht=True), True)]


def check_round_to_nearest_operands_are_the_references() -> None:
    # 48 rows: the transposed operands' reduction is 16 mod 32, so they are padded too
    for (spec, transpose), four_over_six in [(case, choice) for case in CASES for choice in (None, "mse")]:
        if four_over_six is not None:
            spec = OperandSpec(spec.fmt, spec.tile, rht=spec.rht, four_over_six=four_over_six)
        for dtype in (torch.bfloat16, torch.float32):
            x = oracle.fresh_input(48, 96, 3.0, torch.float32).to(dtype)
            what = f"{spec.describe()} transpose={transpose} {dtype}"
            got = nvfp4_torch.kernel_codes(nvfp4, x, spec, transpose=transpose, seed=None, generator=None,
                                           scales=None, name="op").operand()
            want = nvfp4_torch.reference_codes(x, spec, transpose=transpose, name="op").operand()
            _same_operand(got, want, what)


def check_shared_scales_give_the_same_operands() -> None:
    """X for Fprop and X^T for Wgrad from one read of the global scales, as the layer's forward takes them."""
    x = oracle.fresh_input(64, 160, 9.0, torch.float32).to(torch.bfloat16)
    rows, columns = OperandSpec("nvfp4", (1, 16)), OperandSpec("nvfp4", (1, 16), rht=True)
    scales = nvfp4_amax.rows_and_rht_columns_scales(x)  # what kernels.nvfp4.shared_scales returns on CUDA
    for spec, transpose in ((rows, False), (columns, True)):
        got = nvfp4_torch.kernel_codes(nvfp4, x, spec, transpose=transpose, seed=None, generator=None, scales=scales,
                                       name="op").operand()
        _same_operand(got, nvfp4_torch.reference_codes(x, spec, transpose=transpose, name="op").operand(),
                      f"shared scales, transpose={transpose}")


def check_stochastic_operands_are_the_emulated_layers_values() -> None:
    """dY (rows) and dY^T (RHT columns) rounded stochastically with a seed: the packed operand dequantizes to
    the values kernels.nvfp4.quantize_operand (QuantLinear's call) writes with that seed, and another seed
    rounds otherwise."""
    dy = oracle.fresh_input(64, 96, 0.5, torch.float32).to(torch.bfloat16)
    for spec, transpose in ((OperandSpec("nvfp4", (1, 16), "stochastic"), False),
                            (OperandSpec("nvfp4", (1, 16), "stochastic", rht=True), True)):
        seed = torch.tensor([987654321])
        operand = nvfp4_torch.kernel_codes(nvfp4, dy, spec, transpose=transpose, seed=seed, generator=None,
                                           scales=None, name="op").operand()
        values, decode = nvfp4.quantize_operand(dy, spec, transpose=transpose, seed=seed, generator=None,
                                                out_dtype=torch.float32, scales=None, name="op")
        assert torch.equal(operand.decode, decode), spec.describe()
        scaled = operand.scaled_values()
        assert torch.equal(scaled, values), f"{spec.describe()}: {int((scaled != values).sum())} values differ"
        other = nvfp4_torch.kernel_codes(nvfp4, dy, spec, transpose=transpose, seed=seed + 1, generator=None,
                                         scales=None, name="op").operand()
        assert not torch.equal(other.data, operand.data), f"{spec.describe()}: the seed is ignored"


CHECKS = [check_round_to_nearest_operands_are_the_references, check_shared_scales_give_the_same_operands,
          check_stochastic_operands_are_the_emulated_layers_values]


if __name__ == "__main__":
    run_checks(CHECKS)
