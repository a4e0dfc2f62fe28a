"""Our Mamba-2 mixer against mamba_ssm's own ``Mamba2`` module on the present GPU (scripts/bench_mamba.py).

One Mamba-2 layer (by default Nemotron-Nano-12B-v2's: hidden 5120, 128 heads x 80, state 128,
8 groups, conv 4), bf16, forward + backward (input gradient and all weight gradients), timed
with CUDA events (benchmarks.timing) after warm-up: the mean over the timed calls, the best of
several rounds that alternate the modules. Both modules hold the same weights (ours is loaded
from theirs) and their outputs are compared first.

mamba_ssm's ``Mamba2`` runs with ``use_mem_eff_path=False`` and without causal-conv1d (not
installed: its fallback is nn.Conv1d), imported without the package's compiled extension
(models.kernels.mamba_ssm_triton). Ours runs its defaults on CUDA: Triton SSD and gated norm
from mamba_ssm, the torch.compile'd causal conv; VARIANTS adds others.
"""

from __future__ import annotations

import dataclasses
import statistics

import torch

from benchmarks.timing import cuda_times_ms
from models.config import ModelConfig
from models.kernels import mamba_ssm_triton
from models.mamba2 import Mamba2Mixer

VARIANTS = {
    # name: ModelConfig overrides of our mixer
    "ours": {},
    "ours_conv1d": {"conv_backend": "conv1d"},
    "ours_torch_ssd": {"ssd_backend": "torch", "gated_norm_backend": "torch"},
}

THEIRS = "mamba_ssm.Mamba2"


@dataclasses.dataclass
class MambaBenchmark:
    """The layer's shape and how long to time it (scripts/bench_mamba.py's flags)."""

    seq: int = 8192
    batch: int = 1
    hidden: int = 5120
    heads: int = 128
    head_dim: int = 80
    state: int = 128
    groups: int = 8
    chunk: int = 256
    warmup: int = 5
    iters: int = 20
    rounds: int = 2


def layer_config(args: MambaBenchmark) -> ModelConfig:
    return ModelConfig(
        name="bench_mamba_12b_layer", pattern="M", hidden_size=args.hidden, mamba_num_heads=args.heads,
        mamba_head_dim=args.head_dim, ssm_state_size=args.state, mamba_num_groups=args.groups,
        conv_kernel=4, chunk_size=args.chunk, ssd_backend="triton", gated_norm_backend="triton",
        conv_backend="compiled",
    ).validate()


def theirs_module(args: MambaBenchmark):
    mamba2 = mamba_ssm_triton.import_mamba_ssm_submodule("modules.mamba2")
    if mamba2.causal_conv1d_fn is not None:
        print("note: causal_conv1d is installed; mamba_ssm's Mamba2 uses it", flush=True)
    return mamba2.Mamba2(
        d_model=args.hidden, d_state=args.state, d_conv=4, expand=args.heads * args.head_dim // args.hidden,
        headdim=args.head_dim, ngroups=args.groups, chunk_size=args.chunk, use_mem_eff_path=False,
        device="cuda", dtype=torch.bfloat16,
    )


def ours_module(args: MambaBenchmark, theirs, overrides):
    cfg = dataclasses.replace(layer_config(args), **overrides)
    ours = Mamba2Mixer(cfg).to(device="cuda", dtype=torch.bfloat16)
    # Same layout and names as mamba_ssm's Mamba2 (in_proj, conv1d, dt_bias, A_log, D, norm, out_proj).
    missing, unexpected = ours.load_state_dict(theirs.state_dict(), strict=False)
    if missing or unexpected:
        raise RuntimeError(f"weight layouts differ: missing {missing}, unexpected {unexpected}")
    return ours


def time_ms(module, x, grad_out, warmup, iters, backward=True):
    """Mean ms per call of module(x) (and its backward), parameter and input gradients reset each call."""
    def step():
        for p in module.parameters():
            p.grad = None
        x.grad = None
        y = module(x)
        if backward:
            y.backward(grad_out)

    return statistics.mean(cuda_times_ms(step, warmup, iters))


def bench_mixers(args: MambaBenchmark, variants: list) -> dict:
    """Theirs and each of our ``variants`` on the same input: {'results': name -> times and ratios,
    'check': name -> relative output error vs theirs, 'params': parameters of the layer}."""
    torch.manual_seed(0)
    theirs = theirs_module(args)
    modules = {THEIRS: theirs}
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
        if name == THEIRS:
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
    base = results[THEIRS]["fwd_bwd_ms"]
    tokens = args.batch * args.seq
    for name, r in results.items():
        r["peak_note"] = "min over rounds of the mean over iters"
        r["ratio_vs_mamba2"] = r["fwd_bwd_ms"] / base
        r["tflops_6nt"] = 6 * params * tokens / (r["fwd_bwd_ms"] * 1e-3) / 1e12
    return {"results": results, "check": check, "params": params}
