"""Quantized linear layer: Y = X W^T with each of its three GEMMs quantized as a LinearSpec says.

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

Stochastic rounding draws from torch's global RNG on the tensor's device (seeded by the trainer:
runs are reproducible and no two calls share draws), or from ``QuantLinear.generator`` when set.
In the backward, Dgrad's dY is quantized (and draws) before Wgrad's dY^T. On CUDA with Triton the
NVFP4 operands go through ``models.quant.kernels`` (bit-identical for RNE; SR seeds drawn from the
same RNG), unless ``models.quant.kernels.use_triton(False)``.

Shapes are checked in the forward, so a layer that does not divide its blocks fails at once, with
an error naming the layer, the GEMM, the operand and the dim. Nothing is padded.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from models.quant import formats
from models.quant.rht import HADAMARD_SIZE, rht

GEMMS = ("fprop", "dgrad", "wgrad")
BACKENDS = ("emulated",)


@dataclass(frozen=True)
class OperandSpec:
    """How one GEMM operand is quantized, along that GEMM's reduction dim."""

    fmt: str
    """One of models.quant.formats.FORMATS: nvfp4, mxfp4, mxfp8, fp8_block, fp8_tensor."""
    tile: Optional[Tuple[int, int]] = None
    """Tile (rows, cols) with cols along the reduction dim; None for the format's default."""
    rounding: str = "nearest"
    """'nearest' (round half to even) or 'stochastic' (E2M1 formats only)."""
    rht: bool = False
    """Apply the 16x16 random Hadamard transform along the reduction dim before quantizing."""
    power_of_two_scales: bool = True
    """fp8_block only: round block scales down to powers of two (TE Float8BlockScaling default)."""

    def __post_init__(self):
        object.__setattr__(self, "tile", formats.resolve_tile(self.fmt, self.tile))
        if self.rounding not in formats.ROUNDINGS:
            raise ValueError(f"rounding must be one of {formats.ROUNDINGS}, got {self.rounding!r}")
        if self.rounding == "stochastic" and self.fmt not in formats.E2M1_FORMATS:
            raise ValueError(f"stochastic rounding is implemented for {formats.E2M1_FORMATS}, not {self.fmt!r}")
        if self.rht and (self.tile is None or self.tile[0] != 1 or self.tile[1] % HADAMARD_SIZE != 0):
            raise ValueError(
                f"the RHT needs 1-row tiles whose length divides into {HADAMARD_SIZE}s, got {self.fmt} {self.tile}"
            )

    @property
    def transpose_invariant(self) -> bool:
        """Whether quantizing the transposed tensor gives the transposed result (square or no tiles, RNE)."""
        square = self.tile is None or self.tile[0] == self.tile[1]
        return square and self.rounding == "nearest" and not self.rht

    def describe(self) -> str:
        tile = "tensor" if self.tile is None else f"{self.tile[0]}x{self.tile[1]}"
        extras = ["SR" if self.rounding == "stochastic" else "RNE"]
        if self.rht:
            extras.append("RHT")
        if self.fmt == "fp8_block":
            extras.append("pow2" if self.power_of_two_scales else "fp32 scales")
        return f"{self.fmt} {tile} {'+'.join(extras)}"


@dataclass(frozen=True)
class GemmSpec:
    """The two quantized operands of one GEMM ``A B^T`` (both blocked along the reduction dim).

    Fprop: a = X, b = W. Dgrad: a = dY, b = W^T. Wgrad: a = dY^T, b = X^T.
    """

    a: OperandSpec
    """Left operand (X in Fprop, dY in Dgrad, dY^T in Wgrad)."""
    b: OperandSpec
    """Right operand (W in Fprop, W^T in Dgrad, X^T in Wgrad)."""

    def describe(self) -> str:
        return f"{self.a.describe()} x {self.b.describe()}"


