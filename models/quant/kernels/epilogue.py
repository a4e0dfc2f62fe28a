"""The emulated GEMM's epilogue: an fp32 GEMM output scaled by the per-tensor decode scales, rounded.

``scale_gemm_output`` does in one pass what ``scale_gemm_output_ref`` does in torch ops (an fp32
multiply, one round-to-nearest-even to the output dtype); ``models.quant.linear`` calls it for the
bf16 and fp16 GEMMs of the kernel formats (NVFP4 with its decode scales, MXFP4 without any) and
Wgrad's widened FP32 gradient.
"""

from __future__ import annotations

from typing import Optional

import torch

from models.quant.kernels.options import EPILOGUE_OPTIONS, EpilogueOptions
from models.quant.kernels.triton_common import require_triton, tl, triton


def scale_gemm_output_ref(out: torch.Tensor, decode: Optional[torch.Tensor], dtype: torch.dtype, *,
                          widen_to: Optional[torch.dtype] = None,
                          decode_b: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The torch reference of ``scale_gemm_output`` (a new tensor; ``out`` is left as it is)."""
    if decode is None:
        result = out.to(dtype)
        return result if widen_to is None else result.to(widen_to)
    scale = decode if decode_b is None else decode * decode_b
    result = torch.mul(out, scale, out=torch.empty(out.shape, dtype=dtype, device=out.device))
    return result if widen_to is None else result.to(widen_to)


if triton is not None:
    # Imported under its own name: Inductor splices each jit helper's source under its __name__.
    from models.quant.kernels.triton_common import round_to_bf16

    @triton.jit
    def _scale_gemm_output_kernel(
        out_ptr, result_ptr, decode_ptr, decode_b_ptr, numel, BLOCK: tl.constexpr, WIDEN_FROM_BF16: tl.constexpr,
        TWO_DECODES: tl.constexpr, SCALE: tl.constexpr = True,
    ):
        """result = (out * S_dec) rounded to result's dtype, or (WIDEN_FROM_BF16) rounded to bf16 and
        stored as fp32; one fp32 multiply, one RNE rounding, as torch's mul-then-cast. TWO_DECODES:
        S_dec = decode * decode_b, the operands' two per-tensor decode scales (one fp32 product, as
        torch's), so no separate launch multiplies them. Without SCALE, the rounding alone."""
        offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < numel
        scaled = tl.load(out_ptr + offsets, mask=mask, other=0.0)
        if SCALE:
            decode = tl.load(decode_ptr)
            if TWO_DECODES:
                decode = decode * tl.load(decode_b_ptr)
            scaled = scaled * decode
        if WIDEN_FROM_BF16:
            tl.store(result_ptr + offsets, round_to_bf16(scaled, False), mask=mask)
        elif result_ptr.dtype.element_ty == tl.bfloat16:
            # Rounded by integer RNE first, so the cast is exact whatever rounding the backend's
            # fp32 -> bf16 conversion uses.
            tl.store(result_ptr + offsets, round_to_bf16(scaled, False).to(tl.bfloat16), mask=mask)
        else:
            tl.store(result_ptr + offsets, scaled.to(result_ptr.dtype.element_ty), mask=mask)


def scale_gemm_output(out: torch.Tensor, decode: Optional[torch.Tensor], dtype: torch.dtype, *,
                      widen_to: Optional[torch.dtype] = None, decode_b: Optional[torch.Tensor] = None,
                      options: EpilogueOptions = EPILOGUE_OPTIONS) -> torch.Tensor:
    """(out * decode).to(dtype) in one pass over an fp32 GEMM output; with ``widen_to=torch.float32``
    (and dtype bf16) ``(out * decode).to(bf16).to(float32)``, written in place into ``out``.

    out: contiguous fp32 [M, N] (CUDA); decode: fp32 one-element tensor (the product of the operands'
    per-tensor decode scales; or, with ``decode_b``, the first of the two, multiplied here as
    ``decode * decode_b``; None for a format without per-tensor scales: the rounding alone). Bit for
    bit ``scale_gemm_output_ref``. The widened form is Wgrad's: the
    FP32 gradient of an FP32 master weight, computed in bf16, without a bf16 buffer and a widening
    copy. A NaN stays NaN, but its sign and payload bits may differ from torch's cast (which itself
    differs between CPU and CUDA); the tests compare NaN as NaN.
    """
    require_triton("models.quant.kernels.epilogue.scale_gemm_output")
    if out.dtype != torch.float32 or not out.is_contiguous():
        raise ValueError(f"scale_gemm_output takes a contiguous fp32 GEMM output, got {out.dtype}, "
                         f"strides {out.stride()}")
    widen = widen_to is not None and widen_to != dtype
    if widen and (dtype != torch.bfloat16 or widen_to != torch.float32):
        raise ValueError(f"scale_gemm_output widens bf16 to float32 only, got {dtype} -> {widen_to}")
    result = out if widen else torch.empty(out.shape, dtype=dtype, device=out.device)
    numel = out.numel()
    scale = decode is not None
    # Without a scale the decode pointers are placeholders the kernel does not read.
    decode_arg = decode.reshape(1) if scale else out
    decode_b_arg = (decode if decode_b is None else decode_b).reshape(1) if scale else out
    _scale_gemm_output_kernel[(triton.cdiv(numel, options.block),)](
        out, result, decode_arg, decode_b_arg, numel, BLOCK=options.block, WIDEN_FROM_BF16=widen,
        TWO_DECODES=scale and decode_b is not None, SCALE=scale, num_warps=options.num_warps,
        enable_fp_fusion=False,
    )
    return result
