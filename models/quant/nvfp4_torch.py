"""Native NVFP4 linear layer: Fprop, Dgrad and Wgrad as block-scaled FP4 GEMMs through torch's scaled matmul.

The three GEMMs of ``Y = X W^T`` (T tokens, K in_features, N out_features), each ``A B^T`` with both
operands row-major and blocked along the reduction dim (the "TN" layout of cuBLASLt's block-scaled GEMM):

    Fprop  Y  [T, N] = X    [T, K] . W   [N, K]^T     X 1x16 along K, W 16x16 tiles (or 1x16 along K)
    Dgrad  dX [T, K] = dY   [T, N] . W^T [K, N]^T     dY 1x16 along N; W^T: W's 16x16 codes transposed,
                                                      or (1x16 weights) W quantized again along N
    Wgrad  dW [N, K] = dY^T [N, T] . X^T [K, T]^T     both 1x16 along tokens, after the RHT

Every operand is quantized as the emulated layer (``models.quant.linear``) quantizes it: the same
quantizers (the Triton kernels where ``QuantLinear`` sends the operand to them, else the torch reference),
the same stochastic-rounding seeds, shared global scales and tensor-parallel amax. So its E2M1 codes q,
E4M3 block scales s_b and per-tensor decode scale S_dec = 1 / S_enc are the emulated path's, bit for bit:

    S_enc = min(2688 / amax, FLT_MAX)  (1536 / amax with Four Over Six);  1 if amax == 0
    s_b   = e4m3(block_amax * (S_enc * (1/6)))                            RNE, saturating at 448
    q     = e2m1(x * min(1 / (fp32(s_b) * S_dec), FLT_MAX))               RNE or stochastic

The GEMM computes, for C = A B^T over a reduction of length R,

    C[m, n] = (S_dec_a * S_dec_b) * sum_k (q_a[m, k] * s_a[m, k // 16]) * (q_b[n, k] * s_b[n, k // 16])

the tensor cores applying each 16-long block's two scales and accumulating in fp32, then cuBLASLt
multiplying by alpha = S_dec_a * S_dec_b (torch forms the product, ``_scaled_nvfp4_nvfp4``) and rounding
once to the output dtype. That is the emulated GEMM's formula (exact scaled values q * s_b, fp32 sums, times
S_dec_a * S_dec_b, one rounding) up to the order of the fp32 additions; with an fp32 compute dtype the
emulated path multiplies fully dequantized operands, so there the per-element products round differently too.

Layouts of an operand [rows, R] (PyTorch ``ScaledBlas.cpp`` ``_scaled_nvfp4_nvfp4`` and its meta function
``_check_scaled_mm_sizes_v2``; ``test_scaled_matmul_cuda.py`` ``test_blockwise_nvfp4_with_global_scale``;
cuBLAS, "1D Block Scaling Factors Layout"):
- codes: ``torch.float4_e2m1fn_x2`` [rows, R / 2], row-major, two codes a byte with element 2j in the low
  nibble (torch's ``pack_uint4``, ``QuantizedTensor.packed_codes``); B goes in as ``B.t()`` (column-major).
  A packed row must be a multiple of 16 bytes, i.e. R % 32 (cuBLAS's 16-byte alignment; torch's meta function
  checks ``size(1) % 16`` on the packed tensor, its CUDA op only R % 16, and its own tests skip NVFP4
  otherwise): a reduction of 16 mod 32 (a tensor-parallel shard of 2832 rows, say) gets one block of zero
  codes with a zero scale, which adds exact zeros to every sum;
- block scales: ``float8_e4m3fn`` [rows, R / 16], zero-padded to [round_up(rows, 128), round_up(R / 16, 4)]
  and laid out in cuBLAS's 128x4 tiles, one contiguous vector: scale (r, c) at element
  512 * (r // 128 * tiles_per_row + c // 4) + 16 * (r % 32) + 4 * (r % 128 // 32) + c % 4
  (``SwizzleType.SWIZZLE_32_4_4``; torch's ``to_blocked`` writes the same). A 16x16 tile's scale is
  repeated over its 16 rows;
- per-tensor scale: S_dec, fp32, one element, recipe ``TensorWise``, ``NO_SWIZZLE``.

Hardware: cuBLASLt's block-scaled FP4 GEMM, on Blackwell. PyTorch checks the layouts but no architecture
for NVFP4 (only >= 8.9 for any scaled_mm) and runs its NVFP4 GEMM tests on compute capability 10.0 and
later, 12.x included (``format_registry.NVFP4_TORCH``). The GEMM has not run in this repository: the CPU
tests check operands, layouts and wiring against the emulated layer and torch's own layout helpers, and
tests/models/quant/test_nvfp4_torch_gpu.py (skipped below 10.0) compares the GEMMs with the emulated ones.

The forward quantizes X and W (Fprop) and keeps W's packed 16x16 codes, transposed, for Dgrad; the backward
quantizes dY and (1x16 weights) W^T for Dgrad, dY^T and X^T for Wgrad, from X and W saved in high precision:
the emulated layer's order of quantization and of random draws, its saved tensors, and its tensor-parallel
amax all-reduces in the same phase (the planner counts them there). The kernels write codes only
(``kernel_codes``: no scaled values), packed two a byte in each operand's own layout and zero-padded to a
reduction of a multiple of 32: dY^T and X^T from the columns kernel as [N, T / 2] and [K, T / 2], W's 16x16
codes and their transpose for Dgrad from one pass; no packing or transposing copy follows. The torch
reference's codes are packed by ``pack_codes``. The scale layout (16x16 tiles' scales repeated, padding, the
swizzle) is torch ops. Not done here: the scales are swizzled by a copy; W is quantized again every
micro-batch.

Under ``torch.compile`` the layer traces into its block's graph: the GEMM is a custom op opaque to Inductor
(``scaled_gemm``; Dynamo cannot trace ``torch._scaled_mm_v2``), and codes and scales travel as uint8, taking
their FP4 / FP8 dtypes inside the op only.

Tensor parallelism (``QuantizedLinear.set_tensor_parallel``): the GEMMs take the weight's local shard; an
operand the layer's ``amax_reduction`` names takes the group's amax, as in the emulated layer (the kernels' own
amax pass over the shard, ``kernels.nvfp4.local_amax``; the torch reference where the kernels do not run), so a
sharded layer's codes are the unsharded layer's. Where the emulated layer all-reduces each operand's amax
alone, this one stacks a phase's (Fprop's X and W; the backward's dY, W^T, dY^T, X^T) into one all-reduce
(``linear.phase_amaxes``): the same values, fewer calls. Under sequence parallelism the
layer also moves operands along the sequence quantized (the section "Quantize, then gather"): a column-parallel
layer given ``gather_input`` takes the rank's tokens and gathers X's codes (forward) and X^T's (backward),
reduce-scattering dX; a row-parallel one given ``scatter_output`` runs Fprop and the output's reduce-scatter a
sequence at a time (``sequence_gather.gemm_reduce_scatter``) and gathers dY's codes, then dY^T's (moving while
Dgrad runs), in the backward. The gathered codes are those of the gathered tensor, bit for bit.

Sources: TE ``core_nvfp4.cuh`` (the quantization); PyTorch ``aten/src/ATen/native/cuda/ScaledBlas.cpp``,
``torch/_meta_registrations.py``, ``test/test_scaled_matmul_cuda.py``,
``torch/testing/_internal/common_quantized.py`` (``to_blocked``, ``pack_uint4``); the cuBLAS documentation.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F

from models.norms import local_tensor
from models.quant import formats
from models.quant.element_formats import GEMMS
from models.quant.format_registry import NVFP4_TORCH
from models.quant.gemm_spec import GemmSpec, LinearSpec, OperandSpec, nvfp4_linear_spec
from models.quant.linear import (RoundingRng, amax_reduced, group_kernel_scales, kernel_for, operand_generator,
                                 operand_seed, phase_amaxes)
from models.quant.quantized_linear import (GATHERED_INPUT_OPERANDS, SCATTERED_OUTPUT_OPERANDS, TP_AMAX_OPERANDS,
                                           AmaxReduction, NativeQuantizedLinear, group_amax, high_precision_gemm,
                                           with_amax_rows)
from models.quant.nvfp4_layout import BLOCK, REDUCTION_MULTIPLE, Nvfp4Codes, Nvfp4Operand
from models.quant.rht import rht
from models.quant.sequence_gather import (check_gathered_share, gather_along_sequence, gather_sequence,
                                          gemm_reduce_scatter, launch_sequence_gather, reduce_scatter_along_sequence)

REQUIREMENT = f"torch.nn.functional.scaled_mm with NVFP4 recipes on a CUDA GPU of {NVFP4_TORCH.describe()}"


# ----------------------------------------------------------------------------------------------
# What this torch and this GPU can do


_ENUM_MEMBERS = {  # (enum, names it has had): torch 2.13 spells them BlockWise1x16; a Python Enum once Blockwise_1x16
    "block": ("ScalingType", ("BlockWise1x16", "Blockwise_1x16")),
    "tensor": ("ScalingType", ("TensorWise",)),
    "swizzled": ("SwizzleType", ("SWIZZLE_32_4_4",)),
    "plain": ("SwizzleType", ("NO_SWIZZLE",)),
}


def _member(kind: str):
    """The torch.nn.functional enum member of ``kind`` (None if torch lacks it)."""
    enum_name, names = _ENUM_MEMBERS[kind]
    enum = getattr(F, enum_name, None)
    for name in names:
        member = getattr(enum, name, None)
        if member is not None:
            return member
    return None


def has_nvfp4_scaled_mm() -> bool:
    """Whether torch has the scaled matmul with NVFP4 recipes (1x16 E4M3 block scales, swizzled)."""
    return (hasattr(F, "scaled_mm") and hasattr(torch, "float4_e2m1fn_x2")
            and all(_member(kind) is not None for kind in _ENUM_MEMBERS))


_CAPABILITY: Dict[int, Tuple[int, int]] = {}


def _capability(device: torch.device) -> Tuple[int, int]:
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _CAPABILITY:
        _CAPABILITY[index] = torch.cuda.get_device_capability(index)
    return _CAPABILITY[index]


def check_native_support(device: torch.device, name: str = "") -> None:
    """Raise RuntimeError (naming the layer) unless torch's NVFP4 GEMM can run on ``device``."""
    def where() -> str:  # formatted on failure only: torch.compile would guard on (recompile per) name
        return f"layer {name!r}: " if name else ""

    if not has_nvfp4_scaled_mm():
        raise RuntimeError(f"{where()}native NVFP4 GEMMs need {REQUIREMENT}; torch {torch.__version__} lacks that "
                           "scaled_mm. Use precision.backend=emulated")
    if device.type != "cuda":
        raise RuntimeError(f"{where()}native NVFP4 GEMMs need {REQUIREMENT}; the tensors are on {device}. "
                           "Use precision.backend=emulated")
    capability = _capability(device)
    if not NVFP4_TORCH.allows(capability):
        raise RuntimeError(f"{where()}torch runs the NVFP4 GEMM on {NVFP4_TORCH.describe()}; this GPU is "
                           f"{capability[0]}.{capability[1]}. Use precision.backend=emulated")