@dataclass
class LinearSpec:
    """Per-GEMM precision of one linear layer; a None GEMM runs in high precision (compute dtype).

    Mutable on purpose: the late switch to BF16 sets GEMMs to None (``switched_to_high_precision``
    returns such a copy, for specs shared between layers).
    """

    fprop: Optional[GemmSpec] = None
    """Y = X W^T."""
    dgrad: Optional[GemmSpec] = None
    """dX = dY W."""
    wgrad: Optional[GemmSpec] = None
    """dW = dY^T X."""
    backend: str = "emulated"
    """Who runs the quantized GEMMs; only 'emulated' lives here (te/torch backends: the recipe)."""

    @property
    def quantized(self) -> bool:
        """Whether any GEMM is quantized."""
        return any(getattr(self, gemm) is not None for gemm in GEMMS)

    @property
    def reuses_forward_weight(self) -> bool:
        """Dgrad uses the W quantized in Fprop (same spec, transpose-invariant tiles: 2D or per tensor)."""
        return (
            self.fprop is not None
            and self.dgrad is not None
            and self.dgrad.b == self.fprop.b
            and self.fprop.b.transpose_invariant
        )

    def switched_to_high_precision(self, mode: str = "forward") -> "LinearSpec":
        """A copy with Fprop ('forward') or all GEMMs ('forward_backward') in high precision."""
        if mode == "forward":
            return dataclasses.replace(self, fprop=None)
        if mode == "forward_backward":
            return dataclasses.replace(self, fprop=None, dgrad=None, wgrad=None)
        raise ValueError(f"mode must be 'forward' or 'forward_backward', got {mode!r}")

    def describe(self) -> str:
        parts = []
        for gemm in GEMMS:
            gemm_spec = getattr(self, gemm)
            parts.append(f"{gemm}: {gemm_spec.describe() if gemm_spec else 'high precision'}")
        return "; ".join(parts)


# ----------------------------------------------------------------------------------------------
# Spec builders (called by models.quant.recipe)


def _gemm_or_none(enabled: bool, a: OperandSpec, b: OperandSpec) -> Optional[GemmSpec]:
    return GemmSpec(a, b) if enabled else None


def nvfp4_linear_spec(
    weight_2d: bool = True,
    wgrad_rht: bool = True,
    stochastic_rounding: bool = True,
    quantize_fprop: bool = True,
    quantize_dgrad: bool = True,
    quantize_wgrad: bool = True,
) -> LinearSpec:
    """The paper's NVFP4 recipe (DESIGN table); each technique switchable for ablations."""
    gradient_rounding = "stochastic" if stochastic_rounding else "nearest"
    weight = OperandSpec("nvfp4", (16, 16) if weight_2d else (1, 16))
    return LinearSpec(
        fprop=_gemm_or_none(quantize_fprop, OperandSpec("nvfp4", (1, 16)), weight),
        dgrad=_gemm_or_none(quantize_dgrad, OperandSpec("nvfp4", (1, 16), gradient_rounding), weight),
        wgrad=_gemm_or_none(
            quantize_wgrad,
            OperandSpec("nvfp4", (1, 16), gradient_rounding, rht=wgrad_rht),
            OperandSpec("nvfp4", (1, 16), "nearest", rht=wgrad_rht),
        ),
    )


def mxfp4_linear_spec(
    wgrad_rht: bool = True,
    stochastic_rounding: bool = True,
    quantize_fprop: bool = True,
    quantize_dgrad: bool = True,
    quantize_wgrad: bool = True,
) -> LinearSpec:
    """MXFP4 (1x32 E2M1, E8M0 scales) with the NVFP4 recipe's techniques, so a comparison isolates the format.

    There is no 2D option (OCP MX blocks are 1x32), so Dgrad re-quantizes W^T along N.
    """
    gradient_rounding = "stochastic" if stochastic_rounding else "nearest"
    block = OperandSpec("mxfp4")
    return LinearSpec(
        fprop=_gemm_or_none(quantize_fprop, block, block),
        dgrad=_gemm_or_none(quantize_dgrad, OperandSpec("mxfp4", rounding=gradient_rounding), block),
        wgrad=_gemm_or_none(
            quantize_wgrad,
            OperandSpec("mxfp4", rounding=gradient_rounding, rht=wgrad_rht),
            OperandSpec("mxfp4", rht=wgrad_rht),
        ),
    )


def mxfp8_linear_spec(
    quantize_fprop: bool = True, quantize_dgrad: bool = True, quantize_wgrad: bool = True
) -> LinearSpec:
    """MXFP8: every operand 1x32 E4M3 with E8M0 scales, RNE, along each GEMM's reduction dim."""
    block = OperandSpec("mxfp8")
    return LinearSpec(
        fprop=_gemm_or_none(quantize_fprop, block, block),
        dgrad=_gemm_or_none(quantize_dgrad, block, block),
        wgrad=_gemm_or_none(quantize_wgrad, block, block),
    )


def fp8_block_linear_spec(
    power_of_two_scales: bool = True,
    quantize_fprop: bool = True,
    quantize_dgrad: bool = True,
    quantize_wgrad: bool = True,
) -> LinearSpec:
    """The paper's FP8 baseline (TE Float8BlockScaling): W 128x128, activations and gradients 1x128."""
    vector = OperandSpec("fp8_block", (1, 128), power_of_two_scales=power_of_two_scales)
    weight = OperandSpec("fp8_block", (128, 128), power_of_two_scales=power_of_two_scales)
    return LinearSpec(
        fprop=_gemm_or_none(quantize_fprop, vector, weight),
        dgrad=_gemm_or_none(quantize_dgrad, vector, weight),
        wgrad=_gemm_or_none(quantize_wgrad, vector, vector),
    )


