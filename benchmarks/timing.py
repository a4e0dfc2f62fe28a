"""The one CUDA-event timer of the benchmarks.

Each timed call is bracketed by two CUDA events on the current stream; the GPU time between
them is what is reported (launch overhead only counts where the GPU waits for the host).
`warmup` untimed calls come first (compilation, autotuning, allocator growth). Without
`synchronize_each` the calls are queued back to back and the host synchronizes once at the
end (the GPU never idles between calls); with it, it synchronizes after every call (each call
starts on an idle GPU, as a training step after a host sync does).
"""

from __future__ import annotations

import statistics
from typing import Callable, List


def cuda_times_ms(fn: Callable[[], object], warmup: int, iters: int, *, synchronize_each: bool = False) -> List[float]:
    """Milliseconds of each of ``iters`` timed calls of ``fn`` (CUDA events), after ``warmup`` calls."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    events = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        events.append((start, end))
        if synchronize_each:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) for start, end in events]


def cuda_median_ms(fn: Callable[[], object], warmup: int, iters: int) -> float:
    """Median milliseconds of ``fn`` over ``iters`` timed calls after ``warmup`` calls."""
    return statistics.median(cuda_times_ms(fn, warmup, iters))
