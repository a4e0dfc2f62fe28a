"""Native FP8 linear layer: Fprop, Dgrad and Wgrad as FP8 GEMMs through torch's scaled matmul.

The three GEMMs of ``Y = X W^T`` (T tokens, K in_features, N out_features), each ``A B^T`` with
both operands row-major and blocked along the reduction dim (the only layout Hopper's FP8 tensor
cores take: "TN"):

    Fprop  Y  [T, N] = X    [T, K] . W   [N, K]^T     X 1x128 along K, W 128x128
    Dgrad  dX [T, K] = dY   [T, N] . W^T [K, N]^T     dY 1x128 along N, W^T: the same codes transposed
    Wgrad  dW [N, K] = dY^T [N, T] . X^T [K, T]^T     both 1x128 along tokens

Numerics are those of ``models.quant.formats`` (and so of the emulated path, ``models.quant.linear``),
bit for bit in every code and scale:

fp8_block (TE ``Float8BlockScaling``, DeepSeek-V3's fine-grained FP8; ``recipe_common.cuh``)
    amax    = max |x| over a 1x128 block or a 128x128 tile
    scale   = 448 / amax; the input dtype's max finite value if that is Inf; 1 if amax == 0 or
              amax is not finite; mantissa bits cleared if power_of_two_scales (TE's default)
    code    = e4m3(clamp(x * scale, -448, 448))   RNE;    decode = 1 / scale (NaN if amax not finite)
fp8_tensor (TE ``Float8CurrentScaling``): the same with one block, the whole tensor, FLT_MAX for Inf.

Every orientation an operand needs is quantized from the high-precision tensor, never from a
quantized one: X rowwise (Fprop) and X^T along tokens (Wgrad) come out of one kernel call on X
(a rows pass and a columns pass), dY's two orientations out of one on dY
(``models.quant.kernels.fp8``), and W's 128x128 tiles from one read per forward, written both as
W (Fprop) and as W^T (Dgrad); a square tile is the same tile of
the transpose, so the Dgrad W is the Fprop W, as the chain rule wants. The forward saves W^T's
and X^T's FP8 codes (1 byte per element) for the backward instead of X.

The GEMM (``fp8_gemm``) computes ``sum_k (code_a * decode_a) (code_b * decode_b)``: products of
E4M3 codes are exact, each 128-long block sum is scaled by its two decode scales and accumulated
in fp32, the output is rounded once to the compute dtype. Blockwise scaling goes through
``torch.nn.functional.scaled_mm`` (torch >= 2.10) with explicit recipes, which on Hopper runs
cuBLASLt's block-scaled GEMM. Its layouts (PyTorch ``ScaledBlas.cpp``, cuBLAS "1D and 128x128 2D
block scaling for FP8"), for an operand ``A [m, r]`` with the reduction dim r last:
- codes float8_e4m3fn [m, r] row-major; B is passed as ``B.t()``, i.e. column-major [r, n];
- 1x128 scales [m, r/128] with strides (1, m) ("outer-dim-major");
- 128x128 scales [L4, m/128] with strides (1, L4), L4 = round_up(r/128, 4) (zero padding).
Per-tensor scaling goes through ``torch._scaled_mm`` with two scalar decode scales.

Hardware: PyTorch runs the DeepSeek-style (1x128 / 128x128) scaled GEMM only on compute
capability 9.x (``_check_deepseek_support``); tensorwise needs 8.9+ (or the CPU, where torch
implements it, which the CPU tests use). Within a 128-long block Hopper's FP8 tensor cores add
with a truncating accumulator of ~13 mantissa bits (DeepSeek-V3 report, sec. 3.3.2; Khattak &
Mikaitis 2025 model it as e8m13); the block sums are then scaled and added in fp32. So the GEMM
outputs equal the emulated ones to that accumulator's precision, not to fp32's: the GPU tests
bound the difference, and require equality on operands whose sums are exact on any accumulator.

Under ``torch.compile`` the layer traces whole inside compiled blocks: the quantizers and the GEMM
are custom ops opaque to Inductor (``kernels.fp8.block_quantize_op`` and ``tensor_quantize_op``,
``scaled_gemm``). Not done here: weight quantization is not cached across micro-batches.

Tensor parallelism (``QuantizedLinear.set_tensor_parallel``): the GEMMs take the weight's local shard;
a per-tensor (fp8_tensor) operand the layer's ``amax_reduction`` names takes the group's amax
(``quantized_linear.group_amax``) through the torch reference, on CUDA too (the kernel takes its own
amax pass), so a sharded layer's codes are the unsharded layer's. Blockwise FP8 has no per-tensor
scale: each shard of whole 128-blocks quantizes as the whole already.

Sources: TE ``transformer_engine/common/recipe/recipe_common.cuh`` and ``Float8BlockScaling``;
PyTorch ``aten/src/ATen/native/cuda/ScaledBlas.cpp`` and ``test/test_scaled_matmul_cuda.py``
(``test_scaled_mm_block_wise_numerics``: the scale layouts); DeepSeek-V3 technical report.
"""