def fp8_tensor_linear_spec(
    quantize_fprop: bool = True, quantize_dgrad: bool = True, quantize_wgrad: bool = True
) -> LinearSpec:
    """Per-tensor current-scaled E4M3 for every operand (TE Float8CurrentScaling, E4M3 throughout)."""
    tensor = OperandSpec("fp8_tensor")
    return LinearSpec(
        fprop=_gemm_or_none(quantize_fprop, tensor, tensor),
        dgrad=_gemm_or_none(quantize_dgrad, tensor, tensor),
        wgrad=_gemm_or_none(quantize_wgrad, tensor, tensor),
    )


LINEAR_SPEC_BUILDERS = {
    "nvfp4": nvfp4_linear_spec,
    "mxfp4": mxfp4_linear_spec,
    "mxfp8": mxfp8_linear_spec,
    "fp8_block": fp8_block_linear_spec,
    "fp8_tensor": fp8_tensor_linear_spec,
}
"""Format name -> builder of its LinearSpec (keyword options differ per format)."""


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


def _use_kernel(tensor: torch.Tensor, spec: OperandSpec, transpose: bool) -> bool:
    if not tensor.is_cuda or spec.fmt != "nvfp4":
        return False
    if spec.rht and not transpose:  # the kernels apply the RHT along dim 0 only (Wgrad's case)
        return False
    if transpose and spec.tile == (1, 16) and tensor.shape[0] % 16 != 0:
        return False
    from models.quant import kernels  # imported here: no Triton import on CPU-only runs

    return kernels.supports(tensor)


def _scaled_values_exact(spec: OperandSpec, compute_dtype: torch.dtype) -> bool:
    """Whether q * s_b is exact in the (16-bit) compute dtype, so the GEMM can run on scaled values."""
    if compute_dtype == torch.float32:
        return False  # fp32 compute multiplies fully dequantized operands
    if spec.fmt in ("nvfp4", "fp8_tensor"):
        return True  # |q * s_b| in [2^-10, 2688] with <= 7 significant bits: exact in bf16 and fp16
    if compute_dtype != torch.bfloat16:
        return False  # MX and fp8_block scales span fp32's exponent range; fp16's does not
    return spec.fmt != "fp8_block" or spec.power_of_two_scales


def _quantize_operand(
    tensor: torch.Tensor,
    spec: OperandSpec,
    *,
    transpose: bool,
    compute_dtype: torch.dtype,
    generator: Optional[torch.Generator],
    name: str,
) -> _Operand:
    """Quantize the operand matrix ``tensor.t() if transpose else tensor`` along its last dim."""
    exact = _scaled_values_exact(spec, compute_dtype)
    values_dtype = compute_dtype if exact else torch.float32
    stochastic = spec.rounding == "stochastic"
    if _use_kernel(tensor, spec, transpose):
        from models.quant import kernels

        if transpose and spec.tile == (1, 16):
            out = kernels.nvfp4_quantize_columns(
                tensor, rht=spec.rht, stochastic=stochastic, generator=generator, out_dtype=values_dtype, name=name
            )
        else:  # rows, or a 16x16 tiling, which is the same for the tensor and its transpose
            out = kernels.nvfp4_quantize_rows(
                tensor, two_d=spec.tile == (16, 16), stochastic=stochastic, generator=generator,
                out_dtype=values_dtype, name=name,
            )
        values = out.values.t() if transpose else out.values
        decode = out.decode_scale.reshape(())
    else:
        # A transposed operand stays a view of the tensor's storage: the RHT and the quantizer
        # keep its memory order, and the GEMM takes it as a transposed matrix (no copies).
        matrix = tensor.t() if transpose else tensor
        if spec.rht:
            matrix = rht(matrix, name=name)
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
        )
    if not exact and decode is not None:
        values, decode = values.mul_(decode), None  # (q * s_b) * S_dec: the full fp32 dequantization
    return _Operand(values, decode)


def _high_precision_gemm(a: torch.Tensor, b: torch.Tensor, compute_dtype: torch.dtype) -> torch.Tensor:
    """a [M, R] times b [N, R]^T in the compute dtype, as nn.Linear (under autocast) computes it."""
    return a.to(compute_dtype) @ b.to(compute_dtype).t()


_MM_OUT_DTYPE_WORKS: Optional[bool] = None


