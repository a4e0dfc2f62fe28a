"""The step benchmark's profile breakdown: kernels classified, compiled-graph ranges not counted twice."""

from benchmarks.step import classify, is_kernel


def test_compiled_graph_ranges_are_not_kernels():
    assert not is_kernel("## Call CompiledFxGraph fbzemvgkm3tko73vpi4yfof72qtxrlvf3rbdkr22qxrlfpiihgwx ##")
    assert is_kernel("nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_NNT")
    assert is_kernel("_quantize_rows_kernel")


def test_kernels_land_in_their_component():
    assert classify("nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_NNT") == "projections (GEMMs)"
    assert classify("_quantize_columns_kernel") == "quantization"
    assert classify("_scale_gemm_output_kernel") == "GEMM output scaling"
    assert classify("_amax_rows_kernel") == "quantization"
    assert classify("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<c10::BFloat16, "
                    "at::native::AbsMaxOps<c10::BFloat16, float, c10::BFloat16>, unsigned int, c10::BFloat16, 4, 4> >"
                    ) == "quantization"
    # The amax reduction as Inductor compiles it, fused with its producer: quantization, not a norm.
    assert classify("triton_red_fused__to_copy_add_cat_constant_pad_nd_linalg_vector_norm_mul_select_slice_"
                    "backward_squeeze_view_6") == "quantization"
    assert classify("_layer_norm_bwd_kernel") == "norms"
    assert classify("_chunk_scan_chunk_state_bwd_dx_kernel") == "ssd"
    assert classify("void at::native::unrolled_elementwise_kernel<direct_copy_kernel_cuda>") == \
        "other (elementwise, copies)"


def test_graph_breaks_are_counted_by_reason():
    import torch

    from benchmarks.step import count_graph_breaks

    def with_a_break(x):
        x = x * 2
        torch._dynamo.graph_break()
        return x + 1

    def without(x):
        return x * 2 + 1

    torch._dynamo.reset()
    with count_graph_breaks() as clean:
        torch.compile(without, backend="eager")(torch.ones(3))
    with count_graph_breaks() as broken:
        torch.compile(with_a_break, backend="eager")(torch.ones(3))
    assert clean == {"total": 0, "reasons": {}}
    assert broken["total"] >= 1 and sum(broken["reasons"].values()) == broken["total"]
    assert all("\n" not in reason and len(reason) <= 200 for reason in broken["reasons"])


def test_render_shows_launches_idle_time_and_graph_breaks():
    from benchmarks.step import render

    row = {"precision": "nvfp4", "backend": "emulated", "fwd_bwd_ms": 12.0, "step_ms": 13.0, "tokens_per_s": 1.0,
           "mfu": 0.1, "peak_memory_gib": 1.0, "components_ms": {"quantization": 4.0, "other (elementwise, copies)": 5.0},
           "kernel_launches": 812, "profiled_wall_ms": 15.0,
           "graph_breaks": {"total": 3, "reasons": {"Unsupported: torch.Generator": 3}}}
    text = render([row])
    assert "812 kernels" in text and "GPU idle 6.0 ms of 15.0 ms" in text
    assert "graph breaks while compiling: 3 (3x Unsupported: torch.Generator)" in text


def test_render_shows_the_cuda_graph_rows_against_bf16s_graph():
    from benchmarks.step import render

    base = {"backend": "none", "step_ms": 1.0, "tokens_per_s": 1.0, "mfu": 0.1, "peak_memory_gib": 1.0}
    rows = [{**base, "precision": "bf16", "fwd_bwd_ms": 60.0, "fwd_bwd_graph_ms": 20.0},
            {**base, "precision": "nvfp4", "fwd_bwd_ms": 90.0, "fwd_bwd_graph_ms": 30.0, "step_graph_ms": 33.0},
            {**base, "precision": "fp8", "fwd_bwd_ms": 50.0, "fwd_bwd_graph_error": "RuntimeError: not capturable"}]
    text = render(rows)
    assert ("nvfp4 fwd+bwd replayed from one CUDA graph (parallel.cuda_graph): 30.0 ms (without: 90.0 ms); "
            "1.50x bf16's graph; full step 33.0 ms (without: 1.0 ms)") in text
    assert "fp8 CUDA graph capture failed: RuntimeError: not capturable" in text


def test_every_benchmark_precision_composes_to_its_format():
    import dataclasses

    from benchmarks.step import PRECISIONS, StepBenchmark, build_config
    from models import build_model
    from models.quant.recipe import apply_precision

    expected = {"bf16": "bf16", "fp8": "fp8_block", "fp8_lm_head": "fp8_block", "fp8_tensor": "fp8_tensor",
                "nvfp4": "nvfp4", "mxfp4": "mxfp4", "nvfp4_4over6": "nvfp4_4over6", "nvfp4_ue5m3": "nvfp4_ue5m3",
                "nvfp4_te": "nvfp4", "fp8_te": "fp8_block"}
    assert set(PRECISIONS) == set(expected)
    for precision, fmt in expected.items():
        cfg = build_config(precision, StepBenchmark(model="study", seq_len=256))
        assert cfg.precision.format == fmt, precision
        if fmt == "bf16":
            continue
        # The plan on the CPU (emulated): which formats the layers get, not the backend's kernels.
        plan = apply_precision(build_model(cfg.model), dataclasses.replace(cfg.precision, backend="emulated"))
        shares = plan.summary()["flop_share_by_format"]
        assert shares.get(fmt, 0) > 0.5, (precision, shares)
        assert ("bf16" not in shares) == (precision == "fp8_lm_head"), (precision, shares)