from __future__ import annotations

from typing import Dict, Iterable, Optional, Tuple

import torch
import torch.nn.functional as F

from models.norms import local_tensor
from models.quant import formats
from models.quant.element_formats import GEMMS
from models.quant.fp8_operand import BLOCK, KINDS, Fp8Operand, gemm_layout_scales, quantize_reference  # noqa: F401
from models.quant.gemm_spec import GemmSpec, LinearSpec, OperandSpec, fp8_block_linear_spec
from models.quant.kernels import fp8 as fp8_kernels
from models.quant.quantized_linear import (AmaxReduction, NativeQuantizedLinear, group_amax, high_precision_gemm,
                                           with_amax_rows)

# (A kind, B kind) pairs a native GEMM takes: cuBLASLt's blockwise combinations, and per tensor.
SUPPORTED_PAIRS = (("1x128", "128x128"), ("1x128", "1x128"), ("128x128", "1x128"), ("tensor", "tensor"))
REQUIREMENT = "torch >= 2.10 (torch.nn.functional.scaled_mm) on a CUDA GPU of compute capability 9.x (Hopper)"


# ----------------------------------------------------------------------------------------------
# What this torch can do


# ScalingType member names by operand kind: torch 2.13 (a C++ enum) spells them BlockWise1x128,
# earlier releases of the same API (a Python Enum) Blockwise_1x128; the values agree (4, 5).
_SCALING_TYPE_NAMES = {"1x128": ("BlockWise1x128", "Blockwise_1x128"),
                       "128x128": ("BlockWise128x128", "Blockwise_128x128")}


def _scaling_type(kind: str):
    """torch.nn.functional.ScalingType member of a blockwise operand kind (None if torch lacks it)."""
    scaling = getattr(F, "ScalingType", None)
    for name in _SCALING_TYPE_NAMES[kind]:
        member = getattr(scaling, name, None)
        if member is not None:
            return member
    return None


def has_blockwise_scaled_mm() -> bool:
    """Whether torch has the scaled-matmul API with explicit blockwise recipes (torch >= 2.10)."""
    return hasattr(F, "scaled_mm") and all(_scaling_type(kind) is not None for kind in _SCALING_TYPE_NAMES)


_CAPABILITY: Dict[int, Tuple[int, int]] = {}


def _capability(device: torch.device) -> Tuple[int, int]:
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _CAPABILITY:
        _CAPABILITY[index] = torch.cuda.get_device_capability(index)
    return _CAPABILITY[index]


def check_native_support(device: torch.device, kinds: Iterable[str], name: str = "") -> None:
    """Raise RuntimeError (naming the layer) unless GEMMs with these operand kinds can run here."""
    def where() -> str:  # formatted on failure only: torch.compile would guard on (recompile per) name
        return f"layer {name!r}: " if name else ""

    kinds = set(kinds)
    if kinds - {"tensor"}:
        if not has_blockwise_scaled_mm():
            raise RuntimeError(f"{where()}blockwise FP8 GEMMs need {REQUIREMENT}; this is torch {torch.__version__}. "
                               "Use precision.backend=emulated (or te)")
        if device.type != "cuda":
            raise RuntimeError(f"{where()}blockwise FP8 GEMMs need {REQUIREMENT}; the tensors are on {device}. "
                               "Use precision.backend=emulated")
        major, minor = _capability(device)
        if major != 9:
            raise RuntimeError(f"{where()}PyTorch runs the blockwise (1x128 / 128x128) FP8 GEMM on compute capability "
                               f"9.x only; this GPU is {major}.{minor}. Use precision.backend=te or emulated")
    elif device.type == "cuda" and _capability(device) < (8, 9):
        raise RuntimeError(f"{where()}FP8 GEMMs need compute capability 8.9+; this GPU is "
                           f"{'.'.join(map(str, _capability(device)))}")


