"""What the quantization kernels compile to, without a GPU (scripts/kernel_resources.py).

Each kernel variant (NVFP4's two amax passes and its quantize kernels, MXFP4's quantize kernels) at its default launch
configuration (models.quant.kernels.options) is compiled by the installed Triton for a CUDA target
(sm_90a by default: the H200),
with the specializations a launch on real tensors gets (16-divisible pointers and sizes), then
assembled by the ptxas that ships with Triton: registers per thread, spilled bytes, local-memory
instructions, SASS instructions and block-wide barriers. The kernels are issue-bound, so the SASS
count is a fair first proxy for their speed; barriers beyond a reduction's mean layout conversions
through shared memory; a spill is a red flag: a layout Triton 3.6 (the GPU machine's) chose for an
earlier form of the 2D kernel took 255 registers, spilled, and ran 6-7x slower, which this tool
shows offline.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from typing import List

import torch

from models.quant.kernels import mx, nvfp4, nvfp4_amax
from models.quant.kernels.options import MX_OPTIONS, NVFP4_OPTIONS
from models.quant.kernels.triton_common import bf16_rounding_mode, require_triton

POINTER_DTYPES = {"bf16": "*bf16", "fp32": "*fp32"}


@dataclass
class KernelResources:
    name: str
    input_dtype: str
    registers: int
    spill_bytes: int
    local_memory_instructions: int
    sass_instructions: int
    barriers: int
    """Block-wide barriers: reductions across warps, and layout conversions through shared memory."""


def _tool(name: str) -> str:
    import triton

    path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: this Triton ships no {name} (needed to assemble the PTX)")
    return path


def _compile(kernel, signature: dict, constexprs: dict, num_warps: int, capability: int):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = kernel.arg_names
    divisible = [name for name, kind in signature.items() if kind != "constexpr"]
    source = ASTSource(
        fn=kernel,
        signature={**signature, **{name: "constexpr" for name in constexprs}},
        constexprs={(names.index(name),): value for name, value in constexprs.items()},
        attrs={(names.index(name),): [["tt.divisibility", 16]] for name in divisible},
    )
    return triton.compile(source, target=GPUTarget("cuda", capability, 32),
                          options={"num_warps": num_warps, "enable_fp_fusion": False})


def assemble(ptx: str, capability: int) -> tuple:
    """(registers, spill bytes, local-memory instructions, SASS instructions, barriers) of one PTX kernel."""
    arch = f"sm_{capability}a" if capability >= 90 else f"sm_{capability}"
    with tempfile.TemporaryDirectory() as directory:
        ptx_path, cubin_path = os.path.join(directory, "k.ptx"), os.path.join(directory, "k.cubin")
        with open(ptx_path, "w") as handle:
            handle.write(ptx)
        report = subprocess.run([_tool("ptxas"), f"-arch={arch}", "-v", ptx_path, "-o", cubin_path],
                                capture_output=True, text=True, check=True).stderr
        sass = subprocess.run([_tool("cuobjdump"), "-sass", cubin_path], capture_output=True, text=True,
                              check=True).stdout
    registers = int(re.search(r"Used (\d+) registers", report).group(1))
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
    spill_bytes = int(spills.group(1)) + int(spills.group(2)) if spills else 0
    instructions = [line for line in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+\S", line)]
    local = sum(1 for line in instructions if re.search(r"\b(STL|LDL)\b", line))
    barriers = sum(1 for line in instructions if re.search(r"\bBAR\.", line))
    return registers, spill_bytes, local, len(instructions), barriers


def _bf16_rounding_constexpr(input_dtype: str, rounding: str) -> int:
    """The RHT kernels' ROUND_BF16 for a bf16/fp32 input, as the launches pass it."""
    return bf16_rounding_mode(torch.empty(0, dtype=torch.bfloat16 if input_dtype == "bf16" else torch.float32), rounding)


def _rows_variant(input_dtype: str, *, two_d: bool, stochastic: bool, capability: int, narrow: bool = False,
                  ue5m3: bool = False):
    options = NVFP4_OPTIONS
    block_r, block_c, warps = options.two_d if two_d else options.rows_narrow if narrow else options.rows
    signature = {"x_ptr": POINTER_DTYPES[input_dtype], "values_ptr": "*bf16", "codes_ptr": "*u8",
                 "scales_ptr": "*u8", "global_ptr": "*fp32", "amax_ptr": "*fp32", "seed_ptr": "*i64",
                 "rows": "i32", "cols": "i32"}
    constexprs = dict(BLOCK_R=block_r, BLOCK_C=block_c, TWO_D=two_d, STOCHASTIC=stochastic,
                      WRITE_CODES=False, SCALES_FROM_AMAX=True, UE5M3=ue5m3)
    return _compile(nvfp4._quantize_rows_kernel, signature, constexprs, warps, capability)


