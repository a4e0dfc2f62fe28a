"""Benchmark: our Mamba-2 mixer vs mamba_ssm's own ``Mamba2`` module at 12B dims.

One Mamba-2 layer of Nemotron-Nano-12B-v2 (hidden 5120, 128 heads x 80, state 128, 8 groups,
conv 4), bf16, batch 1 x 8192 tokens, forward + backward (input gradient and all weight
gradients), timed with CUDA events after warm-up, side by side in one run. Both modules hold
the same weights (ours is loaded from theirs) and the script checks that their outputs agree.

mamba_ssm's ``Mamba2`` runs with ``use_mem_eff_path=False`` and without causal-conv1d (not
installed: its fallback is nn.Conv1d), imported without the package's compiled extension
(models.kernels.mamba_ssm_triton). Ours runs its defaults on CUDA: Triton SSD and gated norm
from mamba_ssm, the torch.compile'd causal conv; ``--variants`` adds others.

    python scripts/bench_mamba.py --out bench_mamba.json

Target: ours <= 0.8 x theirs (theirs measured 22.7 ms on an H200; docs/performance.md).
The modules, their set-up and the timing: benchmarks/mamba.py.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import torch

from benchmarks.mamba import VARIANTS, MambaBenchmark, bench_mixers
from models.kernels import has_mamba_ssm_triton, mamba_ssm_triton


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--hidden", type=int, default=5120)
    parser.add_argument("--heads", type=int, default=128)
    parser.add_argument("--head-dim", type=int, default=80)
    parser.add_argument("--state", type=int, default=128)
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--chunk", type=int, default=256, help="SSD chunk for both (Mamba2's default is 256)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2, help="alternate theirs/ours this many times; keep the best")
    parser.add_argument("--variants", default="ours", help=f"comma-separated, from {sorted(VARIANTS)}")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args()

    if not torch.cuda.is_available():
        sys.exit("bench_mamba needs a CUDA GPU")
    if not has_mamba_ssm_triton():
        sys.exit(mamba_ssm_triton.INSTALL_HINT)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    for v in variants:
        if v not in VARIANTS:
            sys.exit(f"unknown variant {v!r}; choose from {sorted(VARIANTS)}")

    settings = MambaBenchmark(seq=args.seq, batch=args.batch, hidden=args.hidden, heads=args.heads,
                              head_dim=args.head_dim, state=args.state, groups=args.groups, chunk=args.chunk,
                              warmup=args.warmup, iters=args.iters, rounds=args.rounds)
    measured = bench_mixers(settings, variants)
    results, check, params = measured["results"], measured["check"], measured["params"]
    print(f"\nMamba-2 layer, hidden {args.hidden}, {args.heads} heads x {args.head_dim}, state {args.state}, "
          f"groups {args.groups}, chunk {args.chunk}, {args.batch} x {args.seq} tokens, bf16, {params / 1e6:.1f}M params")
    print(f"{'module':<20}{'fwd ms':>10}{'fwd+bwd ms':>12}{'vs Mamba2':>11}{'TFLOP/s (6NT)':>15}{'out rel err':>13}")
    for name, r in results.items():
        err = f"{check[name]:.1e}" if name in check else "-"
        print(f"{name:<20}{r['fwd_ms']:>10.2f}{r['fwd_bwd_ms']:>12.2f}{r['ratio_vs_mamba2']:>10.2f}x"
              f"{r['tflops_6nt']:>15.0f}{err:>13}")
    ours_ratio = results[variants[0]]["ratio_vs_mamba2"] if variants else None
    target = 0.8
    if ours_ratio is not None:
        verdict = "MET" if ours_ratio <= target else "MISSED"
        print(f"\ntarget: {variants[0]} <= {target}x Mamba2 -> {ours_ratio:.2f}x ({verdict})")

    report = {
        "benchmark": "bench_mamba",
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "python": platform.python_version(),
        "command": " ".join(sys.argv),
        "shape": {"batch": args.batch, "seq": args.seq, "hidden": args.hidden, "heads": args.heads,
                  "head_dim": args.head_dim, "state": args.state, "groups": args.groups, "chunk": args.chunk},
        "params": params,
        "warmup": args.warmup, "iters": args.iters, "rounds": args.rounds,
        "results": results,
        "output_relative_error_vs_mamba2": check,
        "target_ratio": target,
        "ratio": ours_ratio,
    }
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
