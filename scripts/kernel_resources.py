"""Registers, spills, SASS instructions and barriers of the NVFP4 and MXFP4 kernels (amax passes and quantize
kernels), compiled offline.

    python scripts/kernel_resources.py                    # sm_90a (H100/H200), bf16 and fp32 inputs
    PYTHONPATH=/path/to/triton-3.6 python scripts/kernel_resources.py   # the GPU machine's Triton

No GPU needed: the installed Triton compiles each kernel at its default launch configuration for
the target and its bundled ptxas assembles it (benchmarks/kernel_resources.py). Exits 1 if any
kernel spills registers.
"""

from __future__ import annotations

import argparse
import sys

from benchmarks.kernel_resources import kernel_resources, render


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--capability", type=int, default=90, help="compute capability to compile for (90: Hopper)")
    parser.add_argument("--dtypes", default="bf16,fp32", help="input dtypes, comma-separated")
    args = parser.parse_args()
    import triton

    rows = kernel_resources(tuple(args.dtypes.split(",")), args.capability)
    print(f"Triton {triton.__version__}, sm_{args.capability}{'a' if args.capability >= 90 else ''}")
    print("\n".join(render(rows)))
    return 1 if any(row.spill_bytes or row.local_memory_instructions for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