# ----------------------------------------------------------------------------------------------
# Quantized operands


def operand_kind(spec: OperandSpec, where: str = "") -> str:
    """The native kind of an operand spec; ValueError (prefixed by ``where``) if not FP8-native."""
    if spec.fmt not in ("fp8_block", "fp8_tensor"):
        raise ValueError(f"{where}the torch backend runs fp8_block and fp8_tensor operands, not {spec.fmt}; "
                         "use precision.backend=emulated (or te)")
    if spec.rounding != "nearest" or spec.rht:
        raise ValueError(f"{where}the torch backend rounds FP8 to nearest without RHT; got {spec.describe()}")
    if spec.fmt == "fp8_tensor":
        return "tensor"
    return "1x128" if spec.tile == (1, BLOCK) else "128x128"


def check_spec(spec: LinearSpec, name: str = "") -> None:
    """Raise ValueError naming the layer, GEMM and operand unless every quantized GEMM runs natively."""
    for gemm in GEMMS:
        gemm_spec: Optional[GemmSpec] = getattr(spec, gemm)
        if gemm_spec is None:
            continue
        where = f"layer {name!r} ({gemm.capitalize()}): "
        pair = (operand_kind(gemm_spec.a, where), operand_kind(gemm_spec.b, where))
        if pair not in SUPPORTED_PAIRS:
            raise ValueError(f"{where}no native FP8 GEMM for {pair[0]} x {pair[1]} operands "
                             f"({gemm_spec.describe()}); supported: {', '.join(' x '.join(p) for p in SUPPORTED_PAIRS)}")


def _tensor_reference_with_group_amax(tensor: torch.Tensor, group) -> Fp8Operand:
    """fp8_tensor codes of ``tensor`` [R, C] scaled by the group's amax (``quantize_reference``'s numbers
    for the whole sharded tensor: the appended row raises the amax, ``with_amax_rows``)."""
    matrix = with_amax_rows(tensor.contiguous(), group_amax(tensor, group), 1)
    quantized = formats.quantize(matrix, "fp8_tensor")
    return Fp8Operand(quantized.codes[: tensor.shape[0]], gemm_layout_scales(quantized.tensor_scale, "tensor"), "tensor")


def quantize_operands(tensor: torch.Tensor, rows: Optional[OperandSpec], columns: Optional[OperandSpec], *,
                      name: str = "", amax_group=None) -> Tuple[Optional[Fp8Operand], Optional[Fp8Operand]]:
    """Quantize tensor [R, C] as the operand ``tensor`` (blocks along C, spec ``rows``) and/or
    ``tensor^T`` (blocks along R, spec ``columns``), each from the high-precision values.

    Both 1x128 (X, dY) or both 128x128 (W, W^T): the Triton kernel when it can run (one read of a
    128x128-tiled tensor, two passes for 1x128: ``kernels.options.Fp8Options``), else the torch reference;
    per tensor: an amax, then the same kernel for both orientations (dims that divide by 128), else
    the torch reference with its codes transposed for the second orientation (the same numbers as
    quantizing the transpose). ``amax_group``: a process group whose amax a per-tensor scale takes
    (tensor parallelism; the torch reference then runs).
    """
    rows_kind = operand_kind(rows, f"{name}: ") if rows is not None else None
    columns_kind = operand_kind(columns, f"{name}: ") if columns is not None else None
    if rows_kind is None and columns_kind is None:
        return None, None
    if rows_kind is not None and columns_kind is not None and rows_kind != columns_kind:
        return (quantize_operands(tensor, rows, None, name=name, amax_group=amax_group)[0],
                quantize_operands(tensor, None, columns, name=name, amax_group=amax_group)[1])
    kind = rows_kind or columns_kind
    if kind == "tensor":
        if amax_group is not None:
            operand = _tensor_reference_with_group_amax(tensor, amax_group)
            transposed = Fp8Operand(operand.data.t().contiguous(), operand.scale, "tensor") if columns is not None else None
            return (operand if rows is not None else None), transposed
        if fp8_kernels.supports(tensor) and fp8_kernels.supports_tensor_shape(tensor.shape, columns is not None):
            # While compiling, an op opaque to Inductor (fp8_kernels: pytorch#189271).
            row_codes, col_codes, decode = fp8_kernels.tensor_quantize(
                tensor, rows=rows is not None, columns=columns is not None, name=name)
            return (Fp8Operand(row_codes, decode, "tensor") if rows is not None else None,
                    Fp8Operand(col_codes, decode, "tensor") if columns is not None else None)
        operand = quantize_reference(tensor, "tensor")
        transposed = None
        if columns is not None:
            transposed = Fp8Operand(operand.data.t().contiguous(), operand.scale, "tensor")
        return (operand if rows is not None else None), transposed
    if fp8_kernels.supports(tensor):
        # While compiling, an op opaque to Inductor (fp8_kernels: pytorch#189271).
        row_codes, row_scales, col_codes, col_scales = fp8_kernels.block_quantize(
            tensor, tile_2d=kind == "128x128", rows=rows is not None, columns=columns is not None,
            rows_power_of_two=rows is not None and rows.power_of_two_scales,
            columns_power_of_two=columns is not None and columns.power_of_two_scales, name=name,
        )
        return (Fp8Operand(row_codes, row_scales, kind) if rows is not None else None,
                Fp8Operand(col_codes, col_scales, kind) if columns is not None else None)
    return (
        quantize_reference(tensor, kind, power_of_two_scales=rows.power_of_two_scales) if rows is not None else None,
        quantize_reference(tensor, kind, power_of_two_scales=columns.power_of_two_scales, transpose=True)
        if columns is not None else None,
    )


