"""The emulated quantized linear layer (QuantLinear): Y = X W^T with each GEMM quantized as a LinearSpec says.

The three GEMMs of a linear layer (T tokens = flattened leading dims, K in_features, N out_features),
each written as A B^T with both operands blocked along the reduction dim:

    Fprop  Y  [T, N] = X   [T, K] . W   [N, K]^T      reduction over K
    Dgrad  dX [T, K] = dY  [T, N] . W^T [K, N]^T      reduction over N
    Wgrad  dW [N, K] = dY^T[N, T] . X^T [K, T]^T      reduction over T (tokens)

The NVFP4 recipe of the paper (TE ``NVFP4BlockScaling``; ``nvfp4_linear_spec()``):
Fprop X 1x16 RNE, W 16x16 RNE; Dgrad dY 1x16 stochastic, W the very same quantized W as Fprop
(saved from the forward, never re-quantized: a 16x16 tile is the same tile of W^T); Wgrad dY^T
1x16 along tokens stochastic with RHT, X^T 1x16 along tokens RNE with RHT. With ``weight_2d=False``
Dgrad re-quantizes W^T (1x16 along N) from the high-precision W, as TE does; every orientation an
operand needs is quantized from the high-precision tensor, never from a quantized one.

Emulated GEMM (backend "emulated"):
- fp32 compute: both operands fully dequantized in fp32, x_hat = (q * s_b) * S_dec, and multiplied
  in fp32 (``a_hat @ b_hat.T``).
- bf16/fp16 compute: the scaled values q * s_b (exact in bf16) are multiplied with fp32
  accumulation, the fp32 result is multiplied by (S_dec_a * S_dec_b), then cast. Formats whose
  scaled values are not exact in bf16 (fp8_block without power-of-two scales) take the fp32 path
  for that GEMM and cast the result.
The operands come from ``formats.quantize_scaled_values`` (the values q * s_b, rounded without
building element codes; bit for bit ``formats.quantize(...).scaled_values()``). A transposed
operand (W^T, dY^T, X^T) is quantized as a view in its storage's memory order, never copied.
The compute dtype is the autocast dtype when autocast is on, else the input's dtype. The output is
in the compute dtype; dX comes back in the input's dtype, dW in the weight's dtype (FP32 master
weights stay FP32; W is quantized from them directly).

Stochastic rounding draws from the layer's ``rounding_rng()``: a torch.Generator when one is set
(in the backward, Dgrad's dY draws before Wgrad's dY^T), else the device seed tensor the trainer
writes every micro-batch (``QuantizedLinear.sr_seed``), offset per operand by the CRC-32 of the
operand's name ('Dgrad dY', 'Wgrad dY^T', ...) so no two operands of a layer share draws, else
torch's global RNG. The seed tensor enters torch.compile and CUDA graphs as a plain input; the
torch path turns it into a Generator (one host read, eager code only). On CUDA with Triton an
operand whose element format names a kernel module (``FormatSpec.quantize_kernel``: NVFP4, MXFP4) goes
through that module of ``models.quant.kernels`` (bit-identical for RNE; Philox keyed by the seed),
unless ``models.quant.kernels.use_triton(False)``; the layer holds no format's name.

Shapes are checked in the forward, so a layer that does not divide its blocks fails at once, with
an error naming the layer, the GEMM, the operand and the dim. Nothing is padded.

Tensor parallelism (``QuantizedLinear.set_tensor_parallel``): the GEMMs run on the local shard of the
weight; an operand the layer's ``amax_reduction`` names, in a format with a per-tensor scale, is
quantized with the group's amax (taken after the RHT when there is one) and so exactly as the
unsharded layer quantizes that slice: on CUDA the kernels' own amax pass over the shard, reduced over
the group (``quantized_linear.all_reduce_amax``), goes to the quantize kernel as its precomputed scales
(``kernels.nvfp4.group_scales``); the torch reference (``quantized_linear.group_amax``) takes the rest
(the CPU, FP8 per tensor, NVFP4 columns without the RHT).
"""

from __future__ import annotations

import functools

import zlib
from dataclasses import dataclass
from typing import Optional, Tuple, Union

import torch

from models.norms import local_tensor
from models.quant import formats
from models.quant.bf16_rounding import round_to_bf16_by_bits
from models.quant.format_registry import quantize_kernel
from models.quant.gemm_spec import GemmSpec, LinearSpec, OperandSpec
from models.quant.quantized_linear import (AmaxReduction, QuantizedLinear, abs_max, all_reduce_amax, group_amax,
                                           high_precision_gemm, with_amax_rows)
