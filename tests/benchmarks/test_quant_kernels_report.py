"""The quantization-kernel benchmark's table (benchmarks/quant_kernels.py), on the CPU: the graphed
(GPU) time is the one the target is read from, eager-only and failed rows still print."""

from __future__ import annotations

from benchmarks.quant_kernels import floor_bytes, render


def _row(name, eager_ms, ms, fraction, identical=None, error=None, best=False, config=None):
    return {"name": name, "config": config, "eager_ms": eager_ms, "ms": ms, "floor_ms": 0.042,
            "fraction_of_copy_bw": fraction, "bit_identical": identical, "error": error, "best_for_kernel": best}


def test_render_prints_eager_and_graphed_times_and_marks_the_best():
    lines = render([
        _row("rows 1x16 RNE", 0.1712, 0.0795, 0.529, identical=True, best=True, config=[16, 128, 4]),
        _row("rows 1x16 RNE", 0.1496, 0.0800, 0.526, identical=False, config=[16, 256, 8]),
        _row("torch reference rows 1x16 (eager)", 3.6135, None, 0.012),
        _row("columns 16x1 RNE", None, None, None, error="CompilationError: out of resources", config=[4, 64, 8]),
        _row("torch reference rows 1x16 (torch.compile)", 0.2402, None, None, error="RuntimeError: capture failed"),
    ])
    header, best, worse, reference, failed, reason, capture_failed, capture_reason = lines
    assert "eager us" in header and "graphed us" in header and "of copy bw" in header
    assert best.endswith(" *") and "16x128x4" in best and "171.2" in best and "79.5" in best and "52.9%" in best
    assert not worse.endswith("*") and "NO" in worse
    assert "3613.5" in reference and "1.2%" in reference
    assert "error" in failed and "4x64x8" in failed
    assert "out of resources" in reason
    assert "240.2" in capture_failed and capture_failed.split()[-3] == "error"  # the eager time survives
    assert "capture failed" in capture_reason


def test_floor_counts_one_read_the_bf16_values_and_one_scale_byte_per_block():
    import torch

    x = torch.zeros(32, 64, dtype=torch.bfloat16)
    assert floor_bytes(x, values_bytes=2) == 32 * 64 * 2 + 32 * 64 * 2 + 32 * 64 // 16
