"""The step benchmark on a tiny model: times, the memory breakdown and the table (GPU only)."""

from __future__ import annotations

import pytest
import torch

from benchmarks.step import StepBenchmark, bench_precision, render

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("precision", ["bf16", "fp8_lm_head", "fp8_tensor"])
def test_bench_precision_on_a_tiny_model_reports_where_memory_goes(precision):
    if precision.startswith("fp8") and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the torch FP8 blockwise backend needs compute capability 9.x")
    settings = StepBenchmark(model="study", seq_len=256, micro_batch=2, warmup=1, iters=2, profile=False)
    result = bench_precision(precision, settings)
    memory = result["memory_gib"]
    assert memory["weights_float32"] > 0 and memory["gradients"] > 0 and memory["activations"] > 0
    # AdamW: two fp32 states per fp32 weight (and a step counter each)
    assert memory["optimizer_states"] == pytest.approx(2 * memory["weights_float32"], rel=0.01)
    held = memory["weights_float32"] + memory["gradients"] + memory["optimizer_states"] + memory["activations"]
    assert held <= result["peak_memory_gib"] * 1.05  # the parts never exceed the measured peak (allocator slack)
    shares = result["plan"]["flop_share_by_format"]
    if precision == "fp8_lm_head":  # every linear, the output projection included, in FP8
        assert shares == {"fp8_block": pytest.approx(1.0)}
    if precision == "fp8_tensor":  # the block linears per tensor, the output projection in BF16
        assert set(shares) == {"fp8_tensor", "bf16"}
    assert f"{precision} memory (GiB" in render([result])


def test_profiled_bench_counts_launches_and_graph_breaks():
    settings = StepBenchmark(model="study", seq_len=256, micro_batch=2, warmup=1, iters=2, compile=True, profile=True)
    result = bench_precision("bf16", settings)
    assert result["kernel_launches"] > 0 and result["profiled_wall_ms"] > 0
    assert set(result["graph_breaks"]) == {"total", "reasons"}
    assert "kernels in one fwd+bwd" in render([result])
