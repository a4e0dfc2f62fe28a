"""Benchmark the NVFP4 and MXFP4 quantize kernels against the HBM floor on the present GPU.

    python scripts/bench_quant.py --out bench_quant.json            # 8192 x 5120 bf16
    python scripts/bench_quant.py --rows 4096 --cols 4096 --out b.json

For each kernel (1x16 rows, 2D 16x16, 16x1 columns along tokens, columns with RHT, and their
stochastic-rounding variants) and for the plain-torch reference, it times the whole quantize call
(amax pass + quantize pass) eager and replayed from a CUDA graph (GPU time), and compares the graphed
time with the HBM floor: (bytes read once + bytes written) / the device-to-device copy bandwidth
measured in the same run. "of copy bw" = floor time / measured time (1.0 = as fast as a copy moving
those bytes). Launch configurations (variants of models.quant.kernels.options.NVFP4_OPTIONS), the
amax passes, the RHT's two bf16 roundings, the shared amax pass and the MXFP4 kernels are timed. Before
timing, each RNE kernel is checked bit for bit against its torch reference on the benchmark tensor.
The kernels, configurations and floors: benchmarks/quant_kernels.py.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import torch

from benchmarks.quant_kernels import bench_quantize, render
from models.quant import kernels


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=8192)
    parser.add_argument("--cols", type=int, default=5120)
    parser.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    parser.add_argument("--out", type=Path, required=True, help="where to write the JSON results")
    args = parser.parse_args()

    if not torch.cuda.is_available():
        print("bench_quant needs a CUDA GPU", file=sys.stderr)
        return 2
    if not kernels.has_triton():
        print(f"bench_quant needs Triton: {kernels.INSTALL_HINT}", file=sys.stderr)
        return 2
    measured = bench_quantize(args.rows, args.cols, args.dtype, args.iterations, args.warmup,
                              compile_reference=not args.no_compile)
    rows, bandwidth, floor_ms = measured["rows"], measured["copy_bandwidth_bytes_per_s"], measured["floor_ms"]
    device = torch.cuda.get_device_name()
    print(f"{device}: {args.rows} x {args.cols} {args.dtype}; copy bandwidth {bandwidth / 1e12:.2f} TB/s; "
          f"floor (read + write bf16 values + scales) {floor_ms * 1e3:.1f} us")
    print("\n".join(render(rows)))
    result = {
        "device": device,
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "python": platform.python_version(),
        "shape": [args.rows, args.cols],
        "dtype": args.dtype,
        "copy_bandwidth_bytes_per_s": bandwidth,
        "floor_ms": floor_ms,
        "results": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")
    all_identical = all(row["bit_identical"] is not False for row in rows)
    return 0 if all_identical else 1


if __name__ == "__main__":
    sys.exit(main())
