"""The training-step benchmark (scripts/benchmark.py): one model in several precisions, side by side.

For each precision the model is built exactly as the trainer builds it (build_model_on ->
apply_precision -> parallelize) and timed with CUDA events (benchmarks.timing) after warm-up:

  fwd+bwd    forward, loss, backward (the quantity Megatron-Core's 196.8 ms BF16 refers to)
  step       the trainer's step (trainer.loop.train_step: fwd+bwd, gradient clipping, the loss
             and grad norm read back) + fused AdamW (a full optimizer step)

then where its memory goes (benchmarks.memory: weights by dtype, buffers, gradients, optimizer
states, activations at the fwd+bwd peak) and, optionally, a per-component breakdown of one profiled fwd+bwd (projections, SSD, conv,
norms, attention, quantization, loss, other) from the PyTorch profiler's CUDA kernel times,
with the number of kernels launched and the GPU's idle time (wall time not covered by kernels:
where a step is bound by launches or Python). With compiled blocks it also counts torch.compile's
graph breaks during the first call (each break splits a block and runs the code between eagerly).
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import time
from dataclasses import dataclass, field
from typing import Dict, List

import torch

from benchmarks.memory import activation_peak, tensor_memory
from benchmarks.timing import cuda_times_ms
from models.flops import flops_per_token
from models.quant.recipe import apply_precision
from trainer.config import TrainConfig, compose
from trainer.cuda_graph import GraphedMicroStep
from trainer.distributed import DistEnv, parallelize
from trainer.hardware import bf16_peak_flops
from trainer.loop import build_model_on, forward_backward, train_step
from trainer.optim import build_optimizer

# name -> config overrides. fp8 (1x128 / 128x128 blockwise, the paper's baseline) and fp8_tensor
# (one scale per tensor, TE's Float8CurrentScaling) run natively through torch._scaled_mm; nvfp4 is
# emulated on Hopper; nvfp4_te runs through Transformer Engine where the GPU supports it (Blackwell).
PRECISIONS = {
    "bf16": ["precision=bf16"],
    "fp8": ["precision=fp8", "precision.backend=torch"],
    "fp8_lm_head": ["precision=fp8", "precision.backend=torch", "precision.quantize_lm_head=true"],
    "fp8_tensor": ["precision=fp8", "precision.format=fp8_tensor", "precision.backend=torch"],
    "nvfp4": ["precision=nvfp4", "precision.backend=emulated"],
    # The study's other 4-bit arms, the NVFP4 recipe with one change each (results/study/study.yaml):
    # MXFP4 blocks and scales, Four Over Six block scales on every operand, UE5M3 block scales.
    "mxfp4": ["precision=nvfp4", "precision.format=mxfp4", "precision.name=mxfp4", "precision.backend=emulated"],
    "nvfp4_4over6": ["precision=nvfp4", "precision.format=nvfp4_4over6", "precision.name=nvfp4_4over6",
                     "precision.backend=emulated"],
    "nvfp4_ue5m3": ["precision=nvfp4", "precision.format=nvfp4_ue5m3", "precision.name=nvfp4_ue5m3",
                    "precision.backend=emulated"],
    "nvfp4_te": ["precision=nvfp4", "precision.backend=te"],
    "fp8_te": ["precision=fp8", "precision.backend=te"],
}
# Kernel-name patterns of each component (lower case; first match wins, in this order).
COMPONENTS = [
    # "absmaxops": ATen's max-abs reduction (torch.linalg.vector_norm(x, inf)), the NVFP4 amax pass;
    # "vector_norm": the same reduction compiled by Inductor, often fused with its producer (which
    # the "_norm_" pattern of the norms below would otherwise claim).
    ("quantization", ("quantize", "quant_", "_fp8_", "nvfp4", "e2m1", "amax", "hadamard", "rht", "absmaxops",
                      "vector_norm")),
    # The emulated NVFP4 GEMMs' decode-scale multiply and rounding of their fp32 output
    # (kernels.epilogue.scale_gemm_output); listed before the GEMMs, whose "gemm" pattern it also matches.
    ("GEMM output scaling", ("scale_gemm_output",)),
    ("ssd", ("chunk_scan", "chunk_state", "state_passing", "bmm_chunk", "chunk_cumsum", "ssd")),
    ("attention", ("flash", "fmha", "attention", "sdpa", "softmax_warp")),
    ("norms", ("rms", "layer_norm", "layernorm", "_norm_")),
    ("conv", ("conv", "causal")),
    ("projections (GEMMs)", ("gemm", "cutlass", "xmma", "nvjet", "sm90", "scaled_mm", "matmul", "cublas")),
    ("loss", ("log_softmax", "cross_entropy", "nll_loss", "logsoftmax")),
    ("optimizer", ("adam", "multi_tensor", "foreach")),
]


@dataclass
class StepBenchmark:
    """What to build and how long to time it (scripts/benchmark.py's flags)."""

    model: str = "slice_12b"
    seq_len: int = 8192
    micro_batch: int = 1
    warmup: int = 3
    iters: int = 10
    compile: bool = False
    activation_checkpoint: str = "none"
    profile: bool = True
    cuda_graph: bool = False
    trainer_rng: bool = False
    """Seed stochastic rounding as the trainer does (``plan.set_step``: each layer's seed tensor)
    instead of from the global RNG, to time what training runs pay for it."""
    override: List[str] = field(default_factory=list)


def build_config(precision: str, settings: StepBenchmark) -> TrainConfig:
    overrides = [
        f"model={settings.model}", *PRECISIONS[precision], f"data.seq_len={settings.seq_len}",
        "precision.bf16_layers_at_start=0", "precision.bf16_layers_at_end=0",
        f"parallel.activation_checkpoint={settings.activation_checkpoint}",
        f"parallel.compile={str(settings.compile).lower()}", "parallel.fsdp=off", "logging.wandb.mode=disabled",
    ] + list(settings.override)
    return compose(overrides)


def classify(kernel: str) -> str:
    name = kernel.lower()
    for component, patterns in COMPONENTS:
        if any(p in name for p in patterns):
            return component
    return "other (elementwise, copies)"


def is_kernel(key: str) -> bool:
    """Whether a CUDA profiler event is a kernel, not a range annotation around kernels.

    torch.compile marks each compiled graph call with a GPU-side range ("## Call CompiledFxGraph
    <hash> ##") whose device time is that of the kernels inside it; counting it too would count
    those kernels twice (it inflated "other" by ~90 ms on the slice).
    """
    return not key.startswith("##")


def profile_breakdown(fn) -> Dict[str, float]:
    """CUDA kernel time per component over one call of fn, in ms (annotations excluded)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        started = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        wall_ms = (time.perf_counter() - started) * 1000
    launches = 0
    totals: Dict[str, float] = {}
    kernels: Dict[str, float] = {}
    for event in prof.key_averages():
        if getattr(event, "device_type", None) != torch.autograd.DeviceType.CUDA:
            continue  # CPU-side ops: their kernels are counted as kernel events below
        device_us = getattr(event, "self_device_time_total", None) or getattr(event, "self_cuda_time_total", 0)
        if device_us <= 0 or not is_kernel(event.key):
            continue
        component = classify(event.key)
        if not event.key.startswith(("Memcpy", "Memset")):  # copies and fills the runtime issues are not launches
            launches += event.count
        totals[component] = totals.get(component, 0.0) + device_us / 1000
        kernels[event.key] = kernels.get(event.key, 0.0) + device_us / 1000
    top = sorted(kernels.items(), key=lambda kv: -kv[1])[:15]
    # The aten ops behind the kernels (with input shapes): where copies and elementwise time come from.
    ops = []
    for event in prof.key_averages(group_by_input_shape=True):
        device_us = getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0)
        if event.key.startswith("aten::") and device_us > 0:
            ops.append((device_us / 1000, event.count, event.key, str(event.input_shapes)[:160]))
    ops.sort(key=lambda row: -row[0])
    return {"components_ms": dict(sorted(totals.items(), key=lambda kv: -kv[1])),
            "kernel_launches": launches,
            # Under the profiler (which slows the host a little): the wall time of the profiled call.
            "profiled_wall_ms": wall_ms,
            "top_kernels_ms": {k[:120]: round(v, 3) for k, v in top},
            "top_aten_ops": [f"{ms:8.2f} ms x{count:<4} {key} {shapes}" for ms, count, key, shapes in ops[:25]]}


def time_graphed(model, optimizer, batch, autocast, device, settings: "StepBenchmark") -> dict:
    """Median ms of the micro-step and of the full step as parallel.cuda_graph trains them, or the error.

    The trainer's own ``GraphedMicroStep`` (trainer/cuda_graph.py): eager warm-up micro-steps, then
    forward + backward recorded once and replayed on static inputs, gradients accumulated into
    persistent buffers. The full step adds clipping, the loss read-back and AdamW (not graphed).
    """
    graphed = GraphedMicroStep(model, lambda micro_batch: forward_backward(model, micro_batch, autocast, device),
                               device)

    def micro_step():
        graphed(batch, 0)

    def full_step():
        train_step(model, optimizer, itertools.repeat(batch), 1, autocast, device, 1.0, lambda: None,
                   run_micro_step=graphed)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    try:
        for _ in range(graphed.warmup + 1):  # the last call records the graph, then replays it
            micro_step()
        torch.cuda.synchronize()
        micro = cuda_times_ms(micro_step, settings.warmup, settings.iters, synchronize_each=True)
        step = cuda_times_ms(full_step, 2, settings.iters, synchronize_each=True)
        expected_replays = 1 + (settings.warmup + settings.iters) + (2 + settings.iters)  # capture, micro, full
        if (graphed.captures, graphed.replays) != (1, expected_replays):
            raise RuntimeError(f"expected 1 recording and {expected_replays} replays, got {graphed.captures} and "
                               f"{graphed.replays}")
        return {"fwd_bwd_graph_ms": sorted(micro)[len(micro) // 2], "step_graph_ms": sorted(step)[len(step) // 2]}
    except Exception as error:  # reported in the table: the capture is an option, not the step
        torch.cuda.synchronize()
        return {"fwd_bwd_graph_error": f"{type(error).__name__}: {str(error)[:300]}"}
    finally:
        optimizer.zero_grad(set_to_none=True)


@contextlib.contextmanager
def count_graph_breaks():
    """Yields a dict filled on exit: torch.compile's graph breaks during the block, by reason.

    {"total": n, "reasons": {reason: count, ...}} (the five most frequent reasons, each cut to
    200 characters), from torch._dynamo's counters, as a difference, so earlier compilations in
    the process do not count.
    """
    from torch._dynamo.utils import counters

    before = dict(counters["graph_break"])
    summary: Dict[str, object] = {}
    try:
        yield summary
    finally:
        added: Dict[str, int] = {}
        for reason, count in counters["graph_break"].items():
            if count > before.get(reason, 0):
                # One line of at most 200 characters; reasons that then read the same are counted together.
                short = " ".join(str(reason).split())[:200]
                added[short] = added.get(short, 0) + count - before.get(reason, 0)
        summary["total"] = sum(added.values())
        summary["reasons"] = dict(sorted(added.items(), key=lambda kv: -kv[1])[:5])


def bench_precision(precision: str, settings: StepBenchmark) -> dict:
    """Build the model in ``precision`` as the trainer does and time fwd+bwd and the full step on CUDA."""
    cfg = build_config(precision, settings)
    device = torch.device("cuda")
    env = DistEnv(rank=0, local_rank=0, world_size=1, device=device)
    torch.cuda.reset_peak_memory_stats()
    model = build_model_on(cfg, device)
    plan = apply_precision(model, cfg.precision, device=device)
    if settings.trainer_rng:
        plan.set_step(0)  # per-layer seed tensors, as trainer.callbacks.PrecisionRuntime writes them
    autocast_dtype = parallelize(model, cfg.parallel, env, cfg.data.seq_len)["autocast_dtype"]
    autocast = (torch.autocast("cuda", dtype=autocast_dtype) if autocast_dtype is not None
                else contextlib.nullcontext())
    optimizer = build_optimizer(model, cfg.optim, device)
    vocab, seq = cfg.model.vocab_size, cfg.data.seq_len
    batch = {"inputs": torch.randint(0, vocab, (settings.micro_batch, seq), device=device),
             "labels": torch.randint(0, vocab, (settings.micro_batch, seq), device=device)}

    def fwd_bwd_only():  # train_step's micro-step alone: no clipping, no read-back
        return forward_backward(model, batch, autocast, device)

    def full_step():
        train_step(model, optimizer, itertools.repeat(batch), 1, autocast, device, 1.0, lambda: None)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    started = time.time()
    with count_graph_breaks() as graph_breaks:
        fwd_bwd_only()  # first call: compile, autotune, lazy init
    optimizer.zero_grad(set_to_none=True)
    first_call_s = time.time() - started
    fwd_bwd = cuda_times_ms(lambda: (fwd_bwd_only(), optimizer.zero_grad(set_to_none=True)), settings.warmup,
                            settings.iters, synchronize_each=True)
    step = cuda_times_ms(full_step, 2, settings.iters, synchronize_each=True)
    breakdown = profile_breakdown(fwd_bwd_only) if settings.profile else {}
    optimizer.zero_grad(set_to_none=True)
    graphed = time_graphed(model, optimizer, batch, autocast, device, settings) if settings.cuda_graph else {}
    peak_memory_gib = torch.cuda.max_memory_allocated() / 2**30  # over everything above
    optimizer.zero_grad(set_to_none=True)
    activations_gib = activation_peak(fwd_bwd_only, model)
    memory = {**tensor_memory(model, optimizer), "activations": activations_gib}  # grads and states exist now
    optimizer.zero_grad(set_to_none=True)
    tokens = settings.micro_batch * seq
    flops = flops_per_token(cfg.model, seq) * tokens
    peak = bf16_peak_flops(device) or 989.4e12
    median = sorted(fwd_bwd)[len(fwd_bwd) // 2]
    step_median = sorted(step)[len(step) // 2]
    result = {
        "precision": precision,
        "backend": plan.backend,
        "fwd_bwd_ms": median,
        "fwd_bwd_ms_min": min(fwd_bwd),
        "step_ms": step_median,
        "tokens_per_s": tokens / (median / 1000),
        "mfu": flops / (median / 1000) / peak,
        "step_mfu": flops / (step_median / 1000) / peak,
        "peak_memory_gib": peak_memory_gib,
        "memory_gib": memory,
        "model_tflop_per_step": flops / 1e12,
        "first_call_s": first_call_s,
        "graph_breaks": graph_breaks,
        "parameters": sum(p.numel() for p in model.parameters()),
        "plan": plan.summary(),
        **breakdown,
        **graphed,
    }
    model = optimizer = plan = batch = None  # freed before the next precision is built
    gc.collect()
    torch.cuda.empty_cache()
    return result


def render(results: List[dict]) -> str:
    base = next((r for r in results if r["precision"] == "bf16" and "error" not in r), None)
    header = (f"{'precision':<10} {'backend':<9} {'fwd+bwd ms':>10} {'step ms':>8} {'tokens/s':>9} {'MFU':>6} "
              f"{'peak GiB':>8} {'vs bf16':>7}")
    lines = [header, "-" * len(header)]
    for r in results:
        if "error" in r:
            lines.append(f"{r['precision']:<10} error: {r['error']}")
            continue
        ratio = r["fwd_bwd_ms"] / base["fwd_bwd_ms"] if base else float("nan")
        lines.append(f"{r['precision']:<10} {r['backend']:<9} {r['fwd_bwd_ms']:>10.1f} {r['step_ms']:>8.1f} "
                     f"{r['tokens_per_s']:>9,.0f} {100 * r['mfu']:>5.1f}% {r['peak_memory_gib']:>8.1f} {ratio:>6.2f}x")
    for r in results:
        if r.get("memory_gib"):
            parts = ", ".join(f"{k} {v:.1f}" for k, v in r["memory_gib"].items())
            lines.append(f"  {r['precision']} memory (GiB of {r['peak_memory_gib']:.1f} peak): {parts}")
    for r in results:
        if r.get("components_ms"):
            total = sum(r["components_ms"].values())
            parts = ", ".join(f"{k} {v:.1f}" for k, v in r["components_ms"].items())
            lines.append(f"  {r['precision']} breakdown (ms of {total:.1f} kernel time): {parts}")
    graphed_base = (base or {}).get("fwd_bwd_graph_ms")
    for r in results:
        if "fwd_bwd_graph_ms" in r:
            ratio = r["fwd_bwd_graph_ms"] / graphed_base if graphed_base else float("nan")
            step_part = (f"; full step {r['step_graph_ms']:.1f} ms (without: {r['step_ms']:.1f} ms)"
                         if "step_graph_ms" in r else "")
            lines.append(f"  {r['precision']} fwd+bwd replayed from one CUDA graph (parallel.cuda_graph): "
                         f"{r['fwd_bwd_graph_ms']:.1f} ms (without: {r['fwd_bwd_ms']:.1f} ms); {ratio:.2f}x bf16's graph"
                         f"{step_part}")
        elif "fwd_bwd_graph_error" in r:
            lines.append(f"  {r['precision']} CUDA graph capture failed: {r['fwd_bwd_graph_error']}")
    for r in results:
        if "kernel_launches" in r:
            # Wall time not covered by the summed kernel time (0 if kernels on several streams overlapped).
            idle = max(0.0, r["profiled_wall_ms"] - sum(r["components_ms"].values()))
            lines.append(f"  {r['precision']} launches: {r['kernel_launches']} kernels in one fwd+bwd; "
                         f"GPU idle {idle:.1f} ms of {r['profiled_wall_ms']:.1f} ms profiled wall time")
        breaks = r.get("graph_breaks") or {}
        if breaks.get("total"):
            reasons = "; ".join(f"{count}x {reason}" for reason, count in breaks["reasons"].items())
            lines.append(f"  {r['precision']} graph breaks while compiling: {breaks['total']} ({reasons})")
    return "\n".join(lines)