# ----------------------------------------------------------------------------------------------
# The GEMM


def fp8_gemm(a: Fp8Operand, b: Fp8Operand, out_dtype: torch.dtype) -> torch.Tensor:
    """a [m, r] times b [n, r]^T -> [m, n] in out_dtype: one native FP8 GEMM with both decode scales."""
    if a.data.shape[1] != b.data.shape[1]:
        raise ValueError(f"fp8_gemm: reduction dims differ: a {list(a.data.shape)}, b {list(b.data.shape)}")
    if (a.kind, b.kind) not in SUPPORTED_PAIRS:
        raise ValueError(f"fp8_gemm: no native GEMM for {a.kind} x {b.kind}")
    # Eager calls skip the custom op's dispatch (~45 us of host time per GEMM); compiled ones need it.
    gemm = scaled_gemm if torch.compiler.is_compiling() else _torch_scaled_gemm
    return gemm(a.data, b.data.t(), a.scale, b.scale, a.kind, b.kind, out_dtype)


# An opaque op for torch.compile: Dynamo cannot trace F.scaled_mm (torch 2.11 calls the untraceable
# builtin torch._scaled_mm_v2), and a graph break inside the autograd function would send the whole
# layer back to eager. The scale layouts are the GEMM's contract (module docstring), so Inductor must
# hand the operands over with exactly these strides.
_EXACT_STRIDES = getattr(torch._C.Tag, "needs_exact_strides", torch._C.Tag.needs_fixed_stride_order)


def _torch_scaled_gemm(a: torch.Tensor, b_t: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, kind_a: str,
                       kind_b: str, out_dtype: torch.dtype) -> torch.Tensor:
    """a [m, r] (row-major) times b_t [r, n] (column-major) -> [m, n]: torch's scaled GEMM for the kinds."""
    if kind_a == "tensor":
        return torch._scaled_mm(a, b_t, scale_a=scale_a, scale_b=scale_b, out_dtype=out_dtype)
    # One scale tensor and one recipe per operand, passed as lists (the form every version takes).
    return F.scaled_mm(a, b_t, [scale_a], [_scaling_type(kind_a)], [scale_b], [_scaling_type(kind_b)],
                       output_dtype=out_dtype)


@torch.library.custom_op("hybrid_quant::fp8_scaled_gemm", mutates_args=(), tags=(_EXACT_STRIDES,))
def scaled_gemm(a: torch.Tensor, b_t: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, kind_a: str,
                kind_b: str, out_dtype: torch.dtype) -> torch.Tensor:
    """``_torch_scaled_gemm`` as one op that torch.compile records without looking inside."""
    return _torch_scaled_gemm(a, b_t, scale_a, scale_b, kind_a, kind_b, out_dtype)


