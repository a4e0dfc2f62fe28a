"""trainer.planning.gemm_costs and reports.gemm_report (`python -m reports.gemm_report`): the cost model against hand arithmetic, the recipe marks, the table and the CSV."""

from __future__ import annotations

import csv

import pytest
import torch

from model_12b import config_12b
from reports import gemm_report
from trainer.planning import gemm_costs
from scripts_testing import run_script
from trainer.hardware import GPUS

# Dense datasheet peaks and bandwidths as trainer/hardware.py documents them (FLOP/s, bytes/s).
H200_BF16, H200_FP8, H200_HBM = 989.4e12, 1978.9e12, 4.8e12
B200_BF16, B200_FP8, B200_NVFP4, B200_HBM = 2250e12, 4500e12, 9000e12, 8.0e12


@pytest.fixture(scope="module")
def report_12b():
    return gemm_report.build_report(config_12b(), tokens=8192)


def _row(report, name, kind):
    (gemm,) = [g for g in report.gemms if g.name == name and g.kind == kind]
    return gemm


def test_documented_peaks_are_the_ones_used():
    gpus = GPUS
    assert gpus["H200"].peak_flops["bf16"] == H200_BF16 and gpus["H200"].peak_flops["fp8"] == H200_FP8
    assert gpus["H200"].hbm_bytes_per_s == H200_HBM and "nvfp4" not in gpus["H200"].peak_flops
    assert gpus["B200"].peak_flops == {"bf16": B200_BF16, "fp8": B200_FP8, "mxfp8": B200_FP8, "nvfp4": B200_NVFP4}
    assert gpus["B200"].hbm_bytes_per_s == B200_HBM


def test_golden_row_speedups_by_hand(report_12b):
    """MLP down_proj Fprop of block 1: M=8192, N=5120, K=20480, speedups from the documented model."""
    gemm = _row(report_12b, "layers.1.mixer.down_proj", "fprop")
    m, n, k = 8192, 5120, 20480
    flops = 2 * m * n * k
    assert gemm.flops == flops
    x, w = m * k, n * k  # elements of X [M, K] and W [N, K]
    bf16_bytes = 2 * x + 2 * w + 2 * m * n

    # H200, FP8 (E4M3; X in 1x128 blocks with a 4-byte scale each, W in 128x128 tiles, 4-byte scales):
    h200_bf16 = max(flops / H200_BF16, bf16_bytes / H200_HBM)
    fp8_gemm_bytes = (x + x / 128 * 4) + (w + w / (128 * 128) * 4) + 2 * m * n
    fp8_quant_bytes = (2 * x + x + x / 128 * 4) + (2 * w + w + w / (128 * 128) * 4)  # read BF16, write FP8 + scales
    h200_fp8 = max(flops / H200_FP8, fp8_gemm_bytes / H200_HBM) + fp8_quant_bytes / H200_HBM
    assert report_12b.speedup(gemm, "fp8", GPUS["H200"]) == pytest.approx(h200_bf16 / h200_fp8, rel=1e-12)
    assert h200_bf16 / h200_fp8 == pytest.approx(1.670, abs=1e-3)

    # B200, NVFP4 (E2M1 half bytes; X 1x16 E4M3 scales, W 16x16 tiles; fp32 tensor scale; amax pass = 2 reads):
    b200_bf16 = max(flops / B200_BF16, bf16_bytes / B200_HBM)
    nvfp4_x, nvfp4_w = x / 2 + x / 16 + 4, w / 2 + w / 256 + 4
    nvfp4_gemm_bytes = nvfp4_x + nvfp4_w + 2 * m * n
    nvfp4_quant_bytes = (2 * 2 * x + nvfp4_x) + (2 * 2 * w + nvfp4_w)
    b200_nvfp4 = max(flops / B200_NVFP4, nvfp4_gemm_bytes / B200_HBM) + nvfp4_quant_bytes / B200_HBM
    assert report_12b.speedup(gemm, "nvfp4", GPUS["B200"]) == pytest.approx(b200_bf16 / b200_nvfp4, rel=1e-12)
    assert b200_bf16 / b200_nvfp4 == pytest.approx(2.209, abs=1e-3)
    # Without the quantization traffic it is the plain peak ratio (compute-bound GEMM).
    assert gemm_costs.speedup(gemm, "nvfp4", GPUS["B200"], overhead="none") == pytest.approx(4.0)

    # No native NVFP4 or MXFP8 on Hopper.
    assert report_12b.speedup(gemm, "nvfp4", GPUS["H200"]) is None
    assert report_12b.speedup(gemm, "mxfp8", GPUS["H100"]) is None