def check_operand(spec: OperandSpec, where: str = "") -> None:
    """ValueError (prefixed by ``where``) unless the operand is NVFP4 with E4M3 block scales."""
    if spec.fmt != "nvfp4":
        raise ValueError(f"{where}the native NVFP4 layer multiplies nvfp4 operands (E2M1 codes, E4M3 block scales, "
                         f"the block scales cuBLASLt takes), not {spec.fmt}; use precision.backend=emulated")


def check_spec(spec: LinearSpec, name: str = "") -> None:
    """Raise ValueError naming the layer, GEMM and operand unless every quantized GEMM runs natively."""
    labels = {"fprop": ("X", "W"), "dgrad": ("dY", "W^T"), "wgrad": ("dY^T", "X^T")}
    for gemm in GEMMS:
        gemm_spec: Optional[GemmSpec] = getattr(spec, gemm)
        if gemm_spec is None:
            continue
        for operand, label in zip((gemm_spec.a, gemm_spec.b), labels[gemm]):
            check_operand(operand, f"layer {name!r} ({gemm.capitalize()} {label}, {operand.describe()}): ")


# ----------------------------------------------------------------------------------------------
# Quantization: the emulated layer's quantizers, with the codes kept


def shared_scales(tensor: torch.Tensor, rows: Optional[OperandSpec], columns: Optional[OperandSpec]):
    """The global scales of a tensor quantized along rows and (with the RHT) along columns, from one read by
    the kernels (``kernels.nvfp4.shared_scales``), or None; the outputs are the same either way."""
    module = None if rows is None or columns is None else kernel_for(tensor, rows, False)
    return None if module is None else module.shared_scales(tensor, rows, columns)