from models.quant.rht import rht

# ----------------------------------------------------------------------------------------------
# Emulated GEMMs


@dataclass
class _Operand:
    """A quantized GEMM operand [rows, reduction].

    values: q * s_b in the compute dtype (per-tensor decode scale still to apply, ``decode``), or,
    when ``decode`` is None, the fully dequantized values (fp32 path) or scaled values of a format
    without a per-tensor scale.
    """

    values: torch.Tensor
    decode: Optional[torch.Tensor]

    def dequantized_fp32(self) -> torch.Tensor:
        values = self.values.float()
        return values if self.decode is None else values * self.decode


def _kernel_family(tensor: torch.Tensor, spec: OperandSpec):
    """The ``models.quant.kernels`` module the registry names for the operand's format, or None (no
    kernel for the format, or not a CUDA tensor)."""
    family = quantize_kernel(spec.fmt)
    if family is None or not tensor.is_cuda:
        return None
    from models.quant import kernels  # imported here: no Triton import on CPU-only runs

    return getattr(kernels, family)


def kernel_for(tensor: torch.Tensor, spec: OperandSpec, transpose: bool):
    """The kernel module that quantizes the operand ``tensor.t() if transpose else tensor``, or None
    (the torch reference runs)."""
    family = _kernel_family(tensor, spec)
    if family is None or not family.operand_supported(tensor, spec, transpose):
        return None
    return family


def _shared_scales(tensor: torch.Tensor, rows_spec: Optional[OperandSpec],
                   columns_spec: Optional[OperandSpec]) -> Optional[torch.Tensor]:
    """What the kernels of a tensor quantized in both orientations (X: Fprop and Wgrad; dY: Dgrad and
    Wgrad) can share between the two calls from one read (NVFP4: the global scales of both), or
    None; the outputs are the same either way."""
    if rows_spec is None or columns_spec is None:
        return None
    family = _kernel_family(tensor, rows_spec)
    if family is None or _kernel_family(tensor, columns_spec) is not family:
        return None
    return family.shared_scales(tensor, rows_spec, columns_spec)


def group_kernel_scales(family, tensor: torch.Tensor, spec: OperandSpec, transpose: bool,
                        amax: AmaxReduction, reduced: Optional[torch.Tensor] = None) -> Optional[torch.Tensor]:
    """The kernels' ``scales`` for an operand whose per-tensor amax is the tensor-parallel group's
    (``family.group_scales``), or None where the family takes none: the torch reference then quantizes it.
    ``reduced``: the group's amax already reduced (``family.scales_from_amax``: no amax pass here)."""
    if getattr(family, "group_scales", None) is None:
        return None
    if reduced is not None:  # a family without the two steps: the torch reference (phase_amaxes took its amax)
        scales_from_amax = getattr(family, "scales_from_amax", None)
        return None if scales_from_amax is None else scales_from_amax(reduced, spec, transpose)
    return family.group_scales(tensor, spec, transpose, functools.partial(all_reduce_amax, group=amax.group))


def phase_amaxes(operands, amax: Optional[AmaxReduction]) -> dict:
    """The group's amax of each operand of one phase that takes it (``amax.applies``), from one all-reduce of
    their local amaxes stacked, in place of one all-reduce each: name -> fp32 [1], for ``quantize_operand``'s
    ``reduced``. ``operands``: (name, tensor, spec, transpose), spec None for a GEMM in high precision. Each
    local amax is the one its quantizer would reduce: the kernels' pass (``family.local_amax``: of the RHT'd
    values for Wgrad's columns) where they take the group's scales, else the torch reference's, of the values
    after the RHT."""
    if amax is None:
        return {}
    names, local = [], []
    for name, tensor, spec, transpose in operands:
        if spec is None or not amax.applies(name, spec.fmt):
            continue
        family = kernel_for(tensor, spec, transpose)
        value = family.local_amax(tensor, spec, transpose) if hasattr(family, "local_amax") else None
        if value is None:
            matrix = tensor.t() if transpose else tensor
            value = abs_max(rht(matrix, name=name) if spec.rht else matrix)
        names.append(name)
        local.append(value.reshape(1).float())
    if not names:
        return {}
    reduced = all_reduce_amax(torch.cat(local), amax.group)
    return {name: reduced[index:index + 1] for index, name in enumerate(names)}