def test_wgrad_quantizes_both_operands_along_tokens_and_dgrad_reuses_2d_weights(report_12b):
    cost = gemm_costs.quantization_bytes
    fprop, dgrad, wgrad = (_row(report_12b, "layers.1.mixer.up_proj", kind) for kind in ("fprop", "dgrad", "wgrad"))
    t, h, f = 8192, 5120, 20480
    # Dgrad: only dY [T, F] is new; W^T is Fprop's 2D-quantized W (NVFP4) / 128x128 W (FP8).
    assert cost(dgrad, "nvfp4") == pytest.approx(4 * t * f + t * f / 2 + t * f / 16 + 4)
    assert cost(dgrad, "fp8") == pytest.approx(3 * t * f + t * f / 128 * 4)
    # MXFP8's 1x32 weight blocks are not transpose-invariant: W^T [H, F] is quantized again.
    assert cost(dgrad, "mxfp8") == pytest.approx((3 + 1 / 32) * (t * f + h * f))
    # Wgrad: dY^T [F, T] and X^T [H, T], both in activation blocks along tokens.
    assert cost(wgrad, "fp8") == pytest.approx((3 + 4 / 128) * (f * t + h * t))
    assert cost(fprop, "bf16") == 0 and cost(wgrad, "bf16") == 0


def test_large_gemms_gain_most_small_ones_least(report_12b):
    summary = gemm_report.layer_type_summary(report_12b)
    for gpu in ("B200", "GB200", "B300", "GB300"):
        down = summary["mlp.down_proj"]["speedup"][("nvfp4", gpu)]
        o_proj = summary["attention.o_proj"]["speedup"][("nvfp4", gpu)]
        k_proj = summary["attention.k_proj"]["speedup"][("nvfp4", gpu)]
        assert down > o_proj > k_proj > 1.0, gpu
    assert summary["lm_head"]["speedup"][("nvfp4", "B200")] == 1.0
    assert summary["attention BMMs"]["speedup"][("fp8", "H100")] == 1.0
    # The faster FP4 tensor cores of Blackwell Ultra widen NVFP4's lead; FP8 rates are unchanged.
    assert summary["mlp.down_proj"]["speedup"][("nvfp4", "B300")] > summary["mlp.down_proj"]["speedup"][("nvfp4", "B200")]
    assert summary["mlp.down_proj"]["speedup"][("fp8", "B300")] == pytest.approx(
        summary["mlp.down_proj"]["speedup"][("fp8", "B200")])


def test_recipe_marks_first_and_last_symbols_bf16():
    cfg = config_12b()
    nvfp4 = gemm_report.build_report(cfg, precision=gemm_report.load_precision_config("nvfp4"))
    planned = {(g.name, g.kind): nvfp4.planned_format(g) for g in nvfp4.gemms}
    bf16_blocks = {0, 1} | set(range(54, 62))
    for gemm in nvfp4.gemms:
        expected = "bf16" if (gemm.layer in bf16_blocks or not gemm.quantizable) else "nvfp4"
        assert planned[(gemm.name, gemm.kind)] == expected, gemm.name
    fp8 = gemm_report.build_report(cfg, precision=gemm_report.load_precision_config("fp8"))
    assert {g.layer for g in fp8.gemms if fp8.planned_format(g) == "bf16" and g.quantizable} == {0, 60, 61}
    assert {fp8.planned_format(g) for g in fp8.gemms if g.quantizable and g.layer == 5} == {"fp8"}
    # The recipe's step is slower than all-NVFP4 and faster than BF16.
    b200 = GPUS["B200"]
    bf16_time = gemm_report.step_time(nvfp4, b200, None)
    recipe_time = gemm_report.step_time(nvfp4, b200, None, use_plan=True)
    all_time = gemm_report.step_time(nvfp4, b200, "nvfp4")
    assert all_time < recipe_time < bf16_time
    assert gemm_report.step_time(nvfp4, GPUS["H100"], None, use_plan=True) is None