def kernel_codes(module, tensor: torch.Tensor, spec: OperandSpec, *, transpose: bool, seed, generator,
                 scales: Optional[torch.Tensor], name: str, with_transpose: bool = False) -> Nvfp4Codes:
    """The operand quantized by the kernels' calls ``kernels.nvfp4.quantize_operand`` makes (the same codes,
    scales and draws), written as codes only: no scaled values, the codes packed by the kernel in the operand's
    own layout and zero-padded to the GEMM's multiple of 32 along the reduction, so neither a packing nor a
    transposing copy follows. ``with_transpose`` (16x16 tiles of the tensor itself): the same pass also writes
    the transposed operand's packed codes, which ``Nvfp4Codes.t`` takes (Dgrad's W^T from Fprop's W)."""
    common = dict(stochastic=spec.rounding == "stochastic", seed=seed, generator=generator, write_values=False,
                  packed_multiple=REDUCTION_MULTIPLE, name=name, four_over_six=spec.four_over_six, fmt=spec.fmt)
    if transpose and spec.tile == (1, BLOCK):  # 16x1 blocks down x's columns: codes in x^T's layout
        out = module.quantize_columns(tensor, rht=spec.rht, global_scales=scales, write_codes=True, **common)
        return Nvfp4Codes(out.codes, out.block_scales.view(torch.uint8).t(), out.decode_scale)
    two_d = spec.tile == (BLOCK, BLOCK)
    if transpose and not two_d:
        raise ValueError("only 16x16 tiles transpose: a 1x16 block is not a block of the transpose")
    out = module.quantize_rows(tensor, two_d=two_d, amax=None if scales is None else scales[2:],
                               write_codes=not transpose, transposed_codes=two_d and (transpose or with_transpose),
                               **common)
    scale_bytes = out.block_scales.view(torch.uint8)
    if transpose:  # a 16x16 tiling of the tensor itself, transposed
        return Nvfp4Codes(out.transposed_codes, scale_bytes.t(), out.decode_scale, BLOCK)
    return Nvfp4Codes(out.codes, scale_bytes, out.decode_scale, BLOCK if two_d else 1, out.transposed_codes)


