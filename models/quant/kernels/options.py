"""Launch configurations of the quantization kernels: one frozen options object per family.

Every launch function takes ``options=`` (default: the family's ``*_OPTIONS`` below), so a benchmark
or a test builds a variant with ``dataclasses.replace(NVFP4_OPTIONS, rows=(16, 128, 4))`` and passes
it; nothing is set on a module. None of these choices changes a bit of any output (the kernels'
tests run several launches of each); they set speed and register use only. Timings are GPU time on
the H200 at 8192 x 5120 unless said otherwise (scripts/bench_quant.py), registers and spills from
scripts/kernel_resources.py (Triton 3.6, sm_90a).

A launch is (tile rows, tile cols, num_warps) for the kernels whose blocks run along a row, and
(groups of 16 rows, cols, num_warps) for those whose blocks run down the columns.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Tuple

import torch

Launch = Tuple[int, int, int]
BF16_ROUNDINGS = ("hardware", "integer")


def _check_launches(options) -> None:
    """ValueError naming the field unless every launch is three positive powers of two."""
    for field in fields(options):
        value = getattr(options, field.name)
        if isinstance(value, tuple) and not all(isinstance(v, int) and v > 0 and v & (v - 1) == 0 for v in value):
            raise ValueError(f"{type(options).__name__}.{field.name}: every entry must be a power of two, got {value}")


@dataclass(frozen=True)
class Nvfp4Options:
    """models.quant.kernels.nvfp4 and nvfp4_amax."""

    rows: Launch = (16, 256, 4)
    """The 1x16 rows kernels: the fastest swept launch for RNE (76 us) and SR (96 us); 64 and 75
    registers, no spills."""
    rows_narrow: Launch = (32, 128, 4)
    """The rows kernels where ``rows``' 256 does not divide cols (the study's Mamba in_proj, 1152
    wide, whose last 256-wide tile would be half masked): 48 us RNE and 64 us SR against 52 and 72 at
    16 x 256 x 4 (32768 x 1152 bf16)."""
    two_d: Launch = (16, 64, 2)
    """The 16x16 kernel (weights; tile rows must be 16): 83 us bf16 and 106 us fp32 against 140 and
    165 at 16 x 256 x 4."""
    rows_four_over_six: Launch = (8, 256, 4)
    """The Four Over Six rows kernel (1x16 blocks; tile cols a multiple of 16): one block per thread, as
    TE's 4over6 kernel runs. Not yet timed."""
    two_d_four_over_six: Launch = (16, 128, 4)
    """The Four Over Six 16x16 kernel (tile rows must be 16): one block row per thread. Not yet timed."""
    columns: Launch = (4, 128, 8)
    """The 16x1 columns kernels, RNE: the fastest launch, or within 0.3% of it, with and without the
    RHT at 8192 x 5120 and 32768 x 1024."""
    columns_stochastic: Launch = (2, 128, 4)
    """The columns kernels with stochastic rounding: 4-5% faster than 1 x 128 x 4 at every width
    timed (256 to 20480), though Triton 3.6 moves its Philox words through shared memory."""
    amax_chunk: Launch = (4096, 4, 8)
    """(elements per load, loads in flight, num_warps) of the amax pass: it reads x at ~96% of copy
    bandwidth (8192 x 20480 bf16)."""
    amax_max_programs: int = 4096
    """At most this many programs (and atomics) in the amax pass; larger tensors give each more."""
    rht_amax: Launch = (4, 128, 4)
    """One step of the persistent RHT amax kernel: 40 us for bf16 (51% of copy bandwidth) against 48
    at 2 x 128 x 4; every launch timed was within 1% for fp32."""
    rht_plain_amax: Launch = (4, 128, 4)
    """The RHT amax pass that also takes max |x| (bf16 input): 49 us against 54 at 4 x 64 x 4; 128
    registers with the hardware bf16 rounding, so four programs of 128 threads per SM still fit."""
    rht_plain_amax_fp32: Launch = (4, 64, 4)
    """The same for fp32 input, whose 16 loaded rows stay live through the transform: 64 registers
    without spills, where 4 x 128 x 4 took 168 (three programs per SM)."""
    amax_programs_per_sm: int = 4
    """Programs per SM of the persistent RHT amax kernel."""
    bf16_rounding: str = "hardware"
    """How the RHT kernels round the transformed values of a bf16 input to bf16: "hardware" (the
    fp32 -> bf16 conversion, cvt.rn.bf16.f32, as torch's CUDA ``.to(bfloat16)``) or "integer" (on
    the bits: the reference, and what Triton's interpreter always runs, since its conversion
    truncates). Identical outputs (the GPU tests run both); "hardware" ran the RHT amax pass in 30
    us against 40."""

    def __post_init__(self):
        _check_launches(self)
        if self.bf16_rounding not in BF16_ROUNDINGS:
            raise ValueError(f"Nvfp4Options.bf16_rounding must be one of {BF16_ROUNDINGS}, got {self.bf16_rounding!r}")
        for name in ("two_d", "two_d_four_over_six"):
            if getattr(self, name)[0] != 16:
                raise ValueError(f"Nvfp4Options.{name}: the 16x16 kernels take 16 tile rows, got {getattr(self, name)}")
        if self.rows_four_over_six[1] % 16:
            raise ValueError(f"Nvfp4Options.rows_four_over_six: tile cols must be a multiple of 16, "
                             f"got {self.rows_four_over_six}")

    def rows_launch(self, cols: int) -> Launch:
        """The 1x16 rows kernels' launch for a tensor ``cols`` wide."""
        return self.rows if cols % self.rows[1] == 0 else self.rows_narrow

    def rht_amax_launch(self, dtype: torch.dtype, plain_amax: bool) -> Launch:
        """The RHT amax pass's launch for an input of ``dtype``, with or without max |x|."""
        if not plain_amax:
            return self.rht_amax
        return self.rht_plain_amax_fp32 if dtype == torch.float32 else self.rht_plain_amax