def _matmul_fp32_accumulate(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b for bf16/fp16 inputs with an fp32 result (the products are exact; fp32 accumulation)."""
    global _MM_OUT_DTYPE_WORKS
    if a.is_cuda and _MM_OUT_DTYPE_WORKS is not False:
        try:
            result = torch.mm(a, b, out_dtype=torch.float32)
            _MM_OUT_DTYPE_WORKS = True
            return result
        except (TypeError, RuntimeError, NotImplementedError):
            _MM_OUT_DTYPE_WORKS = False
    return a.float() @ b.float()


def _gemm(a: _Operand, b: _Operand, compute_dtype: torch.dtype) -> torch.Tensor:
    """a [M, R] times b [N, R]^T -> [M, N] in the compute dtype."""
    if compute_dtype == torch.float32 or a.values.dtype == torch.float32 or b.values.dtype == torch.float32:
        return (a.dequantized_fp32() @ b.dequantized_fp32().t()).to(compute_dtype)
    out = _matmul_fp32_accumulate(a.values, b.values.t())
    decode = None
    for scale in (a.decode, b.decode):
        if scale is not None:
            decode = scale if decode is None else decode * scale
    if decode is not None:
        out = out * decode
    return out.to(compute_dtype)


class QuantLinearFunction(torch.autograd.Function):
    """Y = X W^T with emulated quantized GEMMs; see the module docstring for the op order."""

    @staticmethod
    def forward(ctx, x, weight, spec: LinearSpec, name: str, generator, compute_dtype):
        x2 = x.reshape(-1, x.shape[-1])
        with torch.autocast(x.device.type, enabled=False):
            if spec.fprop is None:
                out = _high_precision_gemm(x2, weight, compute_dtype)
                saved_weight = None
            else:
                x_op = _quantize_operand(
                    x2, spec.fprop.a, transpose=False, compute_dtype=compute_dtype, generator=generator,
                    name=f"{name} (Fprop X)",
                )
                w_op = _quantize_operand(
                    weight, spec.fprop.b, transpose=False, compute_dtype=compute_dtype, generator=generator,
                    name=f"{name} (Fprop W)",
                )
                out = _gemm(x_op, w_op, compute_dtype)
                saved_weight = w_op if spec.reuses_forward_weight else None
        ctx.spec, ctx.name, ctx.generator, ctx.compute_dtype = spec, name, generator, compute_dtype
        ctx.x_shape, ctx.x_dtype = x.shape, x.dtype
        ctx.has_saved_weight = saved_weight is not None
        ctx.saved_weight_has_decode = saved_weight is not None and saved_weight.decode is not None
        extra = []
        if saved_weight is not None:
            extra.append(saved_weight.values)
            if saved_weight.decode is not None:
                extra.append(saved_weight.decode)
        ctx.save_for_backward(x2, weight, *extra)
        return out.reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad_output):
        x2, weight, *extra = ctx.saved_tensors
        spec: LinearSpec = ctx.spec
        compute_dtype = ctx.compute_dtype
        name, generator = ctx.name, ctx.generator
        dy = grad_output.reshape(-1, grad_output.shape[-1])
        grad_x = grad_weight = None
        with torch.autocast(dy.device.type, enabled=False):
            if ctx.needs_input_grad[0]:
                if spec.dgrad is None:
                    grad_x = _high_precision_gemm(dy, weight.t(), compute_dtype)
                else:
                    dy_op = _quantize_operand(
                        dy, spec.dgrad.a, transpose=False, compute_dtype=compute_dtype, generator=generator,
                        name=f"{name} (Dgrad dY)",
                    )
                    if ctx.has_saved_weight:
                        # The same quantized W as Fprop: [N, K] blocked 16x16, used as W^T [K, N].
                        decode = extra[1] if ctx.saved_weight_has_decode else None
                        w_t_op = _Operand(extra[0].t(), decode)
                    else:
                        w_t_op = _quantize_operand(
                            weight, spec.dgrad.b, transpose=True, compute_dtype=compute_dtype,
                            generator=generator, name=f"{name} (Dgrad W^T)",
                        )
                    grad_x = _gemm(dy_op, w_t_op, compute_dtype)
                grad_x = grad_x.to(ctx.x_dtype).reshape(ctx.x_shape)
            if ctx.needs_input_grad[1]:
                if spec.wgrad is None:
                    grad_weight = _high_precision_gemm(dy.t(), x2.t(), compute_dtype)
                else:
                    dy_t_op = _quantize_operand(
                        dy, spec.wgrad.a, transpose=True, compute_dtype=compute_dtype, generator=generator,
                        name=f"{name} (Wgrad dY^T)",
                    )
                    x_t_op = _quantize_operand(
                        x2, spec.wgrad.b, transpose=True, compute_dtype=compute_dtype, generator=generator,
                        name=f"{name} (Wgrad X^T)",
                    )
                    grad_weight = _gemm(dy_t_op, x_t_op, compute_dtype)
                grad_weight = grad_weight.to(weight.dtype)
        return grad_x, grad_weight, None, None, None, None


def check_linear_shapes(spec: LinearSpec, tokens: int, in_features: int, out_features: int, name: str) -> None:
    """Raise ValueError naming the layer, GEMM, operand and dim if an operand does not divide its blocks."""
    operands = {
        "fprop": (("X", (tokens, in_features), ("tokens", "in_features")),
                  ("W", (out_features, in_features), ("out_features", "in_features"))),
        "dgrad": (("dY", (tokens, out_features), ("tokens", "out_features")),
                  ("W^T", (in_features, out_features), ("in_features", "out_features"))),
        "wgrad": (("dY^T", (out_features, tokens), ("out_features", "tokens")),
                  ("X^T", (in_features, tokens), ("in_features", "tokens"))),
    }
    for gemm in GEMMS:
        gemm_spec = getattr(spec, gemm)
        if gemm_spec is None:
            continue
        for operand_spec, (label, shape, dim_names) in zip((gemm_spec.a, gemm_spec.b), operands[gemm]):
            formats.check_blockable(
                shape, operand_spec.fmt, operand_spec.tile,
                name=f"layer {name!r} ({gemm.capitalize()} {label}, {operand_spec.describe()})",
                dim_names=dim_names,
            )


def adopt_linear_parameters(cls, linear: nn.Linear) -> nn.Linear:
    """An uninitialized ``cls`` (an nn.Linear subclass) holding ``linear``'s very Parameter objects.

    No copy and no re-initialization: the optimizer, FSDP and checkpoints see the same tensors
    and state-dict keys as before the swap. The caller sets its own attributes (spec, name...).
    """
    module = cls.__new__(cls)
    nn.Module.__init__(module)
    module.in_features = linear.in_features
    module.out_features = linear.out_features
    module.register_parameter("weight", linear.weight)
    module.register_parameter("bias", linear.bias)
    module.train(linear.training)
    return module


class QuantLinear(nn.Linear):
    """nn.Linear whose GEMMs follow ``spec`` (same parameters and state-dict keys as nn.Linear).

    ``spec`` may be replaced at any time (late switch to BF16); a spec with no quantized GEMM runs
    exactly ``F.linear``. ``name`` (the module's fully qualified name) appears in every error.
    ``generator``: optional torch.Generator for stochastic rounding (default: torch's global RNG).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        device=None,
        dtype=None,
        *,
        spec: Optional[LinearSpec] = None,
        name: str = "",
    ):
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.spec = spec if spec is not None else LinearSpec()
        self.name = name
        self.generator: Optional[torch.Generator] = None

    @classmethod
    def from_linear(cls, linear: nn.Linear, spec: LinearSpec, *, name: str = "") -> "QuantLinear":
        """Wrap an existing nn.Linear, keeping the very same Parameter objects (no copy)."""
        module = adopt_linear_parameters(cls, linear)
        module.spec = spec
        module.name = name
        module.generator = None
        return module

    def compute_dtype(self, x: torch.Tensor) -> torch.dtype:
        """The GEMM dtype: autocast's when autocast is on for x's device, else x's dtype."""
        if torch.is_autocast_enabled(x.device.type):
            return torch.get_autocast_dtype(x.device.type)
        return x.dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        spec = self.spec
        if not spec.quantized:
            return F.linear(x, self.weight, self.bias)
        if spec.backend not in BACKENDS:
            raise NotImplementedError(
                f"layer {self.name!r}: backend {spec.backend!r} is not run by QuantLinear (only {BACKENDS}); "
                f"the te/torch backends are set up by models.quant.recipe"
            )
        if x.shape[-1] != self.in_features:
            raise ValueError(f"layer {self.name!r}: input last dim {x.shape[-1]} != in_features {self.in_features}")
        tokens = x.numel() // self.in_features
        check_linear_shapes(spec, tokens, self.in_features, self.out_features, self.name)
        compute_dtype = self.compute_dtype(x)
        out = QuantLinearFunction.apply(x, self.weight, spec, self.name, self.generator, compute_dtype)
        if self.bias is not None:
            out = out + self.bias.to(out.dtype)
        return out

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, name={self.name!r}, spec=({self.spec.describe()})"
