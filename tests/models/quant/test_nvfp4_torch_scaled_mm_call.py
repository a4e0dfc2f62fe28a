"""The native NVFP4 layer's call into torch, checked on the CPU against what torch's CUDA op requires.

torch.nn.functional.scaled_mm hands its arguments to ``torch._scaled_mm_v2``, whose NVFP4 path runs only on
Blackwell. Here that op is replaced by a stand-in that enforces the CUDA op's argument checks (PyTorch
``ScaledBlas.cpp``: ``check_nvfp4_recipe``, ``check_swizzle_lengths``, ``_scaled_nvfp4_nvfp4``'s scale sizes;
the meta function in ``torch/_meta_registrations.py`` checks fewer: one swizzle entry passes there) and
computes the GEMM from the bytes it is handed with torch's own decoders, so the layer runs through the real
``F.scaled_mm`` wrapper: its recipes, swizzles, scale order and operand layouts, then its results against
the emulated layer's. Also: under tensor parallelism the layer's operands take the kernels with the group's
amax (the branch the CPU never reaches by itself).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.testing._internal.common_quantized import _floatx_unpacked_to_f32, from_blocked

from models.quant import nvfp4_torch
from models.quant.gemm_spec import OperandSpec
from models.quant.linear import QuantLinear
from test_nvfp4_torch import SPECS, _fresh, _run


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _cuda_op_stand_in(calls):
    block, tensor = int(F.ScalingType.BlockWise1x16.value), int(F.ScalingType.TensorWise.value)
    swizzled, plain = int(F.SwizzleType.SWIZZLE_32_4_4.value), int(F.SwizzleType.NO_SWIZZLE.value)

    def values(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        data = packed.contiguous().view(torch.uint8)
        codes = torch.stack((data & 15, data >> 4), dim=-1).reshape(data.shape[0], -1)  # element 2j: low nibble
        elements = _floatx_unpacked_to_f32(codes, 2, 1)
        scales = from_blocked(elements, scale, 16).float()
        return elements * scales.repeat_interleave(16, dim=1)

    def scaled_mm_v2(mat_a, mat_b, scale_a, recipe_a, swizzle_a, scale_b, recipe_b, swizzle_b, bias, output_dtype,
                     contraction_dim, use_fast_accum):
        calls.append(output_dtype)
        m, half = mat_a.shape
        n = mat_b.shape[1]
        assert mat_a.dtype == mat_b.dtype == torch.float4_e2m1fn_x2
        assert mat_a.stride() == (half, 1) and mat_b.shape[0] == half and mat_b.stride() == (1, half), \
            "A row-major, B column-major"
        assert half % 16 == 0, "packed rows of whole 16 bytes"
        assert list(recipe_a) == list(recipe_b) == [block, tensor], "check_nvfp4_recipe"
        assert list(swizzle_a) == list(swizzle_b) == [swizzled, plain], "check_swizzle_lengths: two entries each"
        for scales, rows in ((scale_a, m), (scale_b, n)):
            assert len(scales) == 2 and scales[0].dtype == torch.float8_e4m3fn and scales[0].is_contiguous()
            assert scales[0].numel() == _round_up(rows, 128) * _round_up(2 * half // 16, 4), "block scale size"
            assert scales[1].dtype == torch.float32 and scales[1].numel() == 1, "the tensor scale"
        assert bias is None and output_dtype in (torch.bfloat16, torch.float32)
        out = values(mat_a, scale_a[0]) @ values(mat_b.t(), scale_b[0]).t()
        return (out * (scale_a[1] * scale_b[1])).to(output_dtype)  # alpha = S_dec_a * S_dec_b, one rounding

    return scaled_mm_v2


def test_the_layer_calls_torchs_scaled_mm_as_the_cuda_op_requires(monkeypatch):
    calls = []
    monkeypatch.setattr(torch, "_scaled_mm_v2", _cuda_op_stand_in(calls))
    monkeypatch.setattr(nvfp4_torch, "check_native_support", lambda *args, **kwargs: None)
    for spec_name in ("paper", "weight_1d", "four_over_six"):
        for dtype in (torch.bfloat16, torch.float32):
            calls.clear()
            linear = nn.Linear(112, 80, bias=False, dtype=dtype)  # every reduction 16 mod 32: padded
            with torch.no_grad():
                linear.weight.copy_(_fresh(80, 112) * 0.1)
            native = nvfp4_torch.TorchNvfp4Linear.from_linear(linear, SPECS[spec_name](), name="up")
            emulated = QuantLinear.from_linear(linear, SPECS[spec_name](), name="up")
            for module in (native, emulated):
                module.set_seed(7, layer=3)
                module.set_step(11)
            x, grad_output = _fresh(48, 112, dtype).reshape(2, 24, 112), _fresh(48, 80, dtype).reshape(2, 24, 80)
            got, want = _run(native, x, grad_output), _run(emulated, x, grad_output)
            assert calls == [dtype] * 3, f"{spec_name} {dtype}: Fprop, Dgrad and Wgrad through torch's op"
            for name, a, b in zip(("Y", "dX", "dW"), got, want):
                assert a.shape == b.shape and a.dtype == b.dtype and b.abs().sum() > 0, name
                # the same products summed in another fp32 order (fp32 compute: dequantized products round too)
                bound = (2.0**-7 if dtype == torch.bfloat16 else 2.0**-14) * b.float().abs().max()
                assert (a.float() - b.float()).abs().max() <= bound, f"{spec_name} {dtype} {name}"


def test_a_sharded_operand_takes_the_kernels_with_the_groups_amax(monkeypatch, tmp_path):
    """Under tensor parallelism an operand the group's amax reduction names goes to the kernels with scales
    from ``group_scales`` (its own amax made the group's by the all-reduce); where a kernel family offers none,
    the torch reference with the group's amax. The kernel family is a recording stand-in (the CPU never picks
    the Triton kernels); the arithmetic of group_scales is checked under Triton's interpreter."""
    import torch.distributed as dist

    from models.quant.quantized_linear import AmaxReduction

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        x = _fresh(32, 64)
        spec = OperandSpec("nvfp4", (1, 16))
        reference = nvfp4_torch.quantize_operand(x, spec, transpose=False, name="Fprop W")
        calls, offers = [], [True]

        class Family:
            @staticmethod
            def group_scales(tensor, operand_spec, transpose, reduce_amax):
                reduced = reduce_amax(tensor.float().abs().amax().reshape(1))  # the real all-reduce
                calls.append(("group_scales", float(reduced)))
                return torch.cat([reduced.new_zeros(2), reduced, reduced]) if offers[0] else None

        def kernel_codes(module, tensor, operand_spec, *, transpose, seed, generator, scales, name,
                         with_transpose=False):
            calls.append(("kernel", name, None if scales is None else float(scales[2])))
            return reference

        monkeypatch.setattr(nvfp4_torch, "kernel_for", lambda tensor, operand_spec, transpose: Family)
        monkeypatch.setattr(nvfp4_torch, "kernel_codes", kernel_codes)
        reduction = AmaxReduction(dist.group.WORLD, frozenset({"Fprop W"}))
        amax = float(x.abs().amax())
        nvfp4_torch.quantize_operand(x, spec, transpose=False, name="Fprop W", amax=reduction)
        assert calls == [("group_scales", amax), ("kernel", "Fprop W", amax)]
        calls.clear()
        nvfp4_torch.quantize_operand(x, spec, transpose=False, name="Fprop X", amax=reduction)
        assert calls == [("kernel", "Fprop X", None)]  # not reduced: the kernels' own amax pass
        calls.clear()
        offers[0] = False
        fallback = nvfp4_torch.quantize_operand(x, spec, transpose=False, name="Fprop W", amax=reduction)
        assert [call[0] for call in calls] == ["group_scales"]
        assert torch.equal(fallback.data, reference.data) and torch.equal(fallback.decode, reference.decode)
    finally:
        dist.destroy_process_group()