def _columns_variant(input_dtype: str, *, rht: bool, stochastic: bool, capability: int, four_over_six: int = 0,
                     ue5m3: bool = False):
    options = NVFP4_OPTIONS
    groups, block_c, warps = options.columns_stochastic if stochastic else options.columns
    signature = {"x_ptr": POINTER_DTYPES[input_dtype], "values_ptr": "*bf16", "codes_ptr": "*u8",
                 "scales_ptr": "*u8", "global_ptr": "*fp32", "amax_ptr": "*fp32", "seed_ptr": "*i64",
                 "groups": "i32", "cols": "i32"}
    constexprs = dict(GROUPS=groups, BLOCK_C=block_c, RHT=rht,
                      ROUND_BF16=_bf16_rounding_constexpr(input_dtype, options.bf16_rounding),
                      STOCHASTIC=stochastic, WRITE_CODES=False, SCALES_FROM_AMAX=not rht, FOUR_OVER_SIX=four_over_six,
                      UE5M3=ue5m3)
    return _compile(nvfp4._quantize_columns_kernel, signature, constexprs, warps, capability)


def _rows_four_over_six_variant(input_dtype: str, *, two_d: bool, stochastic: bool, capability: int):
    block_r, block_c, warps = NVFP4_OPTIONS.two_d_four_over_six if two_d else NVFP4_OPTIONS.rows_four_over_six
    signature = {"x_ptr": POINTER_DTYPES[input_dtype], "values_ptr": "*bf16", "codes_ptr": "*u8",
                 "scales_ptr": "*u8", "global_ptr": "*fp32", "amax_ptr": "*fp32", "seed_ptr": "*i64",
                 "rows": "i32", "cols": "i32"}
    constexprs = dict(BLOCK_R=block_r, BLOCKS=block_c // 16, TWO_D=two_d, STOCHASTIC=stochastic,
                      WRITE_CODES=False, FOUR_OVER_SIX=1,
                      IN_PIECE=8 if input_dtype == "bf16" else 4, OUT_PIECE=8)
    return _compile(nvfp4._quantize_rows_four_over_six_kernel, signature, constexprs, warps, capability)


def _amax_variant(input_dtype: str, *, rht: bool, capability: int, plain_amax: bool = False):
    options = NVFP4_OPTIONS
    if rht:
        groups, block_c, warps = options.rht_amax_launch(
            torch.float32 if input_dtype == "fp32" else torch.bfloat16, plain_amax)
        signature = {"x_ptr": POINTER_DTYPES[input_dtype], "partials_ptr": "*fp32", "groups": "i32", "cols": "i32",
                     "num_tiles_c": "i32", "num_tiles": "i32", "num_programs": "i32"}
        constexprs = dict(GROUPS=groups, BLOCK_C=block_c,
                          ROUND_BF16=_bf16_rounding_constexpr(input_dtype, options.bf16_rounding), PLAIN_AMAX=plain_amax)
        return _compile(nvfp4_amax._amax_columns_rht_kernel, signature, constexprs, warps, capability)
    block, unroll, warps = options.amax_chunk
    # Sizes are i32 at launch below 2^31 elements (Triton specializes Python ints by value).
    signature = {"x_ptr": POINTER_DTYPES[input_dtype], "amax_ptr": "*fp32", "numel": "i32", "per_program": "i32"}
    return _compile(nvfp4_amax._amax_chunks_kernel, signature, dict(BLOCK=block, UNROLL=unroll), warps, capability)


def _mx_rows_variant(input_dtype: str, *, stochastic: bool, capability: int, narrow: bool = False):
    block_r, block_c, warps = MX_OPTIONS.rows_narrow if narrow else MX_OPTIONS.rows
    signature = {"x_ptr": POINTER_DTYPES[input_dtype], "values_ptr": "*bf16", "codes_ptr": "*u8",
                 "scales_ptr": "*u8", "seed_ptr": "*i64", "rows": "i32", "cols": "i32"}
    constexprs = dict(BLOCK_R=block_r, BLOCK_C=block_c, STOCHASTIC=stochastic, WRITE_CODES=False)
    return _compile(mx._quantize_rows_kernel, signature, constexprs, warps, capability)


def _mx_columns_variant(input_dtype: str, *, rht: bool, stochastic: bool, capability: int):
    groups, block_c, warps = MX_OPTIONS.columns_stochastic if stochastic else MX_OPTIONS.columns
    signature = {"x_ptr": POINTER_DTYPES[input_dtype], "values_ptr": "*bf16", "codes_ptr": "*u8",
                 "scales_ptr": "*u8", "seed_ptr": "*i64", "groups": "i32", "cols": "i32"}
    constexprs = dict(GROUPS=groups, BLOCK_C=block_c, RHT=rht,
                      ROUND_BF16=_bf16_rounding_constexpr(input_dtype, MX_OPTIONS.bf16_rounding),
                      STOCHASTIC=stochastic, WRITE_CODES=False)
    return _compile(mx._quantize_columns_kernel, signature, constexprs, warps, capability)


