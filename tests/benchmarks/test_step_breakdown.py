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
    assert classify("_chunk_scan_chunk_state_bwd_dx_kernel") == "ssd"
    assert classify("void at::native::unrolled_elementwise_kernel<direct_copy_kernel_cuda>") == \
        "other (elementwise, copies)"