def _scaled_values_exact(spec: OperandSpec, compute_dtype: torch.dtype) -> bool:
    """Whether the GEMM can run on scaled values q * s_b in the (16-bit) compute dtype."""
    # fp32 compute multiplies fully dequantized operands
    return compute_dtype != torch.float32 and spec.scaled_values_exact_in(compute_dtype)


RoundingRng = Union[torch.Generator, torch.Tensor, None]
"""A torch.Generator, an int64 [1] seed tensor (QuantizedLinear.sr_seed), or None (global RNG)."""


OPERAND_NAMES = ("Fprop X", "Fprop W", "Dgrad dY", "Dgrad W^T", "Wgrad dY^T", "Wgrad X^T")
OPERAND_SEED_OFFSETS = {name: zlib.crc32(name.encode()) for name in OPERAND_NAMES}
"""Each operand's constant seed offset, computed at import: torch.compile reads a constant dict
where a call of zlib.crc32 (C code Dynamo cannot trace) would break the graph. A new operand name
needs its entry (a KeyError says so)."""


def operand_seed(seed: torch.Tensor, name: str) -> torch.Tensor:
    """The layer's seed tensor offset by a constant of the operand ('Dgrad dY', ...): its own draws.
    The seed is below 2^62 and the offset below 2^32, so the sum stays a positive int64."""
    return seed + OPERAND_SEED_OFFSETS[name]


def operand_generator(seed: torch.Tensor, name: str) -> torch.Generator:
    """A Generator on the seed's device seeded with the operand's seed, for the torch quantizer
    (one host read: the torch path is the eager reference, not the compiled fast path)."""
    generator = torch.Generator(device=seed.device)
    generator.manual_seed(int(operand_seed(seed, name).item()))
    return generator


def _quantize_operand(
    tensor: torch.Tensor,
    spec: OperandSpec,
    *,
    transpose: bool,
    compute_dtype: torch.dtype,
    rng: RoundingRng,
    name: str,
    shared_scales: Optional[torch.Tensor] = None,
    amax: Optional[AmaxReduction] = None,
) -> _Operand:
    """Quantize the operand matrix ``tensor.t() if transpose else tensor`` along its last dim.

    ``name`` labels the operand in errors ('Fprop X', ...): a constant, so torch.compile does not
    specialize on the layer (the layer's own checks, which name it, ran in the forward).
    ``shared_scales``: ``_shared_scales(tensor, ...)``, taken by the kernels instead of a pass of their own.
    ``amax``: the layer's tensor-parallel amax reduction; when it applies to this operand, the per-tensor
    scale comes from the group's amax (the torch path, module docstring).
    """
    exact = _scaled_values_exact(spec, compute_dtype)
    values_dtype = compute_dtype if exact else torch.float32
    seeded = spec.rounding == "stochastic" and isinstance(rng, torch.Tensor)
    generator = rng if isinstance(rng, torch.Generator) else None
    reduce_amax = amax is not None and amax.applies(name, spec.fmt)
    family = kernel_for(tensor, spec, transpose)
    if reduce_amax and family is not None:  # the kernels' own amax pass, reduced over the group
        shared_scales = group_kernel_scales(family, tensor, spec, transpose, amax)
        family = family if shared_scales is not None else None
    if family is not None:
        seed = operand_seed(rng, name) if seeded else None
        values, decode = family.quantize_operand(tensor, spec, transpose=transpose, seed=seed, generator=generator,
                                                 out_dtype=values_dtype, scales=shared_scales, name=name)
    else:
        # A transposed operand stays a view of the tensor's storage: the RHT and the quantizer
        # keep its memory order, and the GEMM takes it as a transposed matrix (no copies). A square
        # tile with Four Over Six is chosen on the tensor itself and transposed after, as the kernels
        # and TE do (OperandSpec.transpose_invariant).
        tile_then_transpose = transpose and spec.four_over_six is not None and spec.transpose_invariant
        matrix = tensor.t() if transpose and not tile_then_transpose else tensor
        if seeded:
            generator = operand_generator(rng, name)
        if spec.rht:
            matrix = rht(matrix, name=name)
        rows = matrix.shape[0]
        if reduce_amax:  # the group's amax (of the transformed values, as the format would take it)
            matrix = with_amax_rows(matrix, group_amax(matrix, amax.group), spec.tile[0] if spec.tile else 1)
        # The values q * s_b only (no element codes): bit for bit quantize(...).scaled_values().
        values, decode = formats.quantize_scaled_values(
            matrix,
            spec.fmt,
            tile=spec.tile,
            rounding=spec.rounding,
            generator=generator,
            power_of_two_scales=spec.power_of_two_scales,
            name=name,
            dtype=values_dtype,
            four_over_six=spec.four_over_six,
        )
        if reduce_amax:
            values = values[:rows]
        if tile_then_transpose:
            values = values.t()
    if not exact and decode is not None:
        values, decode = values.mul_(decode), None  # (q * s_b) * S_dec: the full fp32 dequantization
    return _Operand(values, decode)


