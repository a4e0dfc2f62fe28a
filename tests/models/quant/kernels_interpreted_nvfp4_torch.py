"""The native NVFP4 layer's kernel path under Triton's interpreter, on the CPU (run by
test_kernels_interpreted.py with TRITON_INTERPRET=1).

The layer asks the NVFP4 kernels for their codes only (``nvfp4_torch.kernel_codes``: ``write_values=False``,
packed two a byte in the operand's layout) where QuantLinear asks them for the scaled values
(``kernels.nvfp4.quantize_operand``). Checked here: the codes-only kernels write, in every orientation
(rows 1x16, 16x16 tiles with and without x^T's codes, columns with and without the RHT), variant (NVFP4,
Four Over Six, UE5M3 scales) and rounding, exactly ``pack_codes`` of the codes the values path writes (of
their transpose for the columns), zero-padded along the reduction, on partial tiles and launches whose
padding takes programs of its own, and no values buffer is launched with; for every orientation the layer
uses, round to nearest gives the packed bytes, swizzled scales and decode scale of the torch reference
(``nvfp4_torch.reference_codes``), Four Over Six included, with the packed codes taken as the kernel wrote
them; stochastic rounding with a seed gives exactly the values q * s_b the emulated layer's kernel call gives
with that seed. The GPU test repeats the layer's operands on CUDA.

    TRITON_INTERPRET=1 PYTHONPATH=.:tests/models/quant python tests/models/quant/kernels_interpreted_nvfp4_torch.py
"""

from __future__ import annotations

import dataclasses
import itertools
import os

import torch
import torch.nn.functional as F

import quant_oracles as oracle
from kernels_interpreted import run_checks
from models.quant import kernels, nvfp4_layout, nvfp4_torch
from models.quant.gemm_spec import OperandSpec
from models.quant.kernels import nvfp4, nvfp4_amax
from models.quant.kernels.options import NVFP4_OPTIONS

assert os.environ.get("TRITON_INTERPRET") == "1", "run under TRITON_INTERPRET=1"
kernels.use_triton(True)


def _same_operand(got: nvfp4_layout.Nvfp4Operand, want: nvfp4_layout.Nvfp4Operand, what: str) -> None:
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


VALUES_KERNELS = ("_quantize_rows_kernel", "_quantize_columns_kernel", "_quantize_rows_four_over_six_kernel")
CODES_KERNELS = ("_quantize_rows_codes_kernel", "_quantize_columns_codes_kernel",
                 "_quantize_rows_four_over_six_codes_kernel")


class _Launches:
    """Records which NVFP4 quantize kernels run, and with which arguments, while it is entered (Triton's pre-run
    hooks of the kernels, removed on exit); fills every output buffer (codes, transposed codes, scales) with
    0xFF bytes before the launch, so that a byte the kernel leaves unwritten (the padding, say) cannot pass for
    a zero the allocator happened to give."""

    def __init__(self):
        self.launched = []
        self.hooks = [(getattr(nvfp4, name), self._hook(name)) for name in VALUES_KERNELS + CODES_KERNELS]

    def _hook(self, name):
        arg_names = getattr(nvfp4, name).arg_names

        def hook(*args, **kwargs):
            self.launched.append((name, args))
            for arg_name, arg in zip(arg_names, args):
                if arg_name in ("codes_ptr", "transposed_ptr", "scales_ptr"):
                    arg.view(torch.uint8).fill_(255)

        return hook

    def __enter__(self):
        for kernel, hook in self.hooks:
            kernel.add_pre_run_hook(hook)
        return self

    def __exit__(self, *exc):
        for kernel, hook in self.hooks:
            kernel.pre_run_hooks.remove(hook)


