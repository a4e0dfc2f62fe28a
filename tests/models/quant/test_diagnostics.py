"""models.quant.diagnostics: known tensors give hand-derived numbers; the recorder and the ranking on a tiny model.

The expected dequantized values below are worked out by hand from the formulas in
models/quant/formats.py (TE's NVFP4 order, OCP MX), not by calling the quantizer.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from models import build_model
from models.config import load_model_config
from models.quant.config import PrecisionConfig
from models.quant.diagnostics import (
    DiagnosticsRecorder, collect_layer_diagnostics, flatten_for_logging, quantization_diagnostics, render_summary,
    sample_row_groups, summarize,
)
from models.quant.recipe import apply_precision
from models.quant.rht import rht

TINY = 2.0**-20


def _nvfp4_known():
    """Four 1x16 blocks of one row. Tensor amax 5.25 -> S_enc = 2688 / 5.25 = 512 (exact), S_dec = 2^-9.

    block 1: +-5.25            s_b = e4m3(5.25 * 512 / 6) = 448; 5.25 * 1/(448 * 2^-9) -> 6 -> 5.25, exact
    block 2: amax 0.75         s_b = e4m3(64.0000x) = 64, r_b = 1 / (64 * 2^-9) = 8: q = e2m1(8 x), x_hat = q / 8
    block 3: 16 x 2^-20        s_b = e4m3(2^-20 * 85.3) = 0 (below 2^-10): the scale underflows, all 16 flush
    block 4: g * 2^-17         s_b = e4m3(6 * 2^-17 * 85.3) = 2^-8, subnormal (< 2^-6); r_b = 2^17: exact
    """
    block1 = [5.25, -5.25] * 8
    block2 = [0.75, 0.03125, 0.0625, 0.09375, -0.75, 0.5, 0.25, 0.375,
              0.1875, 0.125, -0.03125, 0.046875, 0.6875, 0.625, 0.3125, -0.15625]
    # 8 x block2 = 6, .25, .5, .75, -6, 4, 2, 3, 1.5, 1, -.25, .375, 5.5, 5, 2.5, -1.25; E2M1 RNE (ties to even code):
    # .25 -> 0 (flushed), .75 -> 1, .375 -> .5, 5.5 -> 6, 5 -> 4, 2.5 -> 2, -1.25 -> -1, the rest exact.
    block2_hat = [0.75, 0.0, 0.0625, 0.125, -0.75, 0.5, 0.25, 0.375,
                  0.1875, 0.125, 0.0, 0.0625, 0.75, 0.5, 0.25, -0.125]
    block3 = [TINY] * 16
    grid = [6, 4, 3, 2, 1.5, 1, 0.5, -6, -4, -3, -2, -1.5, -1, -0.5, 6, 1]
    block4 = [g * 2.0**-17 for g in grid]
    x = block1 + block2 + block3 + block4
    x_hat = block1 + block2_hat + [0.0] * 16 + block4
    return x, x_hat


def test_nvfp4_known_tensor():
    values, restored = _nvfp4_known()
    x = torch.tensor(values, dtype=torch.float32).reshape(1, 64)
    d = quantization_diagnostics(x, "nvfp4")
    expected_error = math.sqrt(sum((a - b) ** 2 for a, b in zip(values, restored))) / math.sqrt(sum(a * a for a in values))
    assert d["rel_error"] == pytest.approx(expected_error, rel=1e-6)
    assert expected_error == pytest.approx(math.sqrt((1.765625 / 64 + 16 * TINY**2) / sum(a * a for a in values)))
    assert d["flushed_to_zero"] == pytest.approx(18 / 64)  # two in block 2, sixteen in block 3; no input zeros
    assert d["scale_underflow"] == pytest.approx(1 / 4)
    assert d["scale_subnormal"] == pytest.approx(1 / 4)
    assert d["scale_saturated"] == 0.0 and d["saturated_elements"] == 0.0
    assert d["amax"] == 5.25 and d["blocks"] == 4 and not d["sampled"] and d["zero_share"] == 0.0


def test_nvfp4_2d_tiles_and_input_dtype():
    """The same tensor laid out as 16 rows x 64 cols with 16x16 tiles: the same tiles, the same numbers."""
    values, _ = _nvfp4_known()
    row = torch.tensor(values).reshape(4, 16)  # block i -> tile i: every row of tile i is block i
    x = row.repeat_interleave(16, dim=0).reshape(4, 16, 16).permute(1, 0, 2).reshape(16, 64)
    d2 = quantization_diagnostics(x, "nvfp4", tile=(16, 16))
    d1 = quantization_diagnostics(torch.tensor(values).reshape(1, 64), "nvfp4")
    for key in ("rel_error", "flushed_to_zero", "scale_underflow", "scale_subnormal"):
        assert d2[key] == pytest.approx(d1[key], rel=1e-6), key
    assert d2["blocks"] == 4
    bf16 = quantization_diagnostics(torch.tensor(values).reshape(1, 64).bfloat16(), "nvfp4")  # all exact in bf16
    assert bf16["rel_error"] == pytest.approx(d1["rel_error"], rel=1e-6)


def test_mxfp8_element_saturation_flush_and_scale_underflow():
    """One 1x32 block with amax 480: X = 2^(floor(log2 480) - 8) = 1, so 480 and 460 clip to 448 and
    2^-20 (below E4M3's 2^-9 subnormal step) flushes. A second block of 2^-125 wants exponent
    -125 - 8 = -133 < -127: the E8M0 scale underflows (clamped to 2^-127; 2^-125 / 2^-127 = 4 is exact)."""
    block1 = [480.0, 460.0, 448.0, TINY] + [float(i) for i in range(1, 17)] + [0.5] * 12
    block2 = [2.0**-125] * 32
    x = torch.tensor([block1 + block2])
    d = quantization_diagnostics(x, "mxfp8")
    errors = [32.0, 12.0, TINY]
    assert d["rel_error"] == pytest.approx(math.sqrt(sum(e * e for e in errors) / sum(v * v for v in block1 + block2)))
    assert d["saturated_elements"] == pytest.approx(2 / 64)
    assert d["flushed_to_zero"] == pytest.approx(1 / 64)
    assert d["scale_underflow"] == pytest.approx(1 / 2)
    assert d["scale_saturated"] == 0.0


def test_fp8_block_scale_overflow_and_fp8_tensor():
    """448 / 2^-149 overflows fp32: the block scale saturates (TE then uses the dtype max)."""
    x = torch.randn(2, 256) + 3.0
    x[1, 128:] = 2.0**-149
    d = quantization_diagnostics(x, "fp8_block")
    assert d["scale_saturated"] == pytest.approx(1 / 4) and d["scale_underflow"] == 0.0
    assert 0 < d["rel_error"] < 0.04  # E4M3: 3 mantissa bits, relative step <= 2^-4, error below half of it on average
    flat = torch.full((4, 64), 5.25)  # nvfp4: S_enc = 512, s_b = 448, 5.25 -> 6 -> 5.25 exactly
    assert quantization_diagnostics(flat, "fp8_tensor")["rel_error"] == 0.0
    assert quantization_diagnostics(flat, "nvfp4")["rel_error"] == 0.0


def test_rht_is_applied_before_quantizing():
    x = torch.randn(32, 64)
    x[3, 5] = 40.0  # an outlier the RHT spreads over its 16-wide tile
    with_flag = quantization_diagnostics(x, "nvfp4", rht=True)
    transformed = quantization_diagnostics(rht(x), "nvfp4")
    for key in ("rel_error", "flushed_to_zero", "scale_underflow"):
        assert with_flag[key] == pytest.approx(transformed[key], rel=1e-6)
    assert with_flag["amax"] == 40.0  # amax reports the input, before the transform


def test_sampling_keeps_the_amax_and_estimates_the_error():
    x = torch.randn(4096, 64)
    x[2777, 13] = 25.0
    full = quantization_diagnostics(x, "nvfp4", max_elements=None)
    sampled = quantization_diagnostics(x, "nvfp4", tile=(16, 16), max_elements=4096 * 64 // 16)
    assert sampled["sampled"] and sampled["measured_numel"] < x.numel() // 8
    assert sampled["measured_amax"] == sampled["amax"] == 25.0  # the outlier's row group is always kept
    assert sampled["measured_numel"] % (16 * 64) == 0  # whole 16-row groups: no tile cut
    one_d = quantization_diagnostics(x, "nvfp4", max_elements=4096 * 64 // 16)
    assert one_d["rel_error"] == pytest.approx(full["rel_error"], rel=0.1)
    rows = sample_row_groups(torch.rand(1024), 128, 256)
    assert rows.numel() in (256, 128) and (rows.reshape(-1, 128).diff(dim=1) == 1).all()


def test_bad_shapes_name_the_tensor():
    with pytest.raises(ValueError, match="layer.q_proj"):
        quantization_diagnostics(torch.randn(4, 24), "nvfp4", name="layer.q_proj")


def _quantized_model(pattern: str, device: str = "cpu"):
    """The tiny config's dims with ``pattern``; every block linear in emulated NVFP4."""
    cfg = dataclasses.replace(load_model_config("tiny"), pattern=pattern)
    with torch.device(device):
        model = build_model(cfg)
        model.init_weights()
    precision = PrecisionConfig(name="nvfp4", format="nvfp4", backend="emulated")
    plan = apply_precision(model, precision, device=torch.device(device))
    return model, plan


def _step(model, tokens: int = 128):
    inputs = torch.randint(0, model.config.vocab_size, (1, tokens))
    model(inputs).float().logsumexp(-1).mean().backward()


@pytest.fixture(scope="module")
def recorded():
    """One armed forward + backward of an 'M*-' model (8 quantized linears), 128 tokens."""
    torch.manual_seed(1234)
    model, plan = _quantized_model("M*-")
    recorder = DiagnosticsRecorder(model, sample_tokens=128)
    with recorder.recording():
        _step(model)
    return model, plan, recorder


def test_recorder_keeps_samples_of_every_quantized_linear(recorded):
    model, plan, recorder = recorded
    assert recorder.modules == len(plan.modules) == 8  # in/out_proj, q/k/v/o_proj, up/down_proj
    assert set(recorder.samples) == set(plan.modules)
    sample = recorder.samples["layers.0.mixer.in_proj"]
    assert sample["input"].shape == (128, 64) and sample["grad_output"].shape == (128, 336)


def test_layer_diagnostics_follow_each_gemm_spec(recorded):
    model, _, recorder = recorded
    records = collect_layer_diagnostics(model, recorder)
    by_key = {(r["layer"], r["gemm"], r["operand"]): r for r in records}
    # NVFP4 2D weights are reused by Dgrad, so W^T is not measured again: 5 operands per layer.
    assert len(records) == 8 * 5
    assert ("layers.0.mixer.in_proj", "dgrad", "W^T") not in by_key
    wgrad = by_key[("layers.0.mixer.in_proj", "wgrad", "dY^T")]
    assert wgrad["rht"] and wgrad["rounding"] == "stochastic" and wgrad["tile"] == (1, 16)
    assert by_key[("layers.0.mixer.in_proj", "fprop", "W")]["tile"] == (16, 16)
    assert by_key[("layers.0.mixer.in_proj", "fprop", "X")]["rounding"] == "nearest"
    for record in records:
        assert "error" not in record
        assert 0.0 < record["rel_error"] < 0.5 and math.isfinite(record["amax"]) and record["amax"] > 0
    # X as the layer saw it: the recorded input's amax is the one measured for Fprop X.
    x = recorder.samples["layers.2.mixer.up_proj"]["input"]
    assert by_key[("layers.2.mixer.up_proj", "fprop", "X")]["amax"] == x.abs().max().item()
    flat = flatten_for_logging(records)
    assert flat["quant/layers.0.mixer.in_proj/fprop.X/rel_error"] == by_key[("layers.0.mixer.in_proj", "fprop", "X")]["rel_error"]
    assert len(flat) == len(records) * 6


def test_collect_does_not_consume_the_training_rng(recorded):
    model, _, recorder = recorded
    state = torch.get_rng_state()
    first = collect_layer_diagnostics(model, recorder, weights=False)
    assert torch.equal(torch.get_rng_state(), state)
    second = collect_layer_diagnostics(model, recorder, weights=False)
    assert [r["rel_error"] for r in first] == [r["rel_error"] for r in second]  # a fixed private generator


def test_recorder_is_idle_unless_armed_and_after_remove():
    model, _ = _quantized_model("-")
    recorder = DiagnosticsRecorder(model)
    _step(model, 32)
    assert recorder.samples == {}
    with recorder.recording():
        _step(model, 32)
    assert set(recorder.samples) == {"layers.0.mixer.up_proj", "layers.0.mixer.down_proj"}
    assert not recorder.armed
    recorder.clear()
    recorder.remove()
    with recorder.recording():
        _step(model, 32)
    assert recorder.samples == {}


def test_summarize_ranks_the_outlier_layer_first():
    def record(layer, gemm, operand, error, flushed=0.07, underflow=0.0):
        return {"layer": layer, "gemm": gemm, "operand": operand, "rel_error": error, "flushed_to_zero": flushed,
                "scale_underflow": underflow, "scale_saturated": 0.0, "saturated_elements": 0.0, "amax": 1.0}

    diagnostics = []
    for index in range(6):
        diagnostics += [record(f"layers.{index}.mixer.in_proj", "fprop", "X", 0.10 + 0.001 * index),
                        record(f"layers.{index}.mixer.in_proj", "wgrad", "dY^T", 0.14)]
    diagnostics[0] = record("layers.0.mixer.in_proj", "fprop", "X", 0.31)  # 3x the median
    diagnostics[5] = record("layers.2.mixer.in_proj", "wgrad", "dY^T", 0.14, underflow=0.2)
    diagnostics.append({"layer": "layers.9.mixer.out_proj", "gemm": "wgrad", "operand": "X^T", "error": "does not divide"})
    ranked = summarize(diagnostics)
    assert ranked[0]["layer"] == "layers.0.mixer.in_proj" and ranked[0]["bf16_candidate"]
    assert ranked[0]["score"] == pytest.approx(0.31 / 0.1035, rel=1e-6)  # median of 0.31, 0.101 .. 0.105
    assert ranked[1]["layer"] == "layers.2.mixer.in_proj" and ranked[1]["bf16_candidate"]
    assert "underflow" in ranked[1]["reasons"][0]
    assert not any(entry["bf16_candidate"] for entry in ranked[2:] if entry["layer"] != "layers.9.mixer.out_proj")
    assert any("does not divide" in error for entry in ranked for error in entry["errors"])
    text = render_summary(ranked)
    assert "layers.0.mixer.in_proj" in text.splitlines()[1] and "not measured" in text


@pytest.mark.gpu
def test_recorder_on_cuda_under_bf16_autocast():
    """The trainer's setting: CUDA, bf16 autocast (operands recorded in bf16), fp32 master weights."""
    model, plan = _quantized_model("M*-", device="cuda")
    recorder = DiagnosticsRecorder(model)
    inputs = torch.randint(0, model.config.vocab_size, (2, 256), device="cuda")
    with recorder.recording(), torch.autocast("cuda", dtype=torch.bfloat16):
        model(inputs).float().logsumexp(-1).mean().backward()
    assert recorder.samples["layers.0.mixer.in_proj"]["input"].dtype == torch.bfloat16
    records = collect_layer_diagnostics(model, recorder)
    assert len(records) == len(plan.modules) * 5
    for record in records:
        assert "error" not in record and 0.0 < record["rel_error"] < 0.5, record
    assert summarize(records)[0]["layer"] in plan.modules