@dataclass(frozen=True)
class Fp8Options:
    """models.quant.kernels.fp8. An operand quantized 1x128 in both orientations (X, dY), or per
    tensor, is read in two passes, a rows-only pass over [rows_pass_tile_rows, 128] tiles and a
    columns-only pass over [128, columns_pass_tile_cols] tiles: at (64, 64) each program holds half
    the values of one 128x128 read writing both, and the blockwise FP8 layer took 5.45 ms against
    5.64 (5120 -> 20480 at 8192 tokens). 128x128 weight tiles are read once for both."""

    rows_pass_tile_rows: int = 64
    columns_pass_tile_cols: int = 64
    num_warps: int = 8

    def __post_init__(self):
        for name in ("rows_pass_tile_rows", "columns_pass_tile_cols"):
            if getattr(self, name) not in (16, 32, 64, 128):
                raise ValueError(f"Fp8Options.{name} must be 16, 32, 64 or 128, got {getattr(self, name)}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"Fp8Options.num_warps must be a power of two up to 16, got {self.num_warps}")


@dataclass(frozen=True)
class EpilogueOptions:
    """models.quant.kernels.epilogue (scaling an fp32 GEMM output): one 4096-element chunk per program."""

    block: int = 4096
    num_warps: int = 8

    def __post_init__(self):
        _check_launches(self)


@dataclass(frozen=True)
class MxOptions:
    """models.quant.kernels.mx. The launches hold NVFP4's 32 elements per thread (its launches of the
    same shape were the fastest swept); not yet timed on their own. Triton 3.6 compiles them to at
    most 80 registers (RNE) and 127 (the columns kernel with SR), without spills."""

    rows: Launch = (16, 256, 4)
    """The 1x32 rows kernel (tile cols a multiple of 32)."""
    rows_narrow: Launch = (32, 128, 4)
    """The rows kernel where ``rows``' 256 does not divide cols (1152 = 4.5 x 256: the study's Mamba
    in_proj), so that no tile is half masked."""
    columns: Launch = (2, 128, 8)
    """(groups of 32 rows, cols, num_warps) of the 32x1 columns kernels, RNE."""
    columns_stochastic: Launch = (1, 128, 4)
    """The columns kernels with stochastic rounding, whose Philox words take registers of their own."""
    bf16_rounding: str = "hardware"
    """As ``Nvfp4Options.bf16_rounding``, for the RHT of the Wgrad operands."""

    def __post_init__(self):
        _check_launches(self)
        if self.bf16_rounding not in BF16_ROUNDINGS:
            raise ValueError(f"MxOptions.bf16_rounding must be one of {BF16_ROUNDINGS}, got {self.bf16_rounding!r}")
        for name in ("rows", "rows_narrow"):
            if getattr(self, name)[1] % 32:
                raise ValueError(f"MxOptions.{name}: tile cols must be a multiple of 32, got {getattr(self, name)}")

    def rows_launch(self, cols: int) -> Launch:
        """The rows kernel's launch for a tensor ``cols`` wide."""
        return self.rows if cols % self.rows[1] == 0 else self.rows_narrow


NVFP4_OPTIONS = Nvfp4Options()
FP8_OPTIONS = Fp8Options()
EPILOGUE_OPTIONS = EpilogueOptions()
MX_OPTIONS = MxOptions()
