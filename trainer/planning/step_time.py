"""Seconds of one optimizer step on one GPU: the GEMM cost model plus the work around the GEMMs.

Per micro-batch (t tokens), each term at a stated share of the datasheet rate (`Efficiency`):

    GEMMs          every GEMM of models.gemms in the format the recipe gives it:
                   max(FLOPs / (peak_format x gemm), bytes / HBM); emulated formats run as BF16 GEMMs
                   with an FP32 output; recomputing blocks run their Fprop GEMMs twice
    quantization   trainer.planning.gemm_costs.quantization_bytes / (HBM x quantization); the emulation
                   adds the pass that scales each FP32 GEMM output to BF16 (only Wgrad's when compiled:
                   torch.compile fuses Fprop's and Dgrad's into their consumers)
    attention      the causal BMMs' FLOPs / (BF16 peak x attention)   (flash attention, recompute included)
    SSD scan       Megatron's 3 x 7 d N FLOPs per token and layer / (BF16 peak x ssd)
                   + SSD_BYTES_PER_TOKEN_LAYER / HBM per token and Mamba layer (the chunked kernels'
                   per-token work that does not grow with d N: the small-model floor)
    elementwise    ELEMENTWISE_PASSES x the activations the blocks save (memory.block_activation_bytes)
                   + CAST_BYTES_PER_WEIGHT per linear weight (the BF16 copy made in forward, the
                   gradient widened to FP32) / (HBM x memory)
    loss           LOSS_BYTES_PER_LOGIT per logit / (HBM x memory)  (cast, log-softmax, its backward)

    micro-batch    the sum above x (1 + idle): the GPU waiting on launches between kernels
                   (`idle` without CUDA graphs, `graphed_idle` with parallel.cuda_graph)

Per step: accumulation x micro-batch + the optimizer (fused AdamW over the local shard and the
gradient-norm clip: OPTIMIZER_BYTES_PER_PARAMETER / (HBM x memory)) + the exposed part of the
FSDP/HSDP traffic (`communication`: the traffic not hidden behind the step's compute, plus one
block's all-gather before the first block runs and one block's reduce-scatter after the last).

The shares were set on one H200 (docs/planning.md, "Calibration"): the 12B-shaped slice's kernel
profile in BF16 and emulated NVFP4 (GEMMs, quantization, attention, SSD, elementwise, loss) and the
study model's (the SSD floor, the idle share with CUDA graphs). The other GPUs take the same shares
of their own datasheet rates: an assumption, since no Blackwell GPU was measured.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict

from models.config import ModelConfig
from models.flops import count_parameters, flops_breakdown
from models.gemms import ATTENTION_KIND, training_gemms
from trainer.planning.gemm_costs import FORMAT_COSTS, OUTPUT_BYTES, gemm_operand_bytes, quantization_bytes
from trainer.planning.layout import RunLayout
from trainer.planning.memory import block_activation_bytes, block_parameters, linear_saved_input_bytes


@dataclass(frozen=True)
class Efficiency:
    """Achieved share of a datasheet rate, per kind of work (docs/planning.md: where each was measured)."""

    gemm: float = 0.80
    """BF16 GEMMs (and the emulation's): the slice's 93.9 TFLOP of GEMMs in 116.4 ms of kernels on the H200."""
    gemm_low_precision: float = 0.585
    """Native FP8 / FP4 GEMMs: the slice's FP8 block GEMMs, 58.8 TFLOP in ~50.8 ms on the H200 (FP4 assumed alike)."""
    quantization: float = 0.45
    """Quantization kernels' share of HBM bandwidth (NVFP4 rows/columns kernels 44-57% of a copy)."""
    attention: float = 0.42
    """Flash attention (forward + backward) on the model FLOPs of the causal BMMs."""
    ssd: float = 0.064
    """The mamba_ssm chunked scan on Megatron's SSD FLOPs (small matmuls inside one kernel)."""
    memory: float = 0.85
    """Elementwise, loss and optimizer kernels' share of HBM bandwidth (a device copy reaches 0.8-0.9)."""
    network: float = 0.80
    """NCCL's bus bandwidth as a share of the link's (all-gather, reduce-scatter, all-reduce)."""
    idle: float = 0.06
    """GPU idle between kernels, as a share of the kernel time, without CUDA graphs (slice: 10.6 of 170.1 ms)."""
    graphed_idle: float = 0.02
    """The same with the micro-batch replayed from a CUDA graph (study model: 0.4 of 19.2 ms)."""


H200_CALIBRATED = Efficiency()

ELEMENTWISE_PASSES = 11.0
"""Bytes the elementwise kernels (norms, activations, residual adds, casts, the conv, copies) move, as a
multiple of the activations the blocks save: set so that the slice's "other" and norm kernels (29.2 ms,
BF16) come out; the study model's (8.4 ms) then come out within 15%."""
CAST_BYTES_PER_WEIGHT = 12.0
"""Per linear weight and micro-batch: the compute copy (read 4, write 2) and its gradient widened to FP32 (2 + 4)."""
LOSS_BYTES_PER_LOGIT = 32.0
"""The logits cast to FP32 (2 + 4), log-softmax (4 + 4 + a second read 4), the loss's gradient (4) and
log-softmax's backward (4 + 4 + 4) and the cast back (4 + 2), less what fuses: the slice's 8.4 ms."""
SSD_BYTES_PER_TOKEN_LAYER = 72e3
"""The SSD kernels' per-token cost beside their FLOPs, as HBM bytes: set by the study model's scan (6.4 ms
for 7 layers x 32768 tokens, where the FLOPs account for 2.2 ms); 0.4 ms of the slice's 11.1."""
OPTIMIZER_BYTES_PER_PARAMETER = 32.0
"""Fused AdamW reads weight, gradient, two moments (16) and writes three (12); clipping reads the gradient (4)."""


@dataclass(frozen=True)
class StepTime:
    """Seconds of one optimizer step on one GPU, by part."""

    parts: Dict[str, float]
    """Per step (micro-batch parts already multiplied by the accumulation)."""
    compute: float
    """Everything but the exposed communication."""
    communication: float
    """FSDP/HSDP traffic of the step at the links' rates, before any overlap."""
    exposed_communication: float

    @property
    def total(self) -> float:
        return self.compute + self.exposed_communication


def _gemm_rate(layout: RunLayout, fmt: str, eff: Efficiency) -> float:
    peaks = layout.gpu.peak_flops
    if fmt == "bf16" or layout.backend == "emulated":
        return peaks["bf16"] * eff.gemm
    return peaks[FORMAT_COSTS[fmt].peak_key] * eff.gemm_low_precision


def micro_batch_parts(cfg: ModelConfig, layout: RunLayout, eff: Efficiency) -> Dict[str, float]:
    """Seconds of one micro-batch's forward and backward, by part, before the idle share."""
    tokens, seq = layout.tokens_per_micro_batch, layout.seq_len
    bandwidth, peak = layout.gpu.hbm_bytes_per_s, layout.gpu.peak_flops["bf16"]
    emulated = layout.backend == "emulated"
    parts = dict.fromkeys(("GEMMs", "quantization", "attention", "SSD scan", "elementwise", "loss"), 0.0)
    recomputes = layout.checkpointed
    for gemm in training_gemms(cfg, tokens, seq):
        symbol = cfg.pattern[gemm.layer] if gemm.layer is not None else None
        repeat = 2 if symbol is not None and symbol in recomputes and gemm.kind == "fprop" else 1
        if gemm.kind == ATTENTION_KIND:
            continue  # flash attention: below
        fmt = layout.gemm_formats.get(gemm.name, {}).get(gemm.kind, "bf16")
        operand_fmt = "bf16" if emulated else fmt
        traffic = gemm_operand_bytes(gemm, operand_fmt) + (OUTPUT_BYTES * gemm.M * gemm.N if emulated and fmt != "bf16"
                                                           else 0.0)
        parts["GEMMs"] += repeat * max(gemm.flops / _gemm_rate(layout, fmt, eff), traffic / bandwidth)
        if fmt != "bf16":
            quantized = quantization_bytes(gemm, fmt)
            if emulated and (gemm.kind == "wgrad" or not layout.compiled):
                quantized += (4 + 2) * gemm.M * gemm.N  # the FP32 output scaled and rounded to BF16
            parts["quantization"] += repeat * quantized / (bandwidth * eff.quantization)

    flops = flops_breakdown(cfg, seq)
    attention_share = 1 + (1 / 3 if "*" in recomputes else 0)  # a recomputing block repeats the forward third
    parts["attention"] = attention_share * tokens * flops["attention"] / (peak * eff.attention)
    mamba_layers = cfg.pattern.count("M")
    ssd_share = 1 + (1 / 3 if "M" in recomputes else 0)
    parts["SSD scan"] = ssd_share * tokens * (flops["ssd_scan"] / (peak * eff.ssd)
                                              + mamba_layers * SSD_BYTES_PER_TOKEN_LAYER / bandwidth)

    saved = sum(block_activation_bytes(cfg, layout, i) * (1 + (1 / 3 if s in recomputes else 0))
                for i, s in enumerate(cfg.pattern))
    saved += layout.residual_bytes * cfg.hidden_size + cfg.hidden_size * linear_saved_input_bytes(layout, "lm_head")
    linear_weights = sum(g.N * g.K for g in training_gemms(cfg, seq, seq) if g.kind == "fprop")
    elementwise_bytes = ELEMENTWISE_PASSES * tokens * saved + CAST_BYTES_PER_WEIGHT * linear_weights
    parts["elementwise"] = elementwise_bytes / (bandwidth * eff.memory)
    parts["loss"] = tokens * cfg.vocab_size * LOSS_BYTES_PER_LOGIT / (bandwidth * eff.memory)
    return parts


def communication_seconds(cfg: ModelConfig, layout: RunLayout, eff: Efficiency) -> tuple[float, float]:
    """(FSDP/HSDP seconds of one step, seconds that cannot overlap: one block's all-gather + reduce-scatter)."""
    if not layout.fsdp or layout.gpus == 1:
        return 0.0, 0.0
    gpu, params = layout.gpu, count_parameters(cfg)
    shard, replicate = layout.shard, layout.replicate

    def link(group: int) -> float:  # a group inside one NVLink domain talks over NVLink, else over the network
        within = group <= min(layout.gpus_per_node, gpu.nvlink_domain) and gpu.nvlink_bytes_per_s > 0
        return (gpu.nvlink_bytes_per_s if within else gpu.network_bytes_per_s) * eff.network

    share = (shard - 1) / shard
    gather = layout.compute_bytes * params * share  # one all-gather of every parameter
    reduce = layout.reduce_bytes * params * share  # one reduce-scatter of every gradient
    # Forward and backward gather every micro-batch; gradients are reduced once per step.
    seconds = (2 * layout.accumulation * gather + reduce) / link(shard) if shard > 1 else 0.0
    if replicate > 1:  # HSDP: the sharded gradient all-reduced across replicas (ring: 2 (R-1)/R of it)
        seconds += 2 * (replicate - 1) / replicate * layout.reduce_bytes * params / shard / link(shard * replicate)
    largest = max(block_parameters(cfg, s) for s in set(cfg.pattern))
    tail = ((layout.compute_bytes + layout.reduce_bytes) * largest * share / link(shard)) if shard > 1 else 0.0
    return seconds, tail


def plan_step_time(cfg: ModelConfig, layout: RunLayout, eff: Efficiency = H200_CALIBRATED) -> StepTime:
    """Seconds of one optimizer step on one GPU (module docstring: the terms and their shares)."""
    micro = micro_batch_parts(cfg, layout, eff)
    idle_share = eff.graphed_idle if layout.cuda_graph else eff.idle
    parts = {name: seconds * layout.accumulation for name, seconds in micro.items()}
    parts["idle between kernels"] = sum(micro.values()) * idle_share * layout.accumulation
    local_parameters = count_parameters(cfg) / layout.shard
    parts["optimizer"] = local_parameters * OPTIMIZER_BYTES_PER_PARAMETER / (layout.gpu.hbm_bytes_per_s * eff.memory)
    compute = sum(parts.values())
    communication, tail = communication_seconds(cfg, layout, eff)
    exposed = max(0.0, communication - compute) + tail if communication else 0.0
    parts["communication (exposed)"] = exposed
    return StepTime(parts=parts, compute=compute, communication=communication, exposed_communication=exposed)
