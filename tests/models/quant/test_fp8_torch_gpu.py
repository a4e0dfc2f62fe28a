"""The torch FP8 backend on a Hopper GPU: fused quantizer, native GEMMs, the layer, a model.

Run on the GPU machine: ``pytest -m gpu tests/models/quant/test_fp8_torch_gpu.py``.

Tolerances. Quantized operands are compared bit for bit. A native GEMM multiplies the same E4M3
codes and decode scales as the emulated path, so the products are identical and only the
accumulation differs: cuBLAS accumulates each 128-long block on the FP8 tensor cores, whose adder
keeps ~13 mantissa bits and truncates (DeepSeek-V3 report sec. 3.3.2: "around 14 bits"; Khattak &
Mikaitis 2025 model H100 FP8 MMA as e8m13 accumulation), then scales and adds the blocks in fp32.
Per output element that error is at most a few units of 2^-13 of S = sum_k |a_k b_k| per block;
we allow 2^-8 * S (fp32 output), plus 2^-8 * |reference| where outputs are rounded to bf16 (one
bf16 rounding of slightly different fp32 values can land one ulp apart). A wrong scale, layout or
orientation moves an element by O(S), and FP8 quantization itself by ~2^-4 * S, so the bound still
separates right from wrong by more than an order of magnitude. On operands built to be summed
exactly (small integers times per-tile powers of two, every block sum below 2^13) the native and
emulated results must be equal, bit for bit, and equal the fp64 product.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

from models.quant import formats, fp8_torch, kernels
from models.quant.fp8_torch import Fp8Operand, TorchFp8Linear, fp8_gemm, quantize_operands, quantize_reference
from models.quant.gemm_spec import OperandSpec, fp8_block_linear_spec, fp8_tensor_linear_spec
from models.quant.kernels import fp8 as fp8_kernels
from models.quant.kernels.options import Fp8Options
from models.quant.linear import QuantLinear

pytestmark = pytest.mark.gpu

VECTOR = OperandSpec("fp8_block", (1, 128))
TILE = OperandSpec("fp8_block", (128, 128))
TENSOR = OperandSpec("fp8_tensor")
ACCUMULATION = 2.0**-8
BF16_ROUNDING = 2.0**-8


@pytest.fixture(autouse=True)
def _hopper_and_switches():
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("PyTorch runs blockwise FP8 GEMMs on compute capability 9.x only")
    assert fp8_torch.has_blockwise_scaled_mm(), f"torch {torch.__version__} lacks torch.nn.functional.scaled_mm"
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # the references are true fp32 / fp64 matmuls
    kernels.use_triton(True)
    yield
    kernels.use_triton(True)
    torch.backends.cuda.matmul.allow_tf32 = tf32


def _poison_allocator(numel_bytes: int) -> None:
    """Fill the caching allocator's free memory with 0xFF (NaN codes), so an unwritten output shows."""
    torch.empty(numel_bytes, dtype=torch.uint8, device="cuda").fill_(0xFF)
    torch.cuda.synchronize()


