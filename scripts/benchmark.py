"""Training-step benchmark of the 12B-shaped slice in every precision, side by side in one run.

The slice: Nemotron-Nano-12B-v2 widths, pattern `M-M-M*-`, vocab 131072, sequence 8192,
micro-batch 1 (2.54B parameters; configs/model/slice_12b.yaml). For each precision the model
is built exactly as the trainer builds it (build_model_on -> apply_precision -> parallelize)
and timed with CUDA events after warm-up:

  fwd+bwd    forward, loss, backward (the quantity Megatron-Core's BF16 time in docs/performance.md refers to)
  step       the trainer's step (fwd+bwd + gradient clipping) + fused AdamW (a full optimizer step)

Printed: ms, tokens/s, MFU (models.flops hybrid formula over the 989 TFLOP/s BF16 peak), peak
memory and the ratio to BF16; then a per-component breakdown of one profiled fwd+bwd
(projections, SSD, conv, norms, attention, quantization, loss, other) from the PyTorch
profiler's CUDA kernel times. JSON to --out. The work: benchmarks/step.py.

    python scripts/benchmark.py --out benchmark.json
    python scripts/benchmark.py --precisions bf16,fp8 --compile --activation-checkpoint none
    python scripts/benchmark.py --model study --seq-len 1024 --micro-batch 32 --compile \
        --precisions nvfp4,mxfp4,nvfp4_4over6,nvfp4_ue5m3   # the study's 4-bit arms at the study's step
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import sys
import traceback
from pathlib import Path

import torch

from benchmarks.step import PRECISIONS, StepBenchmark, bench_precision, render


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="slice_12b")
    parser.add_argument("--precisions", default="bf16,fp8,nvfp4,nvfp4_te")
    parser.add_argument("--seq-len", type=int, default=8192)
    parser.add_argument("--micro-batch", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--compile", action="store_true", help="torch.compile each block (parallel.compile)")
    parser.add_argument("--activation-checkpoint", default="none")
    parser.add_argument("--no-profile", dest="profile", action="store_false")
    parser.add_argument("--cuda-graph", action="store_true",
                        help="also time the micro-step and the step as parallel.cuda_graph trains them (replayed from a CUDA graph)")
    parser.add_argument("--trainer-rng", action="store_true",
                        help="seed stochastic rounding per layer (plan.set_step), as training runs do")
    parser.add_argument("--override", action="append", default=[], help="extra config override (repeatable)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("benchmark.py needs a CUDA GPU")
    settings = StepBenchmark(
        model=args.model, seq_len=args.seq_len, micro_batch=args.micro_batch, warmup=args.warmup, iters=args.iters,
        compile=args.compile, activation_checkpoint=args.activation_checkpoint, profile=args.profile,
        cuda_graph=args.cuda_graph, trainer_rng=args.trainer_rng, override=args.override,
    )
    results = []
    for precision in args.precisions.split(","):
        if precision not in PRECISIONS:
            raise SystemExit(f"unknown precision {precision!r}; choose from {', '.join(PRECISIONS)}")
        try:
            results.append(bench_precision(precision, settings))
        except Exception as error:  # noqa: BLE001 - report and go on with the next precision
            traceback.print_exc()  # the whole cause on stderr; the table keeps one line
            results.append({"precision": precision, "error": f"{type(error).__name__}: {str(error)[:300]}"})
            gc.collect()
            torch.cuda.empty_cache()
        print(render(results), flush=True)
    table = render(results)
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "python": platform.python_version(), "args": vars(args), "command": " ".join(sys.argv)}
    print("\n" + table + "\n" + json.dumps({k: v for k, v in meta.items() if k != "args"}), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"meta": meta, "results": results}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
