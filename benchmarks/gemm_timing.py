"""Timing of GEMM kernels on the present CUDA GPU (gemm_report --measure).

--measure times each distinct linear GEMM shape on the present CUDA GPU with CUDA events (after
warm-up; median of --iters): BF16 torch.matmul, FP8 torch._scaled_mm with tensorwise scales and with
DeepSeek-style blockwise scales (1x128 activations x 128x128 weights for Fprop/Dgrad, 1x128 x 1x128
for Wgrad), and on compute capability >= 10 MXFP8 (1x32, E8M0) and NVFP4 (1x16, E4M3 block scales)
through torch._scaled_mm. Scale values are ones (timing does not depend on them); operands in the
TN layout cuBLAS wants (A row-major, B column-major). A variant this torch/GPU refuses is reported as
unsupported with the error's first line. Quantization kernels are not timed. Attention BMMs are not
measured (they run inside SDPA/flash attention).
"""

from __future__ import annotations

from typing import Callable, Dict, Iterable, Optional, Sequence, Tuple

from benchmarks.timing import cuda_median_ms

MEASURE_VARIANTS = ("bf16", "fp8_tensorwise", "fp8_blockwise", "mxfp8", "nvfp4")


def _round_up(value: int, multiple: int) -> int:
    return (value + multiple - 1) // multiple * multiple


def gemm_operands(variant: str, m: int, n: int, k: int, kind: str, device):
    """(callable running C = A B once, description) for one variant; raises if the shape does not fit."""
    import torch

    if variant == "bf16":
        a = torch.randn(m, k, device=device, dtype=torch.bfloat16)
        b = torch.randn(n, k, device=device, dtype=torch.bfloat16).t()  # [K, N], column-major like a Linear weight
        return lambda: torch.matmul(a, b)
    # All scaled variants: A [M, K] row-major, B [K, N] column-major (cuBLAS's TN layout).
    if variant in ("fp8_tensorwise", "fp8_blockwise", "mxfp8"):
        a = torch.randn(m, k, device=device).to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device=device).to(torch.float8_e4m3fn).t()
    if variant == "fp8_tensorwise":
        one = torch.ones((), device=device, dtype=torch.float32)
        return lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    if variant == "fp8_blockwise":
        if k % 128 or m % 128 or n % 128:
            raise ValueError(f"blockwise FP8 needs M, N, K multiples of 128, got {m}x{n}x{k}")
        # scale_a: 1x128 blocks of A, shape [M, K/128], "outer-dim-major" (stride (1, M)).
        scale_a = torch.ones(k // 128, m, device=device).t()
        if kind == "wgrad":
            # Both operands 1x128 along tokens: scale_b [K/128, N] row-major (its transpose is outer-dim-major).
            scale_b = torch.ones(k // 128, n, device=device)
        else:
            # B is a weight in 128x128 tiles: scale_b [K/128, N/128], the transpose of a row-major [N/128, K/128].
            scale_b = torch.ones(n // 128, k // 128, device=device).t()
        return lambda: torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16)
    if variant == "mxfp8":
        # E8M0 scales, one per 1x32 block, in cuBLAS's swizzled layout: round_up(rows,128) x round_up(K/32,4) bytes.
        code_one = 127  # E8M0 code of 2^0
        scale_a = torch.full((_round_up(m, 128) * _round_up(k // 32, 4),), code_one, device=device, dtype=torch.uint8)
        scale_b = torch.full((_round_up(n, 128) * _round_up(k // 32, 4),), code_one, device=device, dtype=torch.uint8)
        scale_a, scale_b = scale_a.view(torch.float8_e8m0fnu), scale_b.view(torch.float8_e8m0fnu)
        return lambda: torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16)
    if variant == "nvfp4":
        # Two E2M1 codes per byte: A [M, K/2], B [N, K/2] -> its transpose [K/2, N] column-major.
        a = torch.randint(0, 256, (m, k // 2), device=device, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
        b = torch.randint(0, 256, (n, k // 2), device=device, dtype=torch.uint8).view(torch.float4_e2m1fn_x2).t()
        scale_a = torch.ones(_round_up(m, 128) * _round_up(k // 16, 4), device=device).to(torch.float8_e4m3fn)
        scale_b = torch.ones(_round_up(n, 128) * _round_up(k // 16, 4), device=device).to(torch.float8_e4m3fn)
        return lambda: torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16)
    raise ValueError(f"unknown variant {variant!r}")


def variant_available(variant: str, capability) -> Optional[str]:
    """None if worth trying on this GPU, else why not."""
    if variant == "bf16":
        return None
    if capability < (8, 9):
        return "needs compute capability >= 8.9"
    if variant in ("mxfp8", "nvfp4") and capability < (10, 0):
        return "needs compute capability >= 10.0 (Blackwell)"
    return None




def measure_gemm_shapes(shapes: Iterable[Tuple[int, int, int, str]], warmup: int = 5, iters: int = 20,
                        variants: Sequence[str] = MEASURE_VARIANTS,
                        progress: Optional[Callable[[str], None]] = None) -> Dict[tuple, Dict[str, object]]:
    """(M, N, K, kind) -> variant -> median seconds (float) or 'unsupported: ...' (str), on the present CUDA GPU."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("--measure needs a CUDA GPU (torch.cuda.is_available() is False); run without --measure "
                           "for the theoretical report")
    device = torch.device("cuda")
    capability = torch.cuda.get_device_capability(device)
    measured = {}
    for key in shapes:
        m, n, k, kind = key
        results: Dict[str, object] = {}
        for variant in variants:
            reason = variant_available(variant, capability)
            if reason is not None:
                results[variant] = f"unsupported: {reason}"
                continue
            try:
                run = gemm_operands(variant, m, n, k, kind, device)
                results[variant] = cuda_median_ms(run, warmup, iters) / 1e3
            except (RuntimeError, ValueError, TypeError, NotImplementedError, AttributeError) as error:
                message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
                results[variant] = f"unsupported: {message[:160]}"
            finally:
                run = None
                torch.cuda.empty_cache()
        measured[key] = results
        (progress or _print_now)(f"  measured {kind} {m}x{n}x{k}: " + ", ".join(
            f"{v} {1e3 * t:.3f} ms" if isinstance(t, float) else f"{v} -" for v, t in results.items()))
    return measured


def _print_now(line: str) -> None:
    print(line, flush=True)