def reference_codes(tensor: torch.Tensor, spec: OperandSpec, *, transpose: bool, generator=None, name: str,
                    amax_group=None, reduced: Optional[torch.Tensor] = None) -> Nvfp4Codes:
    """The operand quantized by the torch reference (``formats.quantize``) as QuantLinear's torch path does:
    a transposed operand as a view, the RHT first, Four Over Six's square tiles chosen on the tensor and then
    transposed, and with ``amax_group`` the group's amax (``with_amax_rows``; ``reduced``: already reduced)."""
    tile_then_transpose = transpose and spec.four_over_six is not None and spec.transpose_invariant
    matrix = tensor.t() if transpose and not tile_then_transpose else tensor
    if spec.rht:
        matrix = rht(matrix, name=name)
    rows = matrix.shape[0]
    if amax_group is not None:  # the group's amax (of the transformed values, as the format takes it)
        matrix = with_amax_rows(matrix, group_amax(matrix, amax_group) if reduced is None else reduced, spec.tile[0])
    quantized = formats.quantize(matrix, spec.fmt, tile=spec.tile, rounding=spec.rounding, generator=generator,
                                 name=name, four_over_six=spec.four_over_six)
    tile_rows = spec.tile[0]
    codes = Nvfp4Codes.from_codes(quantized.codes[:rows],
                                  quantized.block_scales.view(torch.uint8)[: rows // tile_rows],
                                  quantized.tensor_scale, tile_rows)
    return codes.t() if tile_then_transpose else codes


def quantize_operand(tensor: torch.Tensor, spec: OperandSpec, *, transpose: bool, rng: RoundingRng = None,
                     name: str, scales: Optional[torch.Tensor] = None,
                     amax: Optional[AmaxReduction] = None, with_transpose: bool = False,
                     reduced: Optional[Dict[str, torch.Tensor]] = None) -> Nvfp4Codes:
    """``tensor.t() if transpose else tensor`` quantized as ``linear._quantize_operand`` quantizes it.

    ``name`` ('Fprop X', ...) labels errors and offsets the seed; ``rng``: the layer's generator or seed
    tensor; ``scales``: ``shared_scales`` of the tensor; ``amax``: the tensor-parallel amax reduction;
    ``with_transpose``: ``.t()`` of the result will be wanted too (``kernel_codes``); ``reduced``: the phase's
    amaxes already reduced (``linear.phase_amaxes``), this operand's taken by name.
    """
    seeded = spec.rounding == "stochastic" and isinstance(rng, torch.Tensor)
    generator = rng if isinstance(rng, torch.Generator) else None
    reduce_amax = amax is not None and amax.applies(name, spec.fmt)
    given = (reduced or {}).get(name)
    module = kernel_for(tensor, spec, transpose)
    if reduce_amax and module is not None:  # the kernels' own amax pass, reduced over the group
        scales = group_kernel_scales(module, tensor, spec, transpose, amax, given)
        module = module if scales is not None else None
    if module is not None:
        return kernel_codes(module, tensor, spec, transpose=transpose, seed=operand_seed(rng, name) if seeded else None,
                            generator=generator, scales=scales, name=name, with_transpose=with_transpose)
    if seeded:
        generator = operand_generator(rng, name)
    return reference_codes(tensor, spec, transpose=transpose, generator=generator, name=name,
                           amax_group=amax.group if reduce_amax else None, reduced=given)


# ----------------------------------------------------------------------------------------------
# The GEMM


def nvfp4_gemm(a: Nvfp4Operand, b: Nvfp4Operand, out_dtype: torch.dtype) -> torch.Tensor:
    """a [m, R] times b [n, R]^T -> [m, n] in out_dtype: one native NVFP4 GEMM with both tensor scales."""
    if a.data.shape[1] != b.data.shape[1] or a.reduction != b.reduction:  # 48 and 64 both pack to 32 bytes
        raise ValueError(f"nvfp4_gemm: reduction dims differ: a {a.reduction} ({list(a.data.shape)} packed), "
                         f"b {b.reduction} ({list(b.data.shape)} packed)")
    # Eager calls skip the custom op's dispatch; compiled ones need it.
    gemm = scaled_gemm if torch.compiler.is_compiling() else _torch_scaled_gemm
    return gemm(a.data, b.data, a.scale, b.scale, a.decode, b.decode, out_dtype)


_EXACT_STRIDES = getattr(torch._C.Tag, "needs_exact_strides", torch._C.Tag.needs_fixed_stride_order)


def _torch_scaled_gemm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                       decode_a: torch.Tensor, decode_b: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """a [m, R/2] times b [n, R/2]^T (packed uint8, row-major) -> [m, n]: torch's two-level NVFP4 GEMM."""
    fp4, e4m3 = torch.float4_e2m1fn_x2, torch.float8_e4m3fn
    recipe = [_member("block"), _member("tensor")]
    swizzle = [_member("swizzled"), _member("plain")]
    return F.scaled_mm(a.view(fp4), b.view(fp4).t(), [scale_a.view(e4m3), decode_a], recipe,
                       [scale_b.view(e4m3), decode_b], recipe, swizzle_a=swizzle, swizzle_b=swizzle,
                       output_dtype=out_dtype)


@torch.library.custom_op("hybrid_quant::nvfp4_scaled_gemm", mutates_args=(), tags=(_EXACT_STRIDES,))
def scaled_gemm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                decode_a: torch.Tensor, decode_b: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """``_torch_scaled_gemm`` as one op that torch.compile records without looking inside."""
    return _torch_scaled_gemm(a, b, scale_a, scale_b, decode_a, decode_b, out_dtype)


@scaled_gemm.register_fake
def _scaled_gemm_fake(a, b, scale_a, scale_b, decode_a, decode_b, out_dtype):
    """On fake tensors torch's own meta function runs: it checks the operand and scale layouts and gives the
    output's shape and strides. Its message prints no strides; this one does."""
    try:
        return _torch_scaled_gemm(a, b, scale_a, scale_b, decode_a, decode_b, out_dtype)
    except RuntimeError as error:
        if type(error) is not RuntimeError:  # fake-tensor and Dynamo subclasses keep their type
            raise
        layouts = ", ".join(f"{label} {tuple(t.shape)} strides {t.stride()} {t.dtype}" for label, t in
                            (("a", a), ("b", b), ("scale_a", scale_a), ("scale_b", scale_b)))
        raise RuntimeError(f"nvfp4_scaled_gemm traced with {layouts}: {error}") from error



# ----------------------------------------------------------------------------------------------
# Quantize, then gather: operands along the sequence (models.quant.sequence_gather moves them)


def gathered_rows_operand(x2: torch.Tensor, spec: OperandSpec, batch: int, group, **quantize) -> Nvfp4Codes:
    """Fprop's X [B T, K] from the rank's x2 [B t, K]: quantized here (the group's amax), gathered as codes."""
    codes = quantize_operand(x2, spec, transpose=False, **quantize)
    (data, scales), _ = gather_sequence((codes.data, codes.scales), (), batch, group)
    return Nvfp4Codes(data, scales, codes.decode)


def launch_gathered_columns_operand(x2: torch.Tensor, spec: OperandSpec, batch: int, group, **quantize):
    """Wgrad's X^T [K, B T] from the rank's x2 [B t, K]: quantized here along its tokens (the group's amax; the
    RHT's 16-blocks lie within the share), its codes' gather issued; the returned function waits for it and
    gives the operand. The kernels pad the rank's tokens to a multiple of 32 with zero codes: the padding is
    dropped before the gather, the whole padded again by ``operand``."""
    codes = quantize_operand(x2, spec, transpose=True, **quantize)
    pending = launch_sequence_gather((), (codes.data[:, : x2.shape[0] // 2], codes.scales), batch, group)

    def operand() -> Nvfp4Operand:
        _, (data, scales) = pending()
        return Nvfp4Codes(data, scales, codes.decode).operand()

    return operand


def gathered_gradient_operands(dy: torch.Tensor, dgrad: OperandSpec, wgrad: OperandSpec, batch: int, group,
                               **quantize):
    """Dgrad's dY [B T, N] and Wgrad's dY^T [N, B T] from the rank's dy [B t, N] (a row-parallel layer that
    reduce-scatters its output): both quantized here with the group's amax, their gathers issued one after the
    other. Returns (dY, a function giving dY^T): dY^T's gather moves while Dgrad runs."""
    rows = quantize_operand(dy, dgrad, transpose=False, name="Dgrad dY", **quantize)
    columns = quantize_operand(dy, wgrad, transpose=True, name="Wgrad dY^T", **quantize)
    pending_rows = launch_sequence_gather((rows.data, rows.scales), (), batch, group)
    pending_columns = launch_sequence_gather((), (columns.data[:, : dy.shape[0] // 2], columns.scales), batch, group)
    (row_data, row_scales), _ = pending_rows()

    def columns_operand() -> Nvfp4Operand:
        _, (column_data, column_scales) = pending_columns()
        return Nvfp4Codes(column_data, column_scales, columns.decode).operand()

    return Nvfp4Codes(row_data, row_scales, rows.decode).operand(), columns_operand




# ----------------------------------------------------------------------------------------------
# The layer


class _TorchNvfp4LinearFunction(torch.autograd.Function):
    """Y = X W^T with the quantized GEMMs native; high-precision GEMMs as the emulated path runs them."""

    @staticmethod
    def forward(ctx, x, weight, spec: LinearSpec, rng: RoundingRng, compute_dtype: torch.dtype, grad_enabled: bool,
                amax: Optional[AmaxReduction] = None, gather=None, scatter=None):
        # gather: the tp group when x is the rank's share [B, t, K] of a sequence-parallel input, gathered here
        # as codes (Fprop X) and in the backward as X^T's codes; dX is reduce-scattered back to [B, t, K].
        # scatter: the tp group when the output's partial sums [B, T, N] are reduce-scattered here to the rank's
        # [B, t, N], a sequence at a time; the backward gathers dY and dY^T as codes.
        x2 = x.reshape(-1, x.shape[-1])  # [T, K] (gather: the rank's B t tokens)
        batch = x.shape[0] if gather is not None or scatter is not None else 1
        needs_dgrad = grad_enabled and ctx.needs_input_grad[0]
        needs_wgrad = grad_enabled and ctx.needs_input_grad[1]
        dgrad = spec.dgrad if needs_dgrad else None
        wgrad = spec.wgrad if needs_wgrad else None
        # Autocast is off here (QuantizedLinear.forward); no context of its own (fp8_torch says why).
        # X's global scales for Fprop and Wgrad from one read, when the kernels take both.
        x_scales = None
        if spec.fprop is not None and wgrad is not None and not amax_reduced(amax, "Fprop X", "Wgrad X^T"):
            x_scales = shared_scales(x2, spec.fprop.a, wgrad.b)
        w_t_op = None
        if spec.fprop is None and scatter is not None:
            out = gemm_reduce_scatter(lambda start, rows: high_precision_gemm(x2[start:start + rows], weight,
                                                                              compute_dtype), x2.shape[0], batch, scatter)
        elif spec.fprop is None:
            out = high_precision_gemm(x2 if gather is None else gather_along_sequence(x, gather), weight, compute_dtype)
        else:
            # Under tp, X's and W's amaxes from one all-reduce (those the group's amax applies to).
            gathered_w = hasattr(weight, "nvfp4_codes")  # FSDP2 gathered W's codes (trainer.nvfp4_weight_gather)
            reduced = phase_amaxes((("Fprop X", x2, spec.fprop.a, False),
                                    ("Fprop W", weight, None if gathered_w else spec.fprop.b, False)), amax)
            if gather is None:
                x_codes = quantize_operand(x2, spec.fprop.a, transpose=False, rng=rng, name="Fprop X",
                                           scales=x_scales, amax=amax, reduced=reduced)
            else:
                x_codes = gathered_rows_operand(x2, spec.fprop.a, batch, gather, rng=rng, name="Fprop X", amax=amax,
                                                reduced=reduced)
            reuse_w = dgrad is not None and spec.reuses_forward_weight  # Dgrad's W^T: these 16x16 codes transposed
            if gathered_w:
                w_codes = weight.nvfp4_codes()
            else:
                w_codes = quantize_operand(weight, spec.fprop.b, transpose=False, rng=rng, name="Fprop W", amax=amax,
                                           with_transpose=reuse_w, reduced=reduced)
            w_op = w_codes.operand()
            if scatter is None:
                out = nvfp4_gemm(x_codes.operand(), w_op, compute_dtype)
            else:  # [B, t, N]: the GEMM and its reduce-scatter a sequence at a time
                out = gemm_reduce_scatter(lambda start, rows: nvfp4_gemm(x_codes.row_slice(start, rows).operand(),
                                                                         w_op, compute_dtype),
                                          x2.shape[0], batch, scatter)
            if reuse_w:
                w_t_op = w_codes.t().operand()
        ctx.spec, ctx.compute_dtype, ctx.amax, ctx.gather, ctx.batch = spec, compute_dtype, amax, gather, batch
        ctx.scatter = scatter
        ctx.seed_saved = isinstance(rng, torch.Tensor)  # a seed tensor is saved (compile traces it)
        ctx.generator = None if ctx.seed_saved else rng
        ctx.x_shape, ctx.x_dtype = x.shape, x.dtype
        ctx.needs = (needs_dgrad, needs_wgrad)
        # X and W in high precision, as the emulated layer keeps them: the backward quantizes W^T (1x16 weights)
        # and X^T there, with their amax all-reduces where the emulated layer (and the planner) has them.
        ctx.save_for_backward(
            x2 if needs_wgrad else None, weight,
            *((w_t_op.data, w_t_op.scale, w_t_op.decode) if w_t_op is not None else (None,) * 3),
            x_scales, rng if ctx.seed_saved else None,
        )
        if scatter is not None:  # the rank's [B, t, N] of the partial sums' sum
            return out
        return out.reshape(*x.shape[:-2], -1, weight.shape[0])

    @staticmethod
    def backward(ctx, grad_output):
        x2, weight, w_t_data, w_t_scale, w_t_decode, x_scales, seed = ctx.saved_tensors
        spec: LinearSpec = ctx.spec
        compute_dtype, amax, gather = ctx.compute_dtype, ctx.amax, ctx.gather
        rng = seed if ctx.seed_saved else ctx.generator
        needs_dgrad, needs_wgrad = ctx.needs
        dgrad = spec.dgrad if needs_dgrad else None
        wgrad = spec.wgrad if needs_wgrad else None
        dy = grad_output.reshape(-1, grad_output.shape[-1])  # [T, N] (scatter: the rank's B t tokens)
        grad_x = grad_weight = None
        dy_op = pending_dy_t = None
        # Under tp, the backward's amaxes from one all-reduce (dY, W^T quantized again, dY^T, X^T: those the
        # group's amax applies to).
        reduced = phase_amaxes((("Dgrad dY", dy, dgrad.a if dgrad is not None else None, False),
                                ("Dgrad W^T", weight, dgrad.b if dgrad is not None and w_t_data is None else None, True),
                                ("Wgrad dY^T", dy, wgrad.a if wgrad is not None else None, True),
                                ("Wgrad X^T", x2, wgrad.b if wgrad is not None else None, True)), amax)
        if ctx.scatter is not None:
            if dgrad is not None and wgrad is not None:  # both quantized here, gathered as codes
                dy_op, pending_dy_t = gathered_gradient_operands(dy, dgrad.a, wgrad.a, ctx.batch, ctx.scatter,
                                                                 rng=rng, amax=amax, reduced=reduced)
            else:  # a GEMM in high precision takes the whole dY: gathered as it is
                dy = gather_along_sequence(grad_output, ctx.scatter)
        # The backward may run under the caller's autocast (torch.compile traces it under the forward's): the
        # GEMM is an opaque op, high_precision_gemm switches autocast off, the quantizers choose their dtypes.
        dy_scales = None
        if dgrad is not None and wgrad is not None and not amax_reduced(amax, "Dgrad dY", "Wgrad dY^T"):
            dy_scales = shared_scales(dy, dgrad.a, wgrad.a)
        # The emulated layer's order of quantization (and so of draws): dY, W^T, then dY^T, X^T. A layer that
        # gathers X quantizes X^T first and gathers its codes while Dgrad runs, then reduce-scatters dX while
        # Wgrad runs (each collective waited for only when its result is needed).
        pending_x_t = pending_grad_x = None
        if gather is not None and wgrad is not None:
            pending_x_t = launch_gathered_columns_operand(x2, wgrad.b, ctx.batch, gather, rng=rng, name="Wgrad X^T",
                                                          amax=amax, reduced=reduced)
        if needs_dgrad:
            if dgrad is None:
                grad_x = high_precision_gemm(dy, weight.t(), compute_dtype)
            else:
                if dy_op is None:
                    dy_op = quantize_operand(dy, dgrad.a, transpose=False, rng=rng, name="Dgrad dY", scales=dy_scales,
                                             amax=amax, reduced=reduced).operand()
                if w_t_data is not None:
                    w_t_op = Nvfp4Operand(w_t_data, w_t_scale, w_t_decode, dy.shape[1])
                else:  # W^T [K, N] quantized along N from the high-precision W
                    w_t_op = quantize_operand(weight, dgrad.b, transpose=True, rng=rng, name="Dgrad W^T",
                                              amax=amax, reduced=reduced).operand()
                grad_x = nvfp4_gemm(dy_op, w_t_op, compute_dtype)
            grad_x = grad_x.to(ctx.x_dtype)
            if gather is not None:  # [B T, K] partial sums of every token -> the rank's [B, t, K] of their sum
                pending_grad_x = reduce_scatter_along_sequence(grad_x, ctx.batch, gather)
            else:
                grad_x = grad_x.reshape(ctx.x_shape)
        if needs_wgrad:
            if wgrad is None:
                x_all = x2 if gather is None else gather_along_sequence(x2.reshape(ctx.batch, -1, x2.shape[-1]), gather)
                grad_weight = high_precision_gemm(dy.t(), x_all.t(), compute_dtype)
            else:
                if pending_dy_t is not None:
                    dy_t_op = pending_dy_t()
                else:
                    dy_t_op = quantize_operand(dy, wgrad.a, transpose=True, rng=rng, name="Wgrad dY^T",
                                               scales=dy_scales, amax=amax, reduced=reduced).operand()
                if pending_x_t is None:
                    x_t_op = quantize_operand(x2, wgrad.b, transpose=True, rng=rng, name="Wgrad X^T", scales=x_scales,
                                              amax=amax, reduced=reduced).operand()
                else:
                    x_t_op = pending_x_t()
                grad_weight = nvfp4_gemm(dy_t_op, x_t_op, compute_dtype)
            grad_weight = grad_weight.to(weight.dtype)
        if pending_grad_x is not None:
            grad_x = funcol.wait_tensor(pending_grad_x).reshape(ctx.x_shape)
        return grad_x, grad_weight, None, None, None, None, None, None, None


class TorchNvfp4Linear(NativeQuantizedLinear):
    """The native NVFP4 backend: quantized GEMMs as NVFP4 GEMMs (same parameters and state-dict keys).

    ``spec`` is the emulated path's LinearSpec (``nvfp4_linear_spec``, Four Over Six included; its ``backend``
    field is not read), checked on assignment (``check_spec``); a GEMM set to None runs in the compute dtype.
    Stochastic rounding draws as ``QuantLinear`` draws (``rounding_rng``).
    """

    merges_phase_amaxes = True
    """Under tp, a phase's amaxes (Fprop's X and W; the backward's dY, W^T, dY^T, X^T) take one all-reduce
    (``linear.phase_amaxes``)."""
    sequence_group = None
    """The tp group when the layer gathers its sequence-parallel input itself, quantized (``gather_input``)."""
    scatter_group = None
    """The tp group when the layer reduce-scatters its output itself (``scatter_output``)."""

    def default_spec(self) -> LinearSpec:
        return nvfp4_linear_spec()

    check_spec = staticmethod(check_spec)

    def gather_input(self, group) -> None:
        """Take the rank's share [B, t, K] of a sequence-parallel input and gather it here, quantized (the section
        "Quantize, then gather" above): a column-parallel layer (``set_tensor_parallel('column', ...)`` first),
        whose X and X^T then take the group's amax too. A GEMM the spec keeps in high precision gathers X in the
        compute dtype; the output's rows are every token's, as with the gather before the layer."""
        self._add_group_amax("column", GATHERED_INPUT_OPERANDS, "gathers its input")
        self.sequence_group = group

    def scatter_output(self, group) -> None:
        """Reduce-scatter the output's partial sums along the sequence here, to the rank's [B, t, N], and gather
        the output's gradient in the backward as codes: a row-parallel layer (``set_tensor_parallel('row',
        ...)`` first) whose Dgrad and Wgrad are NVFP4; dY and dY^T then take the group's amax too."""
        self._add_group_amax("row", SCATTERED_OUTPUT_OPERANDS, "scatters its output")
        self.scatter_group = group

    @property
    def moves_sequence(self) -> bool:
        return self.sequence_group is not None or self.scatter_group is not None

    def _add_group_amax(self, role: str, operands: frozenset, what: str) -> None:
        """``operands`` take the group's amax as well: only once, on a layer set_tensor_parallel made ``role``."""
        reduction = self.amax_reduction
        if reduction is None or reduction.operands != TP_AMAX_OPERANDS[role]:
            raise ValueError(f"layer {self.name!r}: only a {role}-parallel layer {what}, once "
                             f"(set_tensor_parallel({role!r}, ...) first)")
        self.amax_reduction = AmaxReduction(reduction.group, reduction.operands | operands)

    def check_input(self, x: torch.Tensor) -> None:
        super().check_input(x)
        # torch's scaled_mm takes B's rows, the output's columns, in multiples of 16 (the reduction is padded).
        in_features, out_features = self.local_features()
        columns = {"fprop": ("out_features", out_features), "dgrad": ("in_features", in_features),
                   "wgrad": ("in_features", in_features)}
        running = self.gemms_to_check(x)
        if self.sequence_group is not None:
            check_gathered_share(x, self.name, 1)
        if self.scatter_group is not None:
            check_gathered_share(x, self.name, self.scatter_group.size())
        for gemm in GEMMS:
            dim_name, size = columns[gemm]
            if getattr(running, gemm) is not None and size % BLOCK:
                raise ValueError(f"layer {self.name!r} ({gemm.capitalize()}, nvfp4): {dim_name} {size} is not a "
                                 "multiple of 16, which torch's scaled_mm needs of the output's columns; nothing is "
                                 "padded")

    def quantized_matmul(self, x: torch.Tensor, compute_dtype: torch.dtype) -> torch.Tensor:
        # Traceable by Dynamo inside compiled blocks: the kernels trace as in QuantLinear, the GEMM is an op.
        check_native_support(x.device, self.name)
        return _TorchNvfp4LinearFunction.apply(x, local_tensor(self.weight), self.spec, self.rounding_rng(),
                                               compute_dtype, torch.is_grad_enabled(), self.amax_reduction,
                                               self.sequence_group, self.scatter_group)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, native NVFP4"
