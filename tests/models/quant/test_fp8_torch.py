"""The torch FP8 backend on the CPU: its quantizer against formats.quantize and ml_dtypes, the scale
layouts against torch's own scaled-mm checks, the per-tensor layer end to end (torch runs per-tensor
FP8 GEMMs on the CPU), and the layer's contract (parameters, spec checks, errors, late switch).

Blockwise GEMMs only run on CUDA SM 9.x: tests/models/quant/test_fp8_torch_gpu.py checks them there.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

from models.quant import formats
from models.quant import fp8_torch
from models.quant.fp8_torch import (
    Fp8Operand,
    TorchFp8Linear,
    check_spec,
    fp8_gemm,
    gemm_layout_scales,
    quantize_operands,
    quantize_reference,
)
from models.quant.gemm_spec import (
    GemmSpec,
    LinearSpec,
    OperandSpec,
    fp8_block_linear_spec,
    fp8_tensor_linear_spec,
    nvfp4_linear_spec,
)
from models.quant.linear import QuantLinear

import quant_oracles as oracle

KIND_TILES = {"1x128": (1, 128), "128x128": (128, 128)}


def _fresh(rows: int, cols: int, dtype: torch.dtype, *, specials: bool = True) -> torch.Tensor:
    """Random normal (scale drawn per call) with outliers and, if asked, the edge-case blocks:
    all-zero, tiny (scale 448/amax overflows to Inf in fp32, so the dtype's max is used), NaN, Inf."""
    scale = float(torch.empty(()).uniform_(-3, 3).exp())
    x = torch.randn(rows, cols, dtype=torch.float64) * scale
    outliers = torch.randint(0, rows * cols, (max(1, rows * cols // 300),))
    x.view(-1)[outliers] *= 60.0
    if specials:
        r = torch.randint(0, rows, (4,)).tolist()
        x[r[0], :128] = 0.0
        if dtype != torch.float16:  # fp16 cannot hold values below 448 / FLT_MAX
            x[r[1], 128:256] = torch.randn(128, dtype=torch.float64) * 1e-37
        x[r[2], torch.randint(0, cols, (1,)).item()] = float("nan")
        x[r[3], torch.randint(0, cols, (1,)).item()] = -float("inf")
    return x.to(dtype)


def _assert_codes_equal(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    assert actual.dtype == expected.dtype == torch.float8_e4m3fn, what
    assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
    differ = actual.view(torch.uint8) != expected.view(torch.uint8)
    assert not differ.any(), f"{what}: {int(differ.sum())} of {differ.numel()} codes differ"


def _assert_scales_equal(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
    same = (actual.contiguous().view(torch.int32) == expected.contiguous().view(torch.int32))
    same |= actual.isnan() & expected.isnan()
    assert same.all(), f"{what}: {int((~same).sum())} of {same.numel()} scales differ"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
@pytest.mark.parametrize("power_of_two", [True, False])
@pytest.mark.parametrize("kind", ["1x128", "128x128"])
@pytest.mark.parametrize("transpose", [False, True])
def test_reference_quantizer_is_formats_bit_for_bit(dtype, power_of_two, kind, transpose):
    x = _fresh(256, 384, dtype)
    operand = quantize_reference(x, kind, power_of_two_scales=power_of_two, transpose=transpose)
    matrix = x.t().contiguous() if transpose else x
    expected = formats.quantize(matrix, "fp8_block", tile=KIND_TILES[kind], power_of_two_scales=power_of_two)
    _assert_codes_equal(operand.data, expected.codes, f"{kind} codes")
    _assert_scales_equal(operand.natural_scales(), expected.block_scales, f"{kind} decode scales")
    assert operand.data.shape == matrix.shape and operand.data.is_contiguous()
    # Something non-trivial happened: NaN blocks decode to NaN, the zero block to scale 1.
    assert operand.natural_scales().isnan().any()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_reference_per_tensor_is_formats_bit_for_bit(dtype):
    x = _fresh(128, 256, dtype, specials=False)
    operand = quantize_reference(x, "tensor")
    expected = formats.quantize(x, "fp8_tensor")
    _assert_codes_equal(operand.data, expected.codes, "per-tensor codes")
    _assert_scales_equal(operand.scale, expected.tensor_scale, "per-tensor decode scale")
    assert operand.scale.dim() == 0


@pytest.mark.parametrize("power_of_two", [True, False])
@pytest.mark.parametrize("kind", ["1x128", "128x128"])
def test_dequantized_operand_matches_ml_dtypes_oracle(power_of_two, kind):
    """An oracle that never touches models.quant: numpy fp32 arithmetic and ml_dtypes' E4M3 cast."""
    x = _fresh(256, 512, torch.float32, specials=False)
    x[3, :128] = 0.0
    operand = quantize_reference(x, kind, power_of_two_scales=power_of_two)
    expected = oracle.fp8_scaled(oracle.to_numpy_f32(x), KIND_TILES[kind], power_of_two=power_of_two,
                                 value_for_inf=float(np.finfo(np.float32).max))
    np.testing.assert_array_equal(operand.dequantize().numpy(), expected["xhat"])
    np.testing.assert_array_equal(operand.natural_scales().numpy(), expected["decode"])


def test_gemm_layout_strides_and_padding():
    natural = torch.rand(6, 3) + 0.5  # 6 row blocks, 3 reduction blocks
    one_d = gemm_layout_scales(natural, "1x128")
    assert one_d.shape == (6, 3) and one_d.stride() == (1, 6), "1x128 scales must be outer-dim-major"
    assert torch.equal(one_d, natural)
    two_d = gemm_layout_scales(natural, "128x128")
    assert two_d.shape == (4, 6) and two_d.stride() == (1, 4), "128x128 scales: [L4, m/128], strides (1, L4)"
    assert torch.equal(two_d[:3].t(), natural) and torch.equal(two_d[3], torch.zeros(6))
    operand = Fp8Operand(torch.zeros(6 * 128, 3 * 128, dtype=torch.float8_e4m3fn), two_d, "128x128")
    assert torch.equal(operand.natural_scales(), natural)
    assert gemm_layout_scales(torch.tensor([[0.25]]), "tensor").dim() == 0


def _fake_operand(rows: int, reduction: int, kind: str) -> Fp8Operand:
    data = torch.empty(rows, reduction, dtype=torch.float8_e4m3fn, device="cuda")
    if kind == "tensor":
        natural = torch.empty((), device="cuda")
    else:
        tile = KIND_TILES[kind]
        natural = torch.empty(rows // tile[0], reduction // 128, device="cuda")
    return Fp8Operand(data, gemm_layout_scales(natural, kind), kind)


@pytest.mark.parametrize("pair", fp8_torch.SUPPORTED_PAIRS)
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_scaled_mm_accepts_our_layouts(pair, out_dtype):
    """torch's own shape/stride checks of the CUDA scaled matmul (its meta functions, run on fake
    CUDA tensors) accept every operand pair the layer feeds it, with reduction blocks (5 and 3) that
    need cuBLASLt's padding to a multiple of 4."""
    if pair[0] != "tensor" and not fp8_torch.has_blockwise_scaled_mm():
        pytest.skip(f"torch {torch.__version__} has no torch.nn.functional.scaled_mm")
    from torch._subclasses.fake_tensor import FakeTensorMode

    for m, n, r in ((256, 384, 640), (384, 128, 384)):
        with FakeTensorMode():
            out = fp8_gemm(_fake_operand(m, r, pair[0]), _fake_operand(n, r, pair[1]), out_dtype)
            assert tuple(out.shape) == (m, n) and out.dtype == out_dtype


def test_scaled_mm_check_rejects_row_major_activation_scales():
    """The check the previous test relies on does bite: 1x128 scales in row-major order are refused."""
    if not fp8_torch.has_blockwise_scaled_mm():
        pytest.skip(f"torch {torch.__version__} has no torch.nn.functional.scaled_mm")
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        a = _fake_operand(256, 640, "1x128")
        b = _fake_operand(384, 640, "128x128")
        bad = Fp8Operand(a.data, torch.empty(256, 5, device="cuda"), "1x128")  # strides (5, 1)
        with pytest.raises(RuntimeError):
            fp8_gemm(bad, b, torch.bfloat16)


def test_quantize_operands_gives_both_orientations_from_the_high_precision_tensor():
    x = _fresh(256, 384, torch.bfloat16, specials=False)
    vector = OperandSpec("fp8_block", (1, 128))
    rows, columns = quantize_operands(x, vector, vector, name="x")
    _assert_codes_equal(rows.data, formats.quantize(x, "fp8_block", tile=(1, 128)).codes, "rows")
    _assert_codes_equal(columns.data, formats.quantize(x.t().contiguous(), "fp8_block", tile=(1, 128)).codes,
                        "columns")
    assert columns.data.shape == (384, 256) and columns.scale.stride() == (1, 384)
    weight = OperandSpec("fp8_block", (128, 128))
    w, w_t = quantize_operands(x, weight, weight, name="w")
    assert torch.equal(w_t.data.view(torch.uint8), w.data.t().view(torch.uint8)), "a 128x128 tile transposes"
    assert torch.equal(w_t.natural_scales(), w.natural_scales().t())
    # Mixed kinds: each orientation on its own, still from x.
    w_rows, w_columns = quantize_operands(x, weight, vector, name="w")
    _assert_codes_equal(w_columns.data, columns.data, "1x128 columns next to 128x128 rows")
    assert quantize_operands(x, None, None) == (None, None)


# ----------------------------------------------------------------------------------------------
# The layer


# torch's CPU scaled matmul is a slow reference loop: the per-tensor CPU layers stay small.
def _pair(in_features=128, out_features=96, spec=None, dtype=torch.float32, name="layers.1.mixer.up_proj"):
    linear = nn.Linear(in_features, out_features, bias=False, dtype=dtype)
    spec = spec or fp8_tensor_linear_spec()
    return (TorchFp8Linear.from_linear(linear, spec, name=name), QuantLinear.from_linear(linear, spec, name=name),
            linear)


def _run(module, x, grad_output):
    x = x.clone().requires_grad_(True)
    module.weight.grad = None
    y = module(x)
    y.backward(grad_output)
    return y.detach(), x.grad, module.weight.grad.clone()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_per_tensor_layer_matches_emulated_on_cpu(dtype):
    """All three GEMMs through torch._scaled_mm (CPU) against the emulated path on the same weights."""
    native, emulated, linear = _pair(dtype=dtype)
    with torch.no_grad():
        linear.weight.copy_(torch.randn_like(linear.weight) * 0.1)
    x = torch.randn(2, 16, 128, dtype=dtype)
    grad_output = torch.randn(2, 16, 96, dtype=dtype)
    got = _run(native, x, grad_output)
    want = _run(emulated, x, grad_output)
    bounds = (x.float().abs().reshape(-1, 128) @ linear.weight.float().abs().t(),
              grad_output.float().abs().reshape(-1, 96) @ linear.weight.float().abs(),
              grad_output.float().abs().reshape(-1, 96).t() @ x.float().abs().reshape(-1, 128))
    for name, a, b, bound in zip(("Y", "dX", "dW"), got, want, bounds):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        # fp32 accumulation order (x1.1 for quantization growing magnitudes); bf16: one output rounding.
        tol = 1e-5 * 1.1 * bound.reshape(a.shape)
        if dtype == torch.bfloat16:
            tol = tol + 2.0**-7 * b.float().abs()
        err = (a.float() - b.float()).abs()
        assert (err <= tol).all(), f"{name}: max excess {(err - tol).max().item():.3g}"
        assert not torch.equal(a.float(), torch.zeros_like(a.float())), name


def _dequantized_gemm(a: Fp8Operand, b: Fp8Operand, out_dtype: torch.dtype) -> torch.Tensor:
    """What the native GEMM computes, on any device: (code * decode) products summed in fp32."""
    return (a.dequantize() @ b.dequantize().t()).to(out_dtype)


@pytest.mark.parametrize("spec_builder", [
    lambda: fp8_block_linear_spec(),
    lambda: fp8_block_linear_spec(power_of_two_scales=False),
    lambda: fp8_block_linear_spec(quantize_wgrad=False),
    lambda: fp8_block_linear_spec(quantize_fprop=False),
    lambda: LinearSpec(  # W^T 1x128 along N for Dgrad (not the Fprop tiles): re-quantized from W
        fprop=GemmSpec(OperandSpec("fp8_block", (1, 128)), OperandSpec("fp8_block", (128, 128))),
        dgrad=GemmSpec(OperandSpec("fp8_block", (1, 128)), OperandSpec("fp8_block", (1, 128))),
        wgrad=GemmSpec(OperandSpec("fp8_block", (1, 128)), OperandSpec("fp8_block", (1, 128)))),
])
def test_blockwise_layer_wiring_equals_emulated_path(monkeypatch, spec_builder):
    """With the GEMM swapped for a dequantize-then-matmul in fp32, the layer's forward and backward
    are the emulated path's, bit for bit: every operand, orientation and scale reaches its GEMM."""
    monkeypatch.setattr(fp8_torch, "fp8_gemm", _dequantized_gemm)
    monkeypatch.setattr(fp8_torch, "check_native_support", lambda *args, **kwargs: None)
    native, emulated, linear = _pair(in_features=384, out_features=256, spec=spec_builder())
    with torch.no_grad():
        linear.weight.copy_(torch.randn_like(linear.weight) * torch.rand(256, 1) * 0.1)
    x = torch.randn(2, 128, 384) * torch.rand(2, 128, 1) * 4
    grad_output = torch.randn(2, 128, 256) * torch.rand(1, 1, 256)
    for name, got, want in zip(("Y", "dX", "dW"), _run(native, x, grad_output), _run(emulated, x, grad_output)):
        assert torch.equal(got, want), f"{name}: max diff {(got - want).abs().max().item():.3g}"


def test_blockwise_layer_refuses_cpu_clearly():
    native, _, _ = _pair(in_features=256, out_features=128, spec=fp8_block_linear_spec(),
                         name="layers.3.mixer.in_proj")
    with pytest.raises(RuntimeError, match=r"layers\.3\.mixer\.in_proj.*(9\.x|Hopper)"):
        native(torch.randn(128, 256))


def test_shape_errors_name_the_layer_and_dim():
    native, _, _ = _pair(in_features=200, out_features=128, spec=fp8_block_linear_spec(),
                         name="layers.2.mixer.o_proj")
    with pytest.raises(ValueError, match=r"layers\.2\.mixer\.o_proj.*in_features"):
        native(torch.randn(128, 200))
    native, _, _ = _pair(in_features=256, out_features=128, spec=fp8_block_linear_spec(), name="layers.2.mixer.q_proj")
    with pytest.raises(ValueError, match=r"layers\.2\.mixer\.q_proj.*Wgrad.*tokens"):
        native(torch.randn(100, 256, requires_grad=True))
    native, _, _ = _pair(name="layers.4.mixer.down_proj")  # per tensor: _scaled_mm needs multiples of 16
    with pytest.raises(ValueError, match=r"layers\.4\.mixer\.down_proj.*tokens 40"):
        native(torch.randn(40, 128, requires_grad=True))
    with torch.no_grad():  # no backward, no Wgrad: any token count runs
        assert native(torch.randn(40, 128)).shape == (40, 96)
    with pytest.raises(ValueError, match=r"layers\.4\.mixer\.down_proj.*in_features"):
        native(torch.randn(40, 127))


def test_specs_without_a_native_gemm_are_refused_naming_the_layer():
    linear = nn.Linear(256, 256, bias=False)
    with pytest.raises(ValueError, match=r"layers\.0\.mixer\.in_proj.*nvfp4"):
        TorchFp8Linear.from_linear(linear, nvfp4_linear_spec(), name="layers.0.mixer.in_proj")
    tile = OperandSpec("fp8_block", (128, 128))
    with pytest.raises(ValueError, match=r"layers\.0\.x.*Fprop.*128x128 x 128x128"):
        check_spec(LinearSpec(fprop=GemmSpec(tile, tile)), "layers.0.x")
    with pytest.raises(ValueError, match=r"Dgrad.*tensor x 1x128"):
        check_spec(LinearSpec(dgrad=GemmSpec(OperandSpec("fp8_tensor"), OperandSpec("fp8_block"))), "l")
    check_spec(fp8_block_linear_spec(power_of_two_scales=False), "fine")
    module = TorchFp8Linear.from_linear(linear, fp8_block_linear_spec(), name="l")
    with pytest.raises(ValueError, match="nvfp4"):
        module.spec = nvfp4_linear_spec()


def test_from_linear_keeps_the_parameters_and_state_dict():
    linear = nn.Linear(256, 128, bias=True).eval()
    module = TorchFp8Linear.from_linear(linear, fp8_block_linear_spec(), name="layers.1.mixer.up_proj")
    assert module.weight is linear.weight and module.bias is linear.bias
    assert isinstance(module, nn.Linear) and not module.training
    assert list(module.state_dict()) == list(linear.state_dict())
    assert "layers.1.mixer.up_proj" in repr(module)
    built = TorchFp8Linear(256, 128, bias=False, name="x")
    assert built.spec == fp8_block_linear_spec() and list(built.state_dict()) == ["weight"]


def test_late_switch_runs_the_named_gemms_in_high_precision():
    native, _, linear = _pair()
    x = torch.randn(32, 128)
    grad_output = torch.randn(32, 96)
    quantized = _run(native, x, grad_output)
    plain = _run(linear, x, grad_output)
    assert not torch.equal(quantized[0], plain[0]), "FP8 must differ from fp32 on random data"

    native.set_high_precision(("fprop",))
    assert native.spec.fprop is None and native.spec.dgrad is not None and native.spec.wgrad is not None
    forward_switched = _run(native, x, grad_output)
    assert torch.equal(forward_switched[0], plain[0]), "Fprop in high precision is F.linear"
    assert torch.equal(forward_switched[1], quantized[1]) and torch.equal(forward_switched[2], quantized[2])

    native.set_high_precision(fp8_torch.GEMMS)
    assert not native.spec.quantized
    for got, want in zip(_run(native, x, grad_output), plain):
        assert torch.equal(got, want)
    with pytest.raises(ValueError, match="unknown GEMMs"):
        native.set_high_precision(("forward",))
    native.set_step(7)
    native.set_seed(11)
    assert (native.step, native.seed) == (7, 11)


def test_bias_is_added_after_the_gemm():
    linear = nn.Linear(128, 96, bias=True)
    without_bias = nn.Linear(128, 96, bias=False)
    without_bias.weight = linear.weight
    native = TorchFp8Linear.from_linear(linear, fp8_tensor_linear_spec(), name="b")
    native_without_bias = TorchFp8Linear.from_linear(without_bias, fp8_tensor_linear_spec(), name="b")
    x = torch.randn(32, 128)
    with torch.no_grad():
        assert torch.equal(native(x), native_without_bias(x) + linear.bias)


def test_per_tensor_kernel_shapes_it_takes():
    """kernels.fp8.fp8_tensor_quantize's shapes; others (empty ones included) go to the torch reference."""
    from models.quant.kernels import fp8 as fp8_kernels

    assert fp8_kernels.supports_tensor_shape((200, 256), columns=False)  # ragged rows, rows only: masked
    assert not fp8_kernels.supports_tensor_shape((200, 256), columns=True)  # x^T needs whole 128-row blocks
    assert not fp8_kernels.supports_tensor_shape((256, 200), columns=False)
    assert not fp8_kernels.supports_tensor_shape((0, 256), columns=False)  # the reference raises its own error


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
def test_per_tensor_layer_compiles_fullgraph_and_matches_eager(autocast):
    """The layer traces whole under torch.compile (no graph break): forward and both gradients equal
    eager's. Under
    autocast too: an autocast context inside the autograd function once made Dynamo fail ("global
    autocast state changed while tracing"). On the CPU torch runs the per-tensor scaled GEMM; the
    GPU test covers the Triton quantizers and the blockwise GEMMs."""
    torch.manual_seed(0)
    native = TorchFp8Linear.from_linear(nn.Linear(128, 96, bias=True), fp8_tensor_linear_spec(), name="b")
    compiled = torch.compile(native, backend="aot_eager", fullgraph=True)
    x = torch.randn(4, 32, 128)
    grad_output = torch.randn(4, 32, 96)
    results = []
    for module in (native, compiled):
        native.zero_grad(set_to_none=True)
        xi = x.clone().requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            y = module(xi)
        y.backward(grad_output.to(y.dtype))
        results.append((y.detach(), xi.grad, native.weight.grad.clone(), native.bias.grad.clone()))
    for name, got, want in zip(("Y", "dX", "dW", "db"), results[1], results[0]):
        assert torch.isfinite(want).all() and want.abs().sum() > 0, name
        assert torch.equal(got, want), f"{name}: compiled != eager"


def test_compiled_callers_trace_the_layer_without_a_graph_break():
    """A compiled block with the layer inside is one graph (fullgraph=True would raise at a break) and
    computes eager's result: blocks compile with FP8 since the quantizers became opaque ops."""
    native = TorchFp8Linear.from_linear(nn.Linear(128, 96, bias=False), fp8_tensor_linear_spec(), name="b")
    x = torch.randn(32, 128)
    torch._dynamo.reset()
    try:
        compiled = torch.compile(lambda inputs: native(inputs * 2.0) + 1.0, backend="aot_eager", fullgraph=True)
        with torch.no_grad():
            assert torch.equal(compiled(x), native(x * 2.0) + 1.0)
    finally:
        torch._dynamo.reset()


_FAKE_CASES = [(kind, rows, columns, 256) for kind in ("1x128", "128x128", "tensor")
               for rows, columns in ((True, True), (True, False), (False, True))]
_FAKE_CASES += [("1x128", True, False, 200), ("tensor", True, False, 200)]  # ragged rows: rows only, not 128x128


@pytest.mark.parametrize("kind,rows,columns,num_rows", _FAKE_CASES)
def test_compiled_quantize_op_fakes_plan_the_gemm_layouts(kind, rows, columns, num_rows):
    """What a compiled graph plans for the opaque quantize ops (their fake implementations): E4M3
    codes of x [R, C] and x^T [C, R], contiguous, and decode scales in the layouts torch's scaled
    GEMM takes (1x128: [rows, reduction/128], strides (1, rows); 128x128: [L4, rows/128], strides
    (1, L4), L4 = reduction/128 rounded up to 4; per tensor: one 0-dim fp32 scale); None for what
    was not asked. Ragged rows (rows only, 1x128 or per tensor) keep every row. The GPU test
    compares these with the kernels' real outputs."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from models.quant.kernels import fp8 as fp8_kernels

    num_cols = 640
    with FakeTensorMode() as fake_mode:
        x = fake_mode.from_tensor(torch.randn(num_rows, num_cols, dtype=torch.bfloat16))
        if kind == "tensor":
            row_codes, col_codes, decode = fp8_kernels.tensor_quantize_op(x, rows=rows, columns=columns)
            assert (decode.shape, decode.dtype) == ((), torch.float32)
            row_scales = col_scales = decode
        else:
            row_codes, row_scales, col_codes, col_scales = fp8_kernels.block_quantize_op(
                x, tile_2d=kind == "128x128", rows=rows, columns=columns)

    def expect(codes, scales, operand_rows, reduction):
        assert (codes.shape, codes.stride(), codes.dtype) == ((operand_rows, reduction), (reduction, 1),
                                                              torch.float8_e4m3fn)
        if kind == "tensor":
            return
        if kind == "128x128":
            padded = -(-(reduction // 128) // 4) * 4
            layout = ((padded, operand_rows // 128), (1, padded))
        else:
            layout = ((operand_rows, reduction // 128), (1, operand_rows))
        assert (tuple(scales.shape), scales.stride(), scales.dtype) == (*layout, torch.float32)

    if rows:
        expect(row_codes, row_scales, num_rows, num_cols)
    else:
        assert row_codes is None and (kind == "tensor" or row_scales is None)
    if columns:
        expect(col_codes, col_scales, num_cols, num_rows)
    else:
        assert col_codes is None and (kind == "tensor" or col_scales is None)