def test_cli_prints_grouped_table_and_writes_every_gemm_to_csv(tmp_path):
    out = tmp_path / "gemms.csv"
    printed = run_script("reports.gemm_report", "--config", "hybrid_12b", "--precision", "nvfp4", "--csv", out).stdout
    report = gemm_report.build_report(gemm_report.load_model_config("hybrid_12b"),
                                      precision=gemm_report.load_precision_config("nvfp4"))
    assert "mlp.down_proj" in printed and "Per layer type" in printed and "recipe nvfp4" in printed
    # Grouped: the 23 quantized MLP down_proj Fprops share one row with their count.
    assert any(line.split()[:2] == ["mlp.down_proj", "fprop"] and " 23 " in line for line in printed.splitlines())
    with open(out) as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == len(report.gemms) == 447
    golden = [r for r in rows if r["name"] == "layers.1.mixer.down_proj" and r["kind"] == "fprop"][0]
    assert (golden["M"], golden["N"], golden["K"], golden["flops"]) == ("8192", "5120", "20480", str(2 * 8192 * 5120 * 20480))
    assert golden["plan_format"] == "bf16"  # block 1 is among the first 2 symbols
    assert float(golden["nvfp4_speedup_B200"]) == pytest.approx(2.209, abs=1e-3)
    assert golden["nvfp4_speedup_H100"] == ""
    assert sum(float(r["share_of_step_flops"]) for r in rows) == pytest.approx(1 - 6.31e12 / 590.64e12, abs=1e-4)


def test_bad_arguments_fail_clearly():
    with pytest.raises(FileNotFoundError, match="available"):
        gemm_report.load_precision_config("nvfp5")
    with pytest.raises(ValueError, match="unknown GPU"):
        gemm_report.build_report(config_12b(), gpus=["A100"])
    with pytest.raises(ValueError, match="formats"):
        gemm_report.build_report(config_12b(), formats=["int4"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised without CUDA")
def test_measure_without_cuda_says_so():
    report = gemm_report.build_report(config_12b())
    with pytest.raises(RuntimeError, match="CUDA"):
        gemm_report.measure(report)


@pytest.mark.gpu
def test_measure_times_small_config_on_gpu(capsys):
    report = gemm_report.build_report(gemm_report.load_model_config("tiny"), tokens=256)
    gemm_report.measure(report, warmup=1, iters=3)
    print(gemm_report.render(report))  # what the script prints
    assert report.measured
    for results in report.measured.values():
        assert isinstance(results["bf16"], float) and results["bf16"] > 0
    capability = torch.cuda.get_device_capability()
    if capability >= (8, 9):
        assert any(isinstance(r["fp8_tensorwise"], float) for r in report.measured.values())
    assert "Measured on" in capsys.readouterr().out


def test_cost_model_reads_the_format_registry():
    """Bytes and block sizes come from models.quant's FormatSpec entries, under the report's names."""
    from models.quant.format_registry import FORMAT_SPECS
    from trainer.planning.gemm_costs import FORMAT_COSTS, RECIPE_FORMATS

    for name, spec in FORMAT_SPECS.items():
        cost = FORMAT_COSTS[RECIPE_FORMATS[name]]
        assert (cost.element_bytes, cost.vector_block, cost.weight_block, cost.amax_pass) == (
            spec.element_bytes, spec.vector_block, spec.weight_block, spec.amax_pass)
    assert RECIPE_FORMATS["fp8_block"] == "fp8" and "mxfp8_wgrad_rht" in FORMAT_COSTS