MM_HAS_OUT_DTYPE = hasattr(torch.ops.aten.mm, "dtype")
"""Whether this torch has ``torch.mm(a, b, out_dtype=...)`` (CUDA kernels only). Decided once at
import: a flag set on first use is a global mutation, which makes torch.compile break the graph at
every quantized linear (the H200 study-size step then spent 150 of 184 ms with the GPU idle)."""


def _matmul_fp32_accumulate(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b for bf16/fp16 inputs with an fp32 result (the products are exact; fp32 accumulation)."""
    with torch.autocast(a.device.type, enabled=False):  # see _gemm
        if a.is_cuda and MM_HAS_OUT_DTYPE:
            return torch.mm(a, b, out_dtype=torch.float32)
        return a.float() @ b.float()


def _gemm(a: _Operand, b: _Operand, compute_dtype: torch.dtype,
          result_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """a [M, R] times b [N, R]^T -> [M, N] rounded to the compute dtype, returned in ``result_dtype``
    (default: the compute dtype; Wgrad asks for the weight's dtype)."""
    result_dtype = result_dtype or compute_dtype
    if compute_dtype == torch.float32 or a.values.dtype == torch.float32 or b.values.dtype == torch.float32:
        # Autocast off around each GEMM: the GEMMs pick their dtypes themselves, which autocast
        # would recast to bf16. The forward already runs with autocast off (quantized_linear.
        # autocast_off), but torch.compile traces the backward under the forward's autocast. Not
        # around the whole backward: the quantizers branch on the gradient's strides, and Dynamo
        # then left autocast off for the rest of the block. tests/trainer/test_compile.py checks
        # both (logits and gradients against eager).
        with torch.autocast(a.values.device.type, enabled=False):
            out = a.dequantized_fp32() @ b.dequantized_fp32().t()
        return out.to(compute_dtype).to(result_dtype)
    out = _matmul_fp32_accumulate(a.values, b.values.t())
    decodes = [scale for scale in (a.decode, b.decode) if scale is not None]
    # Under torch.compile a bf16 result is left to plain torch ops, which Inductor fuses into the
    # kernel that consumes it (the activation, the residual add, the gradient's next op) instead of a
    # separate pass writing a bf16 copy; Wgrad's FP32 result keeps the kernel, which writes in place.
    traced = torch.compiler.is_compiling() and result_dtype == compute_dtype == torch.bfloat16
    if _use_epilogue_kernel(out, compute_dtype, result_dtype) and not traced:
        from models.quant.kernels import epilogue

        # One vectorized pass, the decode scales (none for MX formats) multiplied inside it; the
        # FP32 Wgrad is written in place over the fp32 GEMM output.
        return epilogue.scale_gemm_output(out, decodes[0] if decodes else None, compute_dtype, widen_to=result_dtype,
                                          decode_b=decodes[1] if len(decodes) == 2 else None)
    # (out * S_dec) in fp32, the two decode scales multiplied first (a's first), rounded once to the
    # compute dtype (torch.compile fuses the two; an out= of another dtype, which would do it in one
    # eager pass, is a graph break). bf16 is rounded on the bits: Inductor may drop the rounding of a
    # bf16 cast that it fuses into an fp32 consumer (models.quant.bf16_rounding).
    scaled = out
    if decodes:
        scaled = out.mul_(decodes[0] if len(decodes) == 1 else decodes[0] * decodes[1])
    if compute_dtype == torch.bfloat16:
        return round_to_bf16_by_bits(scaled).to(result_dtype)  # exact: already a bf16 value
    return scaled.to(compute_dtype).to(result_dtype)


def _use_epilogue_kernel(out: torch.Tensor, compute_dtype: torch.dtype, result_dtype: torch.dtype) -> bool:
    """Whether kernels.epilogue.scale_gemm_output takes this fp32 GEMM output (CUDA, Triton switched on)."""
    if not out.is_cuda:
        return False
    from models.quant import kernels  # imported here: no Triton import on CPU-only runs

    if not kernels.enabled():
        return False
    return result_dtype == compute_dtype or (compute_dtype, result_dtype) == (torch.bfloat16, torch.float32)


def _quantize_pair(a: torch.Tensor, b: torch.Tensor, gemm: GemmSpec, transpose: Tuple[bool, bool],
                   names: Tuple[str, str], compute_dtype: torch.dtype, rng: RoundingRng,
                   shared_scales: Tuple[Optional[torch.Tensor], Optional[torch.Tensor]] = (None, None),
                   amax: Optional[AmaxReduction] = None) -> Tuple[_Operand, _Operand]:
    """Both operands of one GEMM, quantized as ``gemm`` says (a first: the order of the random draws)."""
    a_op = _quantize_operand(a, gemm.a, transpose=transpose[0], compute_dtype=compute_dtype, rng=rng,
                             name=names[0], shared_scales=shared_scales[0], amax=amax)
    b_op = _quantize_operand(b, gemm.b, transpose=transpose[1], compute_dtype=compute_dtype, rng=rng,
                             name=names[1], shared_scales=shared_scales[1], amax=amax)
    return a_op, b_op


def _gathered_operand(weight: torch.Tensor, compute_dtype: torch.dtype) -> _Operand:
    """Fprop's W from the codes FSDP2 gathered: the values and decode scale ``_quantize_operand`` gives the whole
    BF16 weight (the same codes, trainer.nvfp4_weight_gather)."""
    quantized = weight.quantized()
    exact = quantized.scaled_values_exact_in(compute_dtype)
    values = quantized.scaled_values(compute_dtype if exact else torch.float32)
    if not exact:
        return _Operand(values.mul_(quantized.tensor_scale), None)
    return _Operand(values, quantized.tensor_scale)


def amax_reduced(amax: Optional[AmaxReduction], *names: str) -> bool:
    """Whether the tensor-parallel amax reduction names any of these operands (their kernels' shared
    scales are then not taken)."""
    return amax is not None and any(name in amax.operands for name in names)


class QuantLinearFunction(torch.autograd.Function):
    """Y = X W^T with emulated quantized GEMMs; see the module docstring for the op order."""

    @staticmethod
    def forward(ctx, x, weight, spec: LinearSpec, rng: RoundingRng, compute_dtype, grad_enabled: bool = True,
                amax: Optional[AmaxReduction] = None):
        x2 = x.reshape(-1, x.shape[-1])
        # X's global scales for Fprop and Wgrad from one read, when both take the kernels and a
        # backward will run (grad mode is passed in: inside forward it is always off, and
        # needs_input_grad ignores it, so under no_grad the pass would be taken for nothing).
        x_scales = None
        if spec.fprop is not None and spec.wgrad is not None and grad_enabled and ctx.needs_input_grad[1] \
                and not amax_reduced(amax, "Fprop X", "Wgrad X^T"):
            x_scales = _shared_scales(x2, spec.fprop.a, spec.wgrad.b)
        if spec.fprop is None:
            out = high_precision_gemm(x2, weight, compute_dtype)
            saved_weight = None
        else:
            if hasattr(weight, "quantized"):  # FSDP2 gathered W's codes (trainer.nvfp4_weight_gather)
                x_op = _quantize_operand(x2, spec.fprop.a, transpose=False, compute_dtype=compute_dtype, rng=rng,
                                         name="Fprop X", shared_scales=x_scales, amax=amax)
                w_op = _gathered_operand(weight, compute_dtype)
            else:
                x_op, w_op = _quantize_pair(x2, weight, spec.fprop, (False, False), ("Fprop X", "Fprop W"),
                                            compute_dtype, rng, shared_scales=(x_scales, None), amax=amax)
            out = _gemm(x_op, w_op, compute_dtype)
            saved_weight = w_op if spec.reuses_forward_weight else None
        ctx.spec, ctx.compute_dtype, ctx.amax = spec, compute_dtype, amax
        # A seed tensor is saved like any tensor (torch.compile traces it); a Generator rides on ctx.
        ctx.seed_saved = isinstance(rng, torch.Tensor)
        ctx.generator = None if ctx.seed_saved else rng
        ctx.x_shape, ctx.x_dtype = x.shape, x.dtype
        ctx.has_saved_weight = saved_weight is not None
        ctx.saved_weight_has_decode = saved_weight is not None and saved_weight.decode is not None
        ctx.has_x_scales = x_scales is not None
        extra = []
        if saved_weight is not None:
            extra.append(saved_weight.values)
            if saved_weight.decode is not None:
                extra.append(saved_weight.decode)
        if x_scales is not None:
            extra.append(x_scales)  # last
        ctx.save_for_backward(x2, weight, *([rng] if ctx.seed_saved else []), *extra)
        return out.reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad_output):
        saved = ctx.saved_tensors
        x2, weight = saved[0], saved[1]
        # Indexing, not list.pop: Dynamo traces the saved tensors as a tuple (no pop under compile).
        rng = saved[2] if ctx.seed_saved else ctx.generator
        extra = saved[3:] if ctx.seed_saved else saved[2:]
        x_scales = extra[-1] if ctx.has_x_scales else None
        spec: LinearSpec = ctx.spec
        compute_dtype, amax = ctx.compute_dtype, ctx.amax
        dy = grad_output.reshape(-1, grad_output.shape[-1])
        # dY's global scales for Dgrad and Wgrad from one read, when both take the kernels.
        dy_scales = None
        if ctx.needs_input_grad[0] and ctx.needs_input_grad[1] and spec.dgrad is not None and spec.wgrad is not None \
                and not amax_reduced(amax, "Dgrad dY", "Wgrad dY^T"):
            dy_scales = _shared_scales(dy, spec.dgrad.a, spec.wgrad.a)
        grad_x = grad_weight = None
        if ctx.needs_input_grad[0]:
            if spec.dgrad is None:
                grad_x = high_precision_gemm(dy, weight.t(), compute_dtype)
            else:
                dy_op = _quantize_operand(
                    dy, spec.dgrad.a, transpose=False, compute_dtype=compute_dtype, rng=rng,
                    name="Dgrad dY", shared_scales=dy_scales, amax=amax,
                )
                if ctx.has_saved_weight:
                    # The same quantized W as Fprop: [N, K] blocked 16x16, used as W^T [K, N].
                    decode = extra[1] if ctx.saved_weight_has_decode else None
                    w_t_op = _Operand(extra[0].t(), decode)
                else:
                    w_t_op = _quantize_operand(
                        weight, spec.dgrad.b, transpose=True, compute_dtype=compute_dtype,
                        rng=rng, name="Dgrad W^T", amax=amax,
                    )
                grad_x = _gemm(dy_op, w_t_op, compute_dtype)
            grad_x = grad_x.to(ctx.x_dtype).reshape(ctx.x_shape)
        if ctx.needs_input_grad[1]:
            if spec.wgrad is None:
                grad_weight = high_precision_gemm(dy.t(), x2.t(), compute_dtype)
            else:
                dy_t_op, x_t_op = _quantize_pair(dy, x2, spec.wgrad, (True, True), ("Wgrad dY^T", "Wgrad X^T"),
                                                 compute_dtype, rng, shared_scales=(dy_scales, x_scales), amax=amax)
                grad_weight = _gemm(dy_t_op, x_t_op, compute_dtype, result_dtype=weight.dtype)
            grad_weight = grad_weight.to(weight.dtype)
        return grad_x, grad_weight, None, None, None, None, None


class QuantLinear(QuantizedLinear):
    """The emulated backend: quantize-dequantize each operand, then a BF16/FP32 GEMM (module docstring).

    Runs on any device. ``spec.backend`` must be 'emulated' (the te/torch backends are other modules,
    set up by models.quant.recipe).
    """

    def check_input(self, x: torch.Tensor) -> None:
        if self.spec.backend != "emulated":
            raise NotImplementedError(
                f"layer {self.name!r}: backend {self.spec.backend!r} is not run by QuantLinear (only ('emulated',)); "
                f"the te/torch backends are set up by models.quant.recipe"
            )
        super().check_input(x)

    def quantized_matmul(self, x: torch.Tensor, compute_dtype: torch.dtype) -> torch.Tensor:
        return QuantLinearFunction.apply(x, local_tensor(self.weight), self.spec, self.rounding_rng(), compute_dtype,
                                         torch.is_grad_enabled(), self.amax_reduction)