def _packed(codes: torch.Tensor, multiple: int) -> torch.Tensor:
    """pack_codes of uint8 codes [rows, n], zero-padded to round_up(n, multiple) codes a row."""
    return F.pad(nvfp4_layout.pack_codes(codes), (0, (-codes.shape[1] % multiple) // 2))


def _codes_only(call, x: torch.Tensor, what: str):
    """``call()`` (a codes-only quantize) run while recording the launches: only codes kernels, none of them
    with a values parameter or a floating buffer of x's size beside x."""
    with _Launches() as launches:
        out = call()
    assert out.values is None, what
    assert launches.launched and all(name in CODES_KERNELS for name, _ in launches.launched), (what, launches.launched)
    for name, args in launches.launched:
        assert "values_ptr" not in getattr(nvfp4, name).arg_names, what
        assert not any(torch.is_tensor(arg) and arg.is_floating_point() and arg.numel() >= x.numel()
                       for arg in args[1:]), f"{what}: a values-sized buffer was launched"
    return out


def _same_scales(got, want, what: str) -> None:
    assert torch.equal(got.block_scales.view(torch.uint8), want.block_scales.view(torch.uint8)), f"{what}: scales"
    assert torch.equal(got.decode_scale, want.decode_scale) or (got.decode_scale.isnan().all()
                                                                 and want.decode_scale.isnan().all()), what


# (fmt, four_over_six): every variant the kernels take (Four Over Six's MAE differs from MSE in its choice only)
VARIANTS = [("nvfp4", None), ("nvfp4", "mse"), ("nvfp4_ue5m3", None)]
# Launches whose tiles leave the padding to programs of their own: one 16-column block a Four Over Six program
# (cols 80 padded to 96), one group of 16 rows a columns program (48 rows padded to 64).
SMALL_TILES = dataclasses.replace(NVFP4_OPTIONS, rows=(16, 32, 1), rows_narrow=(16, 32, 1), two_d=(16, 32, 1),
                                  rows_four_over_six=(8, 16, 1), two_d_four_over_six=(16, 16, 1), columns=(1, 32, 1),
                                  columns_stochastic=(1, 32, 1))


def check_codes_only_kernels_pack_the_values_paths_codes() -> None:
    """quantize_rows / quantize_columns with write_values=False write pack_codes of the codes the values path
    writes (x^T's for the columns and the transposed 16x16 codes), zero-padded to packed_multiple along the
    reduction, the same scales and decode scale, in every orientation, variant and rounding (the same draws).
    48 x 80: partial tiles, both reductions 16 mod 32 (so padded to 32, as the layer asks)."""
    cases = [(NVFP4_OPTIONS, variant, stochastic) for variant in VARIANTS for stochastic in (False, True)]
    cases += [(SMALL_TILES, variant, False) for variant in VARIANTS]  # the padding's own programs: RNE is enough
    for options, (fmt, four_over_six), stochastic in cases:
        dtype = torch.bfloat16 if (len(fmt) + stochastic + (options is SMALL_TILES)) % 2 else torch.float32
        x = oracle.fresh_input(48, 80, 3.0, torch.float32).to(dtype)
        common = dict(stochastic=stochastic, seed=1234, four_over_six=four_over_six, fmt=fmt, options=options)
        what = f"{dtype} {fmt} 4/6={four_over_six} SR={stochastic} {options.rows}"
        multiples = (16, 32) if options is NVFP4_OPTIONS and not stochastic else (32,)
        for two_d in (False, True):
            want = nvfp4.quantize_rows(x, two_d=two_d, write_codes=True, **common)
            layouts = [(True, True), (True, False), (False, True)] if two_d else [(True, False)]
            for (write_codes, transposed_codes), multiple in itertools.product(layouts, multiples):
                label = f"rows two_d={two_d} codes={write_codes} transposed={transposed_codes} x{multiple} {what}"
                got = _codes_only(lambda: nvfp4.quantize_rows(
                    x, two_d=two_d, write_codes=write_codes, write_values=False, transposed_codes=transposed_codes,
                    packed_multiple=multiple, **common), x, label)
                _same_scales(got, want, label)
                if write_codes:
                    assert torch.equal(got.codes, _packed(want.codes, multiple)), f"{label}: codes"
                else:
                    assert got.codes is None, label
                if transposed_codes:
                    assert torch.equal(got.transposed_codes, _packed(want.codes.t(), multiple)), f"{label}: x^T codes"
                else:
                    assert got.transposed_codes is None, label
        for rht, multiple in itertools.product((False, True), multiples):
            label = f"columns rht={rht} x{multiple} {what}"
            want = nvfp4.quantize_columns(x, rht=rht, write_codes=True, **common)
            got = _codes_only(lambda: nvfp4.quantize_columns(x, rht=rht, write_codes=True, write_values=False,
                                                             packed_multiple=multiple, **common), x, label)
            _same_scales(got, want, label)
            assert torch.equal(got.codes, _packed(want.codes.t(), multiple)), f"{label}: codes"


def check_codes_only_non_finite_and_arguments() -> None:
    """A NaN reaches the codes-only outputs as the values path's (NaN decode scale, the same codes); codes-only
    calls that would write nothing, or a transposed 1x16 operand, are refused."""
    x = oracle.fresh_input(48, 80, 1.0, torch.float32).to(torch.bfloat16)
    x[5, 17] = float("nan")
    for two_d in (False, True):
        want = nvfp4.quantize_rows(x, two_d=two_d, write_codes=True)
        got = nvfp4.quantize_rows(x, two_d=two_d, write_codes=True, write_values=False, transposed_codes=two_d,
                                  packed_multiple=32)
        assert want.decode_scale.isnan().all() and got.decode_scale.isnan().all(), two_d
        assert torch.equal(got.codes, _packed(want.codes, 32)), f"NaN two_d={two_d}"
    want = nvfp4.quantize_columns(x, rht=True, write_codes=True)
    got = nvfp4.quantize_columns(x, rht=True, write_codes=True, write_values=False, packed_multiple=32)
    assert got.decode_scale.isnan().all() and torch.equal(got.codes, _packed(want.codes.t(), 32)), "NaN columns"
    for call in (lambda: nvfp4.quantize_rows(x, write_values=False),
                 lambda: nvfp4.quantize_rows(x, write_codes=True, write_values=False, transposed_codes=True),
                 lambda: nvfp4.quantize_rows(x, two_d=True, write_codes=True, transposed_codes=True),
                 lambda: nvfp4.quantize_rows(x, write_codes=True, write_values=False, packed_multiple=24),
                 lambda: nvfp4.quantize_columns(x, write_values=False)):
        try:
            call()
        except ValueError:
            continue
        raise AssertionError("a codes-only call that cannot be served was accepted")


def check_the_layers_codes_are_not_packed_again() -> None:
    """kernel_codes hands the GEMM the kernel's own buffers: operand().data is the packed codes the kernel wrote
    (padded to 32 by the kernel where the reduction is 16 mod 32), W's x^T codes written in the same pass
    are what .t() takes, and both equal the torch reference's operands."""
    x = oracle.fresh_input(48, 80, 2.0, torch.float32).to(torch.bfloat16)  # both reductions 16 mod 32
    for spec, transpose in CASES:
        codes = nvfp4_torch.kernel_codes(nvfp4, x, spec, transpose=transpose, seed=None, generator=None,
                                         scales=None, name="op")
        operand = codes.operand()
        assert operand.data.data_ptr() == codes.data.data_ptr(), f"{spec.describe()} transpose={transpose}: repacked"
        assert operand.data.shape[1] * 2 == -(-operand.reduction // 32) * 32
    tiles = OperandSpec("nvfp4", (16, 16))
    for spec in (tiles, OperandSpec("nvfp4", (16, 16), "stochastic", four_over_six="mse")):
        seed = torch.tensor([42])
        both = nvfp4_torch.kernel_codes(nvfp4, x, spec, transpose=False, seed=seed, generator=None, scales=None,
                                        name="op", with_transpose=True)
        alone = nvfp4_torch.kernel_codes(nvfp4, x, spec, transpose=True, seed=seed, generator=None, scales=None,
                                         name="op")
        assert both.transposed_data is not None, spec.describe()
        got, want = both.t().operand(), alone.operand()
        assert got.data.data_ptr() == both.transposed_data.data_ptr(), f"{spec.describe()}: W^T repacked"
        _same_operand(got, want, f"{spec.describe()} W^T from the same pass")
        repacked = nvfp4_layout.Nvfp4Codes(both.data, both.scales, both.decode, 16).t().operand()
        _same_operand(got, repacked, f"{spec.describe()} W^T repacked by torch")
        if spec.rounding == "nearest":
            _same_operand(got, nvfp4_torch.reference_codes(x, spec, transpose=True, name="op").operand(),
                          f"{spec.describe()} W^T reference")


CHECKS = [check_round_to_nearest_operands_are_the_references, check_shared_scales_give_the_same_operands,
          check_stochastic_operands_are_the_emulated_layers_values,
          check_codes_only_kernels_pack_the_values_paths_codes, check_codes_only_non_finite_and_arguments,
          check_the_layers_codes_are_not_packed_again]


if __name__ == "__main__":
    run_checks(CHECKS)
