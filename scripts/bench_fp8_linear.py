"""Benchmark one linear layer, forward + backward, in BF16 and FP8 on the present GPU.

    python scripts/bench_fp8_linear.py --out bench_fp8_linear.json
    python scripts/bench_fp8_linear.py --tokens 8192 --shapes 5120x20480,20480x5120 --iters 30

For each shape (in_features x out_features) at ``--tokens`` bf16 tokens, side by side in one run:
BF16 ``nn.Linear``, ``TorchFp8Linear`` (fp8_block, fused or plain-torch quantization; fp8_tensor),
the emulated ``QuantLinear``, Transformer Engine's ``te.Linear`` when it imports, the three FP8
GEMMs alone and the fused quantization kernels alone (``--quant-warps``).
Times are CUDA-event medians over ``--iters`` calls after ``--warmup`` calls. TFLOP/s counts the
three GEMMs, 3 x 2 M N K. "x BF16" is BF16's time over the case's (above 1: faster than BF16).
Weights are bf16 unless ``--weight-dtype float32`` (the trainer's fp32 master weights).
The cases and their set-up: benchmarks/fp8_linear.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import List

import torch

from benchmarks.fp8_linear import LinearBenchmark, bench_shape, render, software_versions


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--shapes", default="5120x20480,20480x5120", help="comma-separated in_features x out_features")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--weight-dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--quant-warps", type=lambda s: [int(v) for v in s.split(",")], default=[4, 8, 16])
    parser.add_argument("--skip-te", action="store_true")
    parser.add_argument("--skip-emulated", action="store_true")
    parser.add_argument("--skip-reference-quantizer", action="store_true")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_fp8_linear needs a CUDA GPU", file=sys.stderr)
        return 2
    settings = LinearBenchmark(
        tokens=args.tokens, warmup=args.warmup, iters=args.iters, weight_dtype=args.weight_dtype,
        quant_warps=args.quant_warps, skip_te=args.skip_te, skip_emulated=args.skip_emulated,
        skip_reference_quantizer=args.skip_reference_quantizer,
    )

    from models.quant import fp8_torch

    notes: List[str] = []
    device = torch.cuda.get_device_name()
    capability = torch.cuda.get_device_capability()
    if capability[0] != 9 or not fp8_torch.has_blockwise_scaled_mm():
        notes.append(f"blockwise FP8 GEMMs need {fp8_torch.REQUIREMENT}; this is {device} sm_{capability[0]}{capability[1]}, "
                     f"torch {torch.__version__}: those rows will fail")
    versions = software_versions()
    triton_version, te_version = versions["triton"], versions["transformer_engine"]
    print(f"{device} (sm_{capability[0]}{capability[1]}), torch {torch.__version__}, CUDA {torch.version.cuda}, "
          f"triton {triton_version}, transformer_engine {te_version}", flush=True)

    rows: List[dict] = []
    for shape in args.shapes.split(","):
        in_features, out_features = (int(v) for v in shape.lower().split("x"))
        rows.extend(bench_shape(in_features, out_features, settings, notes))
        torch.cuda.empty_cache()

    print(render(rows))
    for note in notes:
        print(f"note: {note}")
    if args.out:
        report = {
            "device": device, "capability": list(capability), "torch": torch.__version__, "cuda": torch.version.cuda,
            "triton": triton_version, "transformer_engine": te_version, "command": " ".join(sys.argv),
            "tokens": args.tokens, "warmup": args.warmup, "iters": args.iters, "weight_dtype": args.weight_dtype,
            "results": rows, "notes": notes,
        }
        with open(args.out, "w") as handle:
            json.dump(report, handle, indent=2)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