VARIANTS = {
    "amax": lambda dtype, cc: _amax_variant(dtype, rht=False, capability=cc),
    "amax RHT": lambda dtype, cc: _amax_variant(dtype, rht=True, capability=cc),
    "amax RHT + plain": lambda dtype, cc: _amax_variant(dtype, rht=True, capability=cc, plain_amax=True),
    "rows 1x16 RNE": lambda dtype, cc: _rows_variant(dtype, two_d=False, stochastic=False, capability=cc),
    "rows 1x16 SR": lambda dtype, cc: _rows_variant(dtype, two_d=False, stochastic=True, capability=cc),
    "rows 1x16 RNE, narrow": lambda dtype, cc: _rows_variant(dtype, two_d=False, stochastic=False, capability=cc,
                                                              narrow=True),
    "rows 1x16 SR, narrow": lambda dtype, cc: _rows_variant(dtype, two_d=False, stochastic=True, capability=cc,
                                                             narrow=True),
    "2D 16x16 RNE": lambda dtype, cc: _rows_variant(dtype, two_d=True, stochastic=False, capability=cc),
    "columns 16x1 RNE": lambda dtype, cc: _columns_variant(dtype, rht=False, stochastic=False, capability=cc),
    "columns 16x1 SR": lambda dtype, cc: _columns_variant(dtype, rht=False, stochastic=True, capability=cc),
    "columns 16x1 RHT RNE": lambda dtype, cc: _columns_variant(dtype, rht=True, stochastic=False, capability=cc),
    "columns 16x1 RHT SR": lambda dtype, cc: _columns_variant(dtype, rht=True, stochastic=True, capability=cc),
    "4/6 rows 1x16 RNE": lambda dtype, cc: _rows_four_over_six_variant(dtype, two_d=False, stochastic=False,
                                                                      capability=cc),
    "4/6 rows 1x16 SR": lambda dtype, cc: _rows_four_over_six_variant(dtype, two_d=False, stochastic=True,
                                                                     capability=cc),
    "4/6 2D 16x16 RNE": lambda dtype, cc: _rows_four_over_six_variant(dtype, two_d=True, stochastic=False,
                                                                     capability=cc),
    "4/6 columns RHT RNE": lambda dtype, cc: _columns_variant(dtype, rht=True, stochastic=False, capability=cc,
                                                               four_over_six=1),
    "4/6 columns RHT SR": lambda dtype, cc: _columns_variant(dtype, rht=True, stochastic=True, capability=cc,
                                                              four_over_six=1),
    "UE5M3 rows 1x16 SR": lambda dtype, cc: _rows_variant(dtype, two_d=False, stochastic=True, capability=cc,
                                                          ue5m3=True),
    "UE5M3 2D 16x16 RNE": lambda dtype, cc: _rows_variant(dtype, two_d=True, stochastic=False, capability=cc,
                                                          ue5m3=True),
    "UE5M3 columns RHT SR": lambda dtype, cc: _columns_variant(dtype, rht=True, stochastic=True, capability=cc,
                                                               ue5m3=True),
    "mx rows 1x32 RNE": lambda dtype, cc: _mx_rows_variant(dtype, stochastic=False, capability=cc),
    "mx rows 1x32 SR": lambda dtype, cc: _mx_rows_variant(dtype, stochastic=True, capability=cc),
    "mx rows 1x32 RNE, narrow": lambda dtype, cc: _mx_rows_variant(dtype, stochastic=False, capability=cc, narrow=True),
    "mx rows 1x32 SR, narrow": lambda dtype, cc: _mx_rows_variant(dtype, stochastic=True, capability=cc, narrow=True),
    "mx columns 32x1 RNE": lambda dtype, cc: _mx_columns_variant(dtype, rht=False, stochastic=False, capability=cc),
    "mx columns 32x1 SR": lambda dtype, cc: _mx_columns_variant(dtype, rht=False, stochastic=True, capability=cc),
    "mx columns 32x1 RHT RNE": lambda dtype, cc: _mx_columns_variant(dtype, rht=True, stochastic=False, capability=cc),
    "mx columns 32x1 RHT SR": lambda dtype, cc: _mx_columns_variant(dtype, rht=True, stochastic=True, capability=cc),
}


def kernel_resources(input_dtypes=("bf16", "fp32"), capability: int = 90, names=None) -> List[KernelResources]:
    """Compile every variant (or those in ``names``) for each input dtype; one row each."""
    require_triton("benchmarks.kernel_resources")
    rows = []
    for input_dtype in input_dtypes:
        for name, build in VARIANTS.items():
            if names is not None and name not in names:
                continue
            registers, spill_bytes, local, sass, barriers = assemble(build(input_dtype, capability).asm["ptx"],
                                                                     capability)
            rows.append(KernelResources(name, input_dtype, registers, spill_bytes, local, sass, barriers))
    return rows


def render(rows: List[KernelResources]) -> List[str]:
    lines = [f"{'kernel':26s} {'input':>5s} {'registers':>9s} {'spill B':>7s} {'local ops':>9s} {'SASS':>6s} "
             f"{'barriers':>8s}"]
    for row in rows:
        lines.append(f"{row.name:26s} {row.input_dtype:>5s} {row.registers:9d} {row.spill_bytes:7d} "
                     f"{row.local_memory_instructions:9d} {row.sass_instructions:6d} {row.barriers:8d}")
    return lines