@scaled_gemm.register_fake
def _scaled_gemm_fake(a, b_t, scale_a, scale_b, kind_a, kind_b, out_dtype):
    """Traced on fake tensors, torch's own meta functions run: they check the operand and scale
    layouts and give the output's shape and strides. Their message prints no strides; this one does."""
    try:
        return _torch_scaled_gemm(a, b_t, scale_a, scale_b, kind_a, kind_b, out_dtype)
    except RuntimeError as error:
        if type(error) is not RuntimeError:  # fake-tensor and Dynamo subclasses keep their type
            raise
        layouts = ", ".join(f"{label} {tuple(t.shape)} strides {t.stride()} {t.dtype}" for label, t in
                            (("a", a), ("b_t", b_t), ("scale_a", scale_a), ("scale_b", scale_b)))
        raise RuntimeError(f"fp8_scaled_gemm ({kind_a} x {kind_b}) traced with {layouts}: {error}") from error


# ----------------------------------------------------------------------------------------------
# The layer


class _TorchFp8LinearFunction(torch.autograd.Function):
    """Y = X W^T with the quantized GEMMs native; high-precision GEMMs as the emulated path runs them."""

    @staticmethod
    def forward(ctx, x, weight, spec: LinearSpec, name: str, compute_dtype: torch.dtype, grad_enabled: bool,
                amax: Optional[AmaxReduction] = None):
        x2 = x.reshape(-1, x.shape[-1])  # [T, K]
        needs_dgrad = grad_enabled and ctx.needs_input_grad[0]
        needs_wgrad = grad_enabled and ctx.needs_input_grad[1]
        dgrad = spec.dgrad if needs_dgrad else None
        wgrad = spec.wgrad if needs_wgrad else None
        # Autocast is off here (QuantizedLinear.forward's autocast_off); no context of its own: one
        # inside the autograd function makes Dynamo's tracing flip the global autocast state.
        # X [T, K]: rowwise for Fprop, X^T [K, T] along tokens for Wgrad, one kernel call.
        x_op, x_t_op = quantize_operands(x2, spec.fprop.a if spec.fprop else None, wgrad.b if wgrad else None,
                                         name=f"{name} (X)", amax_group=_group(amax, "Fprop X", "Wgrad X^T"))
        # W [N, K]: for Fprop, and W^T [K, N] for Dgrad (128x128: the same tiles), once per forward.
        w_op, w_t_op = quantize_operands(weight, spec.fprop.b if spec.fprop else None, dgrad.b if dgrad else None,
                                         name=f"{name} (W)", amax_group=_group(amax, "Fprop W", "Dgrad W^T"))
        if spec.fprop is None:
            out = high_precision_gemm(x2, weight, compute_dtype)
        else:
            out = fp8_gemm(x_op, w_op, compute_dtype)
        ctx.spec, ctx.name, ctx.compute_dtype, ctx.amax = spec, name, compute_dtype, amax
        ctx.x_shape, ctx.x_dtype = x.shape, x.dtype
        ctx.needs = (needs_dgrad, needs_wgrad)
        ctx.kinds = (w_t_op.kind if w_t_op else None, x_t_op.kind if x_t_op else None)
        ctx.save_for_backward(
            x2 if needs_wgrad and wgrad is None else None,
            weight if needs_dgrad and dgrad is None else None,
            w_t_op.data if w_t_op else None, w_t_op.scale if w_t_op else None,
            x_t_op.data if x_t_op else None, x_t_op.scale if x_t_op else None,
        )
        ctx.weight_dtype = weight.dtype
        return out.reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad_output):
        x2, weight, w_t_data, w_t_scale, x_t_data, x_t_scale = ctx.saved_tensors
        spec: LinearSpec = ctx.spec
        name, compute_dtype = ctx.name, ctx.compute_dtype
        needs_dgrad, needs_wgrad = ctx.needs
        w_t_kind, x_t_kind = ctx.kinds
        dy = grad_output.reshape(-1, grad_output.shape[-1])  # [T, N]
        grad_x = grad_weight = None
        # No autocast context here either (see forward). The backward may run under the caller's
        # autocast (torch.compile traces it under the forward's): the FP8 GEMM is an opaque op that
        # autocast leaves alone, high_precision_gemm switches autocast off itself, and the
        # quantizers choose their dtypes explicitly.
        dgrad = spec.dgrad if needs_dgrad else None
        wgrad = spec.wgrad if needs_wgrad else None
        # dY [T, N]: rowwise for Dgrad, dY^T [N, T] along tokens for Wgrad, one kernel call.
        dy_op, dy_t_op = quantize_operands(dy, dgrad.a if dgrad else None, wgrad.a if wgrad else None,
                                           name=f"{name} (dY)", amax_group=_group(ctx.amax, "Dgrad dY", "Wgrad dY^T"))
        if needs_dgrad:
            if dgrad is None:
                grad_x = high_precision_gemm(dy, weight.t(), compute_dtype)
            else:
                grad_x = fp8_gemm(dy_op, Fp8Operand(w_t_data, w_t_scale, w_t_kind), compute_dtype)
            grad_x = grad_x.to(ctx.x_dtype).reshape(ctx.x_shape)
        if needs_wgrad:
            if wgrad is None:
                grad_weight = high_precision_gemm(dy.t(), x2.t(), compute_dtype)
            else:
                grad_weight = fp8_gemm(dy_t_op, Fp8Operand(x_t_data, x_t_scale, x_t_kind), compute_dtype)
            grad_weight = grad_weight.to(ctx.weight_dtype)
        return grad_x, grad_weight, None, None, None, None, None