def _fresh(rows: int, cols: int, dtype: torch.dtype, *, specials: bool = True) -> torch.Tensor:
    scale = float(torch.empty(()).uniform_(-3, 3).exp())
    x = torch.randn(rows, cols, device="cuda", dtype=torch.float32) * scale
    outliers = torch.randint(0, rows * cols, (max(1, rows * cols // 300),), device="cuda")
    x.view(-1)[outliers] *= 60.0
    x *= torch.rand(rows, 1, device="cuda") + 0.05  # rows (tokens) of different magnitude
    if specials:
        r = torch.randint(0, rows, (4,)).tolist()
        x[r[0], :128] = 0.0
        x[r[1], cols - 128:] = torch.randn(128, device="cuda") * 1e-37  # 448 / amax overflows fp32
        x[r[2], torch.randint(0, cols, (1,)).item()] = float("nan")
        x[r[3], torch.randint(0, cols, (1,)).item()] = float("inf")
    return x.to(dtype)


def _exact(rows: int, cols: int, *, tile_exponents: bool = True) -> torch.Tensor:
    """Operands that FP8 represents exactly and whose GEMMs sum exactly on any accumulator.

    Entries in {-1, 0, 1} with a +-7 on each 128x128 tile's diagonal (so every 1x128 block, every
    128x1 block and every tile has amax 7: scale 64, codes 64 k), times 2^e per 128x128 tile,
    e in {-1, 0, 1}: different decode scales per tile, so a misplaced scale changes the result.
    A 128-long block sum of codes is 4096 * (at most ~200): 8 significant bits, far inside the
    tensor cores' accumulator. Per tensor (one scale) the tile exponents are left out, so codes
    stay multiples of 64 and a 640-long sum stays within 10 significant bits.
    """
    values = torch.randint(-1, 2, (rows, cols), device="cuda").float()
    r = torch.arange(rows, device="cuda")[:, None] % 128
    c = torch.arange(cols, device="cuda")[None, :] % 128
    signs = torch.randint(0, 2, (rows, cols), device="cuda").float() * 2 - 1
    values = torch.where(r == c, 7.0 * signs, values)
    if not tile_exponents:
        return values
    exponents = torch.randint(-1, 2, (rows // 128, cols // 128), device="cuda").float()
    return values * torch.exp2(exponents).repeat_interleave(128, 0).repeat_interleave(128, 1)


def _same_codes(actual: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    both_nan = actual.float().isnan() & expected.float().isnan()
    return (actual.view(torch.uint8) == expected.view(torch.uint8)) | both_nan


def _assert_operands_identical(actual: Fp8Operand, expected: Fp8Operand, what: str) -> None:
    assert actual.kind == expected.kind and actual.data.shape == expected.data.shape, what
    assert actual.data.is_contiguous(), what
    assert actual.scale.shape == expected.scale.shape and actual.scale.stride() == expected.scale.stride(), what
    same = _same_codes(actual.data, expected.data)
    assert same.all(), f"{what}: {int((~same).sum())} of {same.numel()} codes differ"
    a, e = actual.natural_scales(), expected.natural_scales()
    same = (a.contiguous().view(torch.int32) == e.contiguous().view(torch.int32)) | (a.isnan() & e.isnan())
    assert same.all(), f"{what}: {int((~same).sum())} of {same.numel()} scales differ"
    if actual.kind == "128x128":  # cuBLASLt's padding rows
        assert (actual.scale[actual.data.shape[1] // 128:] == 0).all(), what


# ----------------------------------------------------------------------------------------------
# Fused quantizer vs the torch reference


def _tile(kind: str):
    return (1, 128) if kind == "1x128" else (128, 128)


@pytest.mark.parametrize("shape", [(128, 128), (256, 640), (384, 384), (8192, 5120)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("kind,rows_pow2,columns_pow2", [
    ("1x128", True, True), ("1x128", True, False), ("1x128", False, True), ("128x128", True, True),
    ("128x128", False, False),
])
def test_fused_quantizer_bit_identical_to_reference(shape, dtype, kind, rows_pow2, columns_pow2):
    x = _fresh(*shape, dtype)
    _poison_allocator(4 * x.numel())
    rows_spec = OperandSpec("fp8_block", _tile(kind), power_of_two_scales=rows_pow2)
    columns_spec = OperandSpec("fp8_block", _tile(kind), power_of_two_scales=columns_pow2)
    rows, columns = quantize_operands(x, rows_spec, columns_spec, name="x")
    _assert_operands_identical(rows, quantize_reference(x, kind, power_of_two_scales=rows_pow2), "rows")
    _assert_operands_identical(columns, quantize_reference(x, kind, power_of_two_scales=columns_pow2, transpose=True),
                               "columns")


@pytest.mark.parametrize("shape", [(128, 128), (256, 640), (8192, 5120)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("case", ["finite", "tiny amax", "with NaN", "ragged rows only", "transposed view"])
def test_per_tensor_kernel_bit_identical_to_reference(shape, dtype, case):
    """fp8_tensor (Float8CurrentScaling): the Triton pass's codes of x and x^T and its decode scale."""
    rows_only = case == "ragged rows only"
    x = _fresh(shape[0] - 56 if rows_only else shape[0], shape[1], dtype, specials=case == "with NaN")
    if case == "tiny amax":  # 448 / amax overflows fp32: the scale is FLT_MAX, not the dtype's maximum
        x = (x.float() / x.float().abs().max() * 1e-37).to(dtype)
    if case == "transposed view":
        x = x.t().contiguous().t()
    _poison_allocator(4 * x.numel())
    assert fp8_kernels.supports(x) and fp8_kernels.supports_tensor_shape(x.shape, not rows_only)
    rows, columns = quantize_operands(x, TENSOR, None if rows_only else TENSOR, name="x")
    _assert_operands_identical(rows, quantize_reference(x, "tensor"), "rows")
    if rows_only:
        assert columns is None
    else:
        _assert_operands_identical(columns, quantize_reference(x, "tensor", transpose=True), "columns")


@pytest.mark.parametrize("shape", [(256, 640), (8192, 5120)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("two_pass", [(32, 32), (64, 16), (64, 64), (128, 128)])
def test_two_pass_quantization_bit_identical_to_reference(shape, dtype, two_pass):
    """Fp8Options' rows-only plus columns-only passes, of several tile shapes, give the reference's codes and scales."""
    options = Fp8Options(rows_pass_tile_rows=two_pass[0], columns_pass_tile_cols=two_pass[1])
    x = _fresh(*shape, dtype)
    _poison_allocator(4 * x.numel())
    for kind, tile_2d in (("1x128", False), ("128x128", True)):  # 2D tiles are read once for both
        row_codes, row_scales, col_codes, col_scales = fp8_kernels.fp8_block_quantize(
            x, tile_2d=tile_2d, rows=True, columns=True, options=options)
        _assert_operands_identical(Fp8Operand(row_codes, row_scales, kind), quantize_reference(x, kind), kind)
        _assert_operands_identical(Fp8Operand(col_codes, col_scales, kind),
                                   quantize_reference(x, kind, transpose=True), kind)
    row_codes, col_codes, decode = fp8_kernels.fp8_tensor_quantize(x, rows=True, columns=True, options=options)
    _assert_operands_identical(Fp8Operand(row_codes, decode, "tensor"), quantize_reference(x, "tensor"), "tensor")
    _assert_operands_identical(Fp8Operand(col_codes, decode, "tensor"), quantize_reference(x, "tensor", transpose=True),
                               "tensor")


@pytest.mark.parametrize("layout", ["ragged rows", "strided", "transposed view", "float16"])
def test_fused_quantizer_inputs_of_every_layout(layout):
    if layout == "ragged rows":  # rows-only, 200 tokens: the tail tile is masked, nothing padded
        x = _fresh(200, 256, torch.bfloat16, specials=False)
        rows, columns = quantize_operands(x, VECTOR, None, name="x")
        assert columns is None
        _assert_operands_identical(rows, quantize_reference(x, "1x128"), layout)
        return
    if layout == "strided":
        x = _fresh(256, 768, torch.bfloat16)[:, ::2]
    elif layout == "transposed view":
        x = _fresh(512, 256, torch.float32).t()
    else:
        x = _fresh(256, 384, torch.float16, specials=False)
    assert fp8_kernels.supports(x)
    rows, columns = quantize_operands(x, VECTOR, VECTOR, name="x")
    _assert_operands_identical(rows, quantize_reference(x, "1x128"), layout)
    _assert_operands_identical(columns, quantize_reference(x, "1x128", transpose=True), layout)


def test_reference_matches_formats_on_gpu():
    x = _fresh(256, 384, torch.bfloat16)
    for kind, tile in (("1x128", (1, 128)), ("128x128", (128, 128))):
        expected = formats.quantize(x, "fp8_block", tile=tile)
        operand = quantize_reference(x, kind)
        assert _same_codes(operand.data, expected.codes).all(), kind
        assert torch.equal(operand.natural_scales().nan_to_num(-1.0), expected.block_scales.nan_to_num(-1.0)), kind


# ----------------------------------------------------------------------------------------------
# Native GEMMs


def _gemm_operands(gemm: str, a_matrix: torch.Tensor, b_matrix: torch.Tensor):
    """The operands of one of the layer's GEMMs, produced as the layer produces them.

    fprop: a = X [T, K], b = W [N, K]; dgrad: a = dY [T, N], b = W^T from W [N, K]; wgrad:
    a = dY^T from dY [T, N], b = X^T from X [T, K]; tensor: a = X, b = W per tensor.
    Returns (a, b, a_matrix_as_operand, b_matrix_as_operand) with the high-precision operands.
    """
    if gemm == "fprop":
        return quantize_operands(a_matrix, VECTOR, None)[0], quantize_operands(b_matrix, TILE, None)[0], a_matrix, b_matrix
    if gemm == "dgrad":
        return (quantize_operands(a_matrix, VECTOR, None)[0], quantize_operands(b_matrix, None, TILE)[1],
                a_matrix, b_matrix.t())
    if gemm == "wgrad":
        return (quantize_operands(a_matrix, None, VECTOR)[1], quantize_operands(b_matrix, None, VECTOR)[1],
                a_matrix.t(), b_matrix.t())
    return quantize_operands(a_matrix, TENSOR, None)[0], quantize_operands(b_matrix, TENSOR, None)[0], a_matrix, b_matrix


# (a matrix shape, b matrix shape): T = 384 tokens, K = 640 (5 blocks: L4 = 8), N = 384 (3 blocks: L4 = 4)
GEMM_SHAPES = {"fprop": ((384, 640), (384, 640)), "dgrad": ((384, 384), (384, 640)),
               "wgrad": ((384, 384), (384, 640)), "tensor": ((384, 640), (256, 640))}


@pytest.mark.parametrize("gemm", ["fprop", "dgrad", "wgrad", "tensor"])
def test_native_gemm_is_exact_on_exactly_summable_operands(gemm):
    a_shape, b_shape = GEMM_SHAPES[gemm]
    per_tile = gemm != "tensor"
    a, b, a_hp, b_hp = _gemm_operands(gemm, _exact(*a_shape, tile_exponents=per_tile),
                                      _exact(*b_shape, tile_exponents=per_tile))
    assert torch.equal(a.dequantize(), a_hp) and torch.equal(b.dequantize(), b_hp), "lossless by construction"
    exact = a_hp.double() @ b_hp.double().t()
    assert torch.equal(fp8_gemm(a, b, torch.float32), exact.float())
    assert torch.equal(fp8_gemm(a, b, torch.bfloat16), exact.to(torch.bfloat16))


@pytest.mark.parametrize("gemm", ["fprop", "dgrad", "wgrad", "tensor"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_native_gemm_matches_dequantized_matmul(gemm, dtype):
    a_shape, b_shape = GEMM_SHAPES[gemm]
    a, b, a_hp, b_hp = _gemm_operands(gemm, _fresh(*a_shape, dtype, specials=False), _fresh(*b_shape, dtype, specials=False))
    # The dequantized operands from formats (the emulated path's numbers), not from our quantizer.
    fmt = "fp8_tensor" if gemm == "tensor" else "fp8_block"
    a_tile = None if gemm == "tensor" else (1, 128)
    b_tile = None if gemm == "tensor" else ((128, 128) if gemm in ("fprop", "dgrad") else (1, 128))
    a_hat = formats.quantize(a_hp.contiguous(), fmt, tile=a_tile).dequantize(torch.float64)
    b_hat = formats.quantize(b_hp.contiguous(), fmt, tile=b_tile).dequantize(torch.float64)
    assert torch.equal(a.dequantize().double(), a_hat) and torch.equal(b.dequantize().double(), b_hat)
    reference = a_hat @ b_hat.t()
    bound = a_hat.abs() @ b_hat.abs().t()
    out = fp8_gemm(a, b, torch.float32).double()
    observed = ((out - reference).abs() / bound).max().item()
    print(f"{gemm} {dtype}: native fp32 output vs fp64 product of the dequantized operands: max |err| / S = "
          f"{observed:.3g} (2^{torch.tensor(observed).log2().item():.1f}); allowed 2^-8")
    excess = (out - reference).abs() - ACCUMULATION * bound
    assert (excess <= 0).all(), f"{gemm}: max |err| / S = {observed:.3g}"
    out = fp8_gemm(a, b, torch.bfloat16).double()
    excess = (out - reference).abs() - ACCUMULATION * bound - BF16_ROUNDING * reference.abs()
    assert (excess <= 0).all(), f"{gemm} bf16: max excess {excess.max().item():.3g}"


# ----------------------------------------------------------------------------------------------
# The layer against the emulated path


def _layers(spec, in_features=640, out_features=384, dtype=torch.float32, name="layers.1.mixer.up_proj"):
    linear = nn.Linear(in_features, out_features, bias=False, device="cuda", dtype=dtype)
    return (TorchFp8Linear.from_linear(linear, spec, name=name), QuantLinear.from_linear(linear, spec, name=name),
            linear)


def _run(module, x, grad_output, autocast_dtype=None):
    x = x.clone().requires_grad_(True)
    module.weight.grad = None
    with torch.autocast("cuda", dtype=autocast_dtype or torch.bfloat16, enabled=autocast_dtype is not None):
        y = module(x)
    y.backward(grad_output.to(y.dtype))
    return y.detach(), x.grad, module.weight.grad.clone()


def test_layer_equals_emulated_and_exact_products_on_exact_operands():
    native, emulated, linear = _layers(fp8_block_linear_spec())
    with torch.no_grad():
        linear.weight.copy_(_exact(384, 640))
    x, grad_output = _exact(384, 640), _exact(384, 384)
    got, want = _run(native, x, grad_output), _run(emulated, x, grad_output)
    w = linear.weight.detach().double()
    exact = (x.double() @ w.t(), grad_output.double() @ w, grad_output.double().t() @ x.double())
    for name, a, b, e in zip(("Y", "dX", "dW"), got, want, exact):
        assert torch.equal(a, b), f"{name}: native != emulated"
        assert torch.equal(a, e.float()), f"{name}: != fp64 product"


@pytest.mark.parametrize("spec_builder,autocast_dtype", [
    (lambda: fp8_block_linear_spec(), torch.bfloat16),
    (lambda: fp8_block_linear_spec(), None),
    (lambda: fp8_block_linear_spec(power_of_two_scales=False), torch.bfloat16),
    (lambda: fp8_tensor_linear_spec(), torch.bfloat16),
    (lambda: fp8_block_linear_spec(quantize_fprop=False), torch.bfloat16),
])
def test_layer_matches_emulated_on_random_data(spec_builder, autocast_dtype):
    native, emulated, linear = _layers(spec_builder())
    with torch.no_grad():
        linear.weight.copy_(_fresh(384, 640, torch.float32, specials=False) * 0.02)
    x = _fresh(384, 640, torch.float32, specials=False).reshape(3, 128, 640)
    grad_output = _fresh(384, 384, torch.bfloat16, specials=False).reshape(3, 128, 384)
    got = _run(native, x, grad_output, autocast_dtype)
    want = _run(emulated, x, grad_output, autocast_dtype)
    w, x2, dy = linear.weight.detach().double().abs(), x.reshape(-1, 640).double().abs(), grad_output.reshape(-1, 384).double().abs()
    growth = (1 + 2.0**-4) ** 2  # |code * decode| <= (1 + 2^-4) |x|: the bound of |a_hat||b_hat| from |a||b|
    bounds = (x2 @ w.t(), dy @ w, dy.t() @ x2)
    for name, a, b, bound in zip(("Y", "dX", "dW"), got, want, bounds):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        tol = ACCUMULATION * growth * bound.reshape(a.shape)
        if autocast_dtype is not None:
            tol = tol + BF16_ROUNDING * b.double().abs()
        err = (a.double() - b.double()).abs()
        assert (err <= tol).all(), f"{name}: max |err| / S = {(err / (growth * bound.reshape(a.shape))).max().item():.3g}"


def test_layer_makes_no_host_syncs():
    native, _, linear = _layers(fp8_block_linear_spec(), dtype=torch.bfloat16)
    x = torch.randn(512, 640, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    grad_output = torch.randn(512, 384, device="cuda", dtype=torch.bfloat16)
    native(x).backward(grad_output)  # warm-up: Triton compiles, capabilities are cached
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        native(x).backward(grad_output)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("spec_builder", [lambda: fp8_block_linear_spec(), lambda: fp8_tensor_linear_spec()],
                         ids=["blockwise", "tensor"])
def test_layer_compiled_fullgraph_matches_eager(spec_builder):
    """torch.compile traces the layer whole (the quantizers and the scaled-mm GEMMs as opaque ops, no
    graph break) and gives the eager results bit for bit."""
    native, _, linear = _layers(spec_builder(), dtype=torch.bfloat16)
    compiled = torch.compile(native, backend="inductor", fullgraph=True)
    x = _fresh(384, 640, torch.bfloat16, specials=False).reshape(3, 128, 640)
    grad_output = _fresh(384, 384, torch.bfloat16, specials=False).reshape(3, 128, 384)
    eager_results = _run(native, x, grad_output, torch.bfloat16)
    compiled_results = _run(compiled, x, grad_output, torch.bfloat16)
    for name, got, want in zip(("Y", "dX", "dW"), compiled_results, eager_results):
        assert torch.isfinite(got).all(), name
        assert torch.equal(got, want), f"{name}: compiled != eager"


def test_inference_with_any_token_count_and_the_late_switch():
    native, _, linear = _layers(fp8_block_linear_spec(), dtype=torch.bfloat16)
    x = torch.randn(200, 640, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        fused = native(x)
        kernels.use_triton(False)
        reference = native(x)
        kernels.use_triton(True)
    assert torch.equal(fused, reference), "200 tokens: masked tail tile, same codes, same GEMM"
    native.set_high_precision(("fprop",))
    with torch.no_grad():
        assert torch.equal(native(x), torch.nn.functional.linear(x, linear.weight))


# ----------------------------------------------------------------------------------------------
# A model


def _tiny_config():
    from models import ModelConfig

    # Every linear of the blocks divides 128: in_proj 2*256 + 2*1*64 + 128 = 768, q 256, k/v 128.
    return ModelConfig(
        name="tiny128", pattern="M-M*M-", vocab_size=256, hidden_size=128, ffn_hidden_size=256,
        num_attention_heads=4, num_key_value_heads=2, attention_head_dim=64, mamba_num_heads=128,
        mamba_head_dim=2, ssm_state_size=64, mamba_num_groups=1, conv_kernel=4, chunk_size=64,
        ssd_backend="torch", gated_norm_backend="torch", conv_backend="conv1d",
    )


def test_tiny_model_trains_with_the_torch_backend():
    from models import build_model
    from models.quant.config import PrecisionConfig
    from models.quant.recipe import apply_precision

    torch.manual_seed(0)
    with torch.device("cuda"):
        model = build_model(_tiny_config())
    model.init_weights()
    emulated_model = copy.deepcopy(model)
    bf16_model = copy.deepcopy(model)
    cfg = PrecisionConfig(name="fp8", format="fp8_block", backend="torch")
    plan = apply_precision(model, cfg)
    emulated_plan = apply_precision(emulated_model, PrecisionConfig(name="fp8", format="fp8_block", backend="emulated"))
    assert plan.backend == "torch" and emulated_plan.backend == "emulated"
    converted = [name for name, module in model.named_modules() if isinstance(module, TorchFp8Linear)]
    linears = [name for name, module in model.named_modules() if isinstance(module, nn.Linear) and name != "lm_head"]
    assert converted == linears and len(converted) == 14, converted  # 3 Mamba x 2, 2 MLP x 2, 1 attention x 4

    tokens = torch.randint(0, 256, (2, 129), device="cuda")
    inputs, labels = tokens[:, :-1], tokens[:, 1:]
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        native_logits, emulated_logits = model(inputs).float(), emulated_model(inputs).float()
        bf16_logits = bf16_model(inputs).float()
    # Per GEMM the two paths differ only by the tensor cores' accumulation (layer tests above);
    # through 14 layers such differences flip some FP8 roundings downstream, so compare with the
    # size of FP8 quantization itself: native must sit well closer to emulated than FP8 to BF16.
    relative = (native_logits - emulated_logits).norm() / emulated_logits.norm()
    quantization = (bf16_logits - emulated_logits).norm() / emulated_logits.norm()
    assert relative < 0.5 * quantization, (
        f"native vs emulated logits {relative.item():.3g}; FP8 vs BF16 {quantization.item():.3g}")

    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for step in range(6):
        if step == 4:
            plan.switch_to_bf16("forward")  # the late switch reaches the native layers
            assert all(module.spec.fprop is None for module in plan.modules.values())
        plan.set_step(step)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(model(inputs).float().reshape(-1, 256), labels.reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses))), losses
    assert losses[-1] < losses[0], f"the same batch six times should lower the loss: {losses}"


@pytest.mark.parametrize("mode", ["1x128 both", "1x128 rows", "1x128 rows (ragged)", "1x128 columns", "128x128 both",
                                  "128x128 rows", "128x128 columns", "tensor both", "tensor rows (ragged)",
                                  "tensor columns"])
def test_compiled_quantize_ops_equal_the_kernels_and_their_fakes(mode):
    """The opaque ops compiled code calls (fp8_kernels, pytorch#189271) return the kernels' bits,
    and their fake implementations the real outputs' shapes, strides and dtypes: a compiled graph
    plans its buffers from the fakes."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    num_rows = 200 if "ragged" in mode else 256
    x = torch.randn(num_rows, 384, device="cuda", dtype=torch.bfloat16) * 3
    rows, columns = "columns" not in mode, "rows" not in mode
    if mode.startswith("tensor"):
        call = lambda t: fp8_kernels.tensor_quantize_op(t, rows=rows, columns=columns)  # noqa: E731
        direct = fp8_kernels.fp8_tensor_quantize(x, rows=rows, columns=columns)
    else:
        tile_2d = mode.startswith("128x128")
        call = lambda t: fp8_kernels.block_quantize_op(t, tile_2d=tile_2d, rows=rows, columns=columns)  # noqa: E731
        direct = fp8_kernels.fp8_block_quantize(x, tile_2d=tile_2d, rows=rows, columns=columns)
    real = call(x)
    with FakeTensorMode() as fake_mode:
        fake = call(fake_mode.from_tensor(x))
    assert len(real) == len(direct) == len(fake)
    for index, (got, want, planned) in enumerate(zip(real, direct, fake)):
        assert (got is None) == (want is None) == (planned is None), index
        if got is None:
            continue
        assert (got.shape, got.stride(), got.dtype) == (want.shape, want.stride(), want.dtype), index
        assert (planned.shape, planned.stride(), planned.dtype) == (got.shape, got.stride(), got.dtype), index
        if got.dtype == torch.float8_e4m3fn:
            assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), index
        else:
            assert torch.equal(got, want), index