def _group(amax: Optional[AmaxReduction], *names: str):
    """The process group whose amax a tensor's per-tensor scale takes, if the layer's tensor-parallel
    reduction names its operands (the two orientations of one tensor are sharded alike), else None."""
    if amax is None or not any(name in amax.operands for name in names):
        return None
    return amax.group


class TorchFp8Linear(NativeQuantizedLinear):
    """The native FP8 backend: quantized GEMMs as FP8 GEMMs (same parameters and state-dict keys).

    ``spec`` is the emulated path's LinearSpec (``fp8_block_linear_spec`` / ``fp8_tensor_linear_spec``;
    its ``backend`` field is not read), checked on assignment (``check_spec``); a GEMM set to None runs
    in the compute dtype. FP8 rounds to nearest: nothing here draws random numbers.
    """

    def default_spec(self) -> LinearSpec:
        return fp8_block_linear_spec()

    check_spec = staticmethod(check_spec)

    def check_input(self, x: torch.Tensor) -> None:
        super().check_input(x)
        # Per-tensor FP8 GEMMs (torch._scaled_mm) need every dim but the output rows to divide by 16.
        in_features, out_features = self.local_features()
        tokens = x.numel() // in_features
        running = self.gemms_to_check(x)
        dims = {"fprop": (("in_features", in_features), ("out_features", out_features)),
                "dgrad": (("out_features", out_features), ("in_features", in_features)),
                "wgrad": (("tokens", tokens), ("in_features", in_features))}
        for gemm in GEMMS:
            gemm_spec = getattr(running, gemm)
            if gemm_spec is None or gemm_spec.a.fmt != "fp8_tensor":
                continue
            for dim_name, size in dims[gemm]:
                if size % 16:
                    raise ValueError(f"layer {self.name!r} ({gemm.capitalize()}, fp8_tensor): {dim_name} {size} is not a "
                                     "multiple of 16, which torch._scaled_mm needs; nothing is padded")

    def quantized_matmul(self, x: torch.Tensor, compute_dtype: torch.dtype) -> torch.Tensor:
        # Traceable by Dynamo inside compiled blocks: the quantizers (fp8_kernels' opaque ops) and the
        # GEMM op (scaled_gemm) are recorded, with no graph break.
        running = self.gemms_to_check(x)
        kinds = [operand_kind(operand) for gemm in GEMMS if getattr(running, gemm) is not None
                 for operand in (getattr(running, gemm).a, getattr(running, gemm).b)]
        check_native_support(x.device, kinds, self.name)
        # The name only labels errors; compiled, it is left out: an argument of the autograd
        # function is a constant Dynamo guards on, so every layer would compile its own graph.
        name = "<compiled layer>" if torch.compiler.is_compiling() else self.name
        return _TorchFp8LinearFunction.apply(x, local_tensor(self.weight), self.spec, name, compute_dtype,
                                             torch.is_grad_enabled(), self.amax_reduction)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, native FP8"
