"""Seconds of one optimizer step on one GPU: the GEMM cost model plus the work around the GEMMs.

Per micro-batch (t tokens), each term at a stated share of the datasheet rate (`Efficiency`):

    GEMMs          every GEMM of models.gemms in the format the recipe gives it:
                   max(FLOPs / (peak_format x gemm), bytes / HBM); emulated formats run as BF16 GEMMs
                   with an FP32 output; recomputing blocks run their Fprop GEMMs twice
    quantization   trainer.planning.gemm_costs.quantization_bytes / (HBM x quantization); the emulation
                   adds the pass that scales each FP32 GEMM output to BF16 (only Wgrad's when compiled:
                   torch.compile fuses Fprop's and Dgrad's into their consumers)
    attention      the causal BMMs' FLOPs / (BF16 peak x attention)   (flash attention, recompute included);
                   under context parallelism over C ranks the last piece's queries read every key before
                   them, (2C - 1)/C of a rank's average share, and the step waits for that rank
    SSD scan       Megatron's 3 x 7 d N FLOPs per token and layer / (BF16 peak x ssd)
                   + under context parallelism the state passing's matmuls (the piece's end state and
                   the entering state's share of every output: CP_STATE_FLOPS d N per token and Mamba
                   layer, forward and backward, in the compute dtype) / (BF16 peak x gemm) and its
                   elementwise traffic (CP_STATE_BYTES per token, layer and d) / (HBM x memory)
                   + SSD_BYTES_PER_TOKEN_LAYER / HBM per token and Mamba layer (the chunked kernels'
                   per-token work that does not grow with d N: the small-model floor)
    elementwise    ELEMENTWISE_PASSES x the activations the blocks save (memory.block_activation_bytes)
                   + the copies of the weights and their gradients (``weight_copy_bytes``: without FSDP
                   CAST_BYTES_PER_WEIGHT per linear weight, autocast's BF16 copy and the gradient widened
                   to FP32; under FSDP2 the copies out of each all-gather and into each reduce-scatter)
                   + the copy joining a scattering linear's per-sequence outputs / (HBM x memory)
    loss           LOSS_BYTES_PER_LOGIT per logit / (HBM x memory)  (cast, log-softmax, its backward)

    micro-batch    the sum above x (1 + idle): the GPU waiting on launches between kernels
                   (`idle` without CUDA graphs, `graphed_idle` with parallel.cuda_graph)

Per step: accumulation x micro-batch + the optimizer (fused AdamW over the local shard and the
gradient-norm clip: OPTIMIZER_BYTES_PER_PARAMETER / (HBM x memory)) + communication, every term from the
collectives list (trainer.planning.collectives.step_collectives, its seconds per call there):

    tensor parallel   every TP collective, not overlapped: the sequence-parallel all-gathers and
                      reduce-scatters sit between a block's norm and its mixer, the amax all-reduces
                      before the quantization that needs them; except, in a linear that gathers its
                      input quantized, the backward's X^T gather behind its Dgrad and dX's
                      reduce-scatter behind its Wgrad, and in one that scatters its output, its
                      reduce-scatters a sequence at a time behind the next sequence's Fprop and dY^T's
                      gather behind its Dgrad, as much as those cover (``hidden_tp_seconds``)
    context parallel  the conv halos, SSD states and K/V of models/context_parallel.py, not overlapped
                      (each sits between two kernels of its mixer)
    scalars           the loss, gradient-norm and flag all-reduces, not overlapped
    FSDP / HSDP       overlapped with the compute and TP time of the phase that issues them (FSDP2
                      gathers the next unit and reduces the previous one on their own streams), phase by
                      phase: a forward with its all-gathers (every micro-batch's with
                      reshard=per_micro_batch, the first one's alone with per_step, which gathers once a
                      step), a backward with its reduce-scatters and HSDP all-reduces (every micro-batch's
                      with grad_reduce=per_micro_batch, the last one's with per_step) and the gathers again
                      of the units a forward freed (reshard=per_micro_batch). A phase waits for
                      max(its calls nothing can hide, its traffic - its compute): a forward cannot run ahead
                      of the parameters it needs, nor a backward's traffic hide behind another phase's
                      compute, so a step whose forward gathers outlast the forward stalls there however
                      short its backward's reductions are (the 12B on 2048 GPUs). What nothing can hide:
                      the embedding's and the first block's all-gathers before a forward can start, the
                      embedding's reduce-scatter and all-reduce after the last backward, and what of the
                      head's calls outlasts the blocks beside them: FSDP2 gathers a unit only when the
                      forward reaches the one before it, so the head's gather hides behind the last two
                      blocks' forward alone, and it keeps one reduction in flight, so the head's
                      reduce-scatter (and HSDP all-reduce), the first of the backward, hides behind the last
                      block's backward alone (a block: the micro-batch's compute / blocks, FORWARD_SHARE of
                      it forward)

With tensor parallelism over T ranks every term of the micro-batch is one rank's share
(trainer.planning.tensor_parallel: the GEMMs at their local shapes; attention, the SSD, the elementwise
work and the loss / T; the weight casts of the local shards, the LM head's among them).

The shares were set on one H200 (docs/planning.md, "Calibration"): the 12B-shaped slice's kernel
profile in BF16 and emulated NVFP4 (GEMMs, quantization, attention, SSD, elementwise, loss) and the
study model's (the SSD floor, the idle share with CUDA graphs). The other GPUs take the same shares
of their own datasheet rates: an assumption, since no Blackwell GPU was measured.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Sequence, Tuple

from models.config import ModelConfig
from models.flops import flops_breakdown
from models.gemms import ATTENTION_KIND
from trainer.planning.collectives import (ALL_GATHER, NVFP4_GATHERED_BYTES, REDUCE_SCATTER, TP, Collective, call_seconds,
                                          seconds_by_kind, step_collectives)
from trainer.planning.gemm_costs import (FORMAT_COSTS, HIGH_PRECISION_BYTES, OUTPUT_BYTES, gemm_operand_bytes,
                                         quantization_bytes)
from trainer.planning.layout import (RunLayout, code_gathered_bytes, code_gathered_linears, memoized,
                                     quantized_input_gathers, quantized_output_scatters, recomputes)
from trainer.planning.memory import block_activation_bytes, linear_saved_input_bytes
from trainer.planning.parameters import EMBEDDINGS, HEAD, local_parameters, unit_sizes
from trainer.planning.tensor_parallel import local_training_gemms


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
    """The GPU's kernels: everything but communication."""
    communication: float
    """Every collective of the step at the links' rates, before any overlap."""
    exposed_communication: float
    """What the step waits for: TP collectives but what hides behind their linears' GEMMs, scalar collectives
    whole, the FSDP/HSDP traffic not hidden."""
    collectives: Tuple[Collective, ...] = ()
    hidden_tensor_parallel: float = 0.0
    """TP collectives hidden beside their linears' GEMMs (``hidden_tp_seconds``), per step."""

    @property
    def total(self) -> float:
        return self.compute + self.exposed_communication


CP_STATE_FLOPS = 14
"""Context parallelism's SSD state passing per token, Mamba layer and d N (models/context_parallel.py): the
piece's end state sum_s w_s x_s B_s^T and the entering state's term C_t . h, 2 d N FLOPs each forward; in the
backward both operands' gradients of each (8) and C_t . h again for the decays' gradient (2)."""

CP_STATE_BYTES = (15, 24)
"""Context parallelism's SSD state passing per token, Mamba layer and d, besides its matmuls: (bytes per byte of
the compute dtype, FP32 bytes) its elementwise passes move when compiled and fused (estimated from the passes of
models/context_parallel.py: the scaled x, the decays' products, y read and written; eager moves ~20 more)."""

FORWARD_SHARE = 1 / 3
"""A forward pass's share of a training micro-batch: Fprop is one of the three GEMMs of every linear, and
the elementwise, attention and SSD forward kernels about a third of their forward + backward."""

def _gemm_rate(layout: RunLayout, fmt: str, eff: Efficiency) -> float:
    peaks = layout.gpu.peak_flops
    if fmt == "bf16" or layout.backend == "emulated":
        return peaks["bf16"] * eff.gemm
    return peaks[FORMAT_COSTS[fmt].peak_key] * eff.gemm_low_precision


def _gemm_totals(cfg: ModelConfig, layout: RunLayout, eff: Efficiency) -> Dict[object, Dict[str, float]]:
    """Per block symbol (None: the LM head): GEMM and quantization seconds of one micro-batch on one TP rank,
    split into Fprop (which a recomputing block runs twice) and the rest."""
    totals: Dict[object, Dict[str, float]] = {}
    for gemm, seconds, quantizing in _each_gemm(cfg, layout, eff):
        symbol = cfg.pattern[gemm.layer] if gemm.layer is not None else None
        entry = totals.setdefault(symbol, dict.fromkeys(("fprop", "rest", "fprop_quant", "rest_quant"), 0.0))
        forward = gemm.kind == "fprop"
        entry["fprop" if forward else "rest"] += seconds
        entry["fprop_quant" if forward else "rest_quant"] += quantizing
    return totals


def _each_gemm(cfg: ModelConfig, layout: RunLayout, eff: Efficiency):
    """(gemm, GEMM seconds, seconds quantizing its operands) of each GEMM of one micro-batch on one TP rank,
    attention's BMMs left out."""
    bandwidth, emulated = layout.gpu.hbm_bytes_per_s, layout.backend == "emulated"
    # These quantize their rank's tokens of X (column-parallel) or of dY (row-parallel) and gather the codes.
    gathering, scattering = quantized_input_gathers(cfg, layout), quantized_output_scatters(cfg, layout)
    codes = code_gathered_linears(cfg, layout)
    last_block = f"layers.{len(cfg.pattern) - 1}."
    # A context-parallel rank's piece as sequences of seq_len / cp tokens: the linears see only the token count
    # (attention's BMMs, whose shapes the sequence length sets, are skipped here).
    for gemm in local_training_gemms(cfg, layout.tokens_per_micro_batch, layout.seq_len // layout.cp, layout.tp):
        if gemm.kind == ATTENTION_KIND:
            continue  # flash attention: _compute_micro_batch_parts
        fmt = layout.gemm_formats.get(gemm.name, {}).get(gemm.kind, "bf16")
        operand_fmt = "bf16" if emulated else fmt
        traffic = gemm_operand_bytes(gemm, operand_fmt) + (OUTPUT_BYTES * gemm.M * gemm.N if emulated and fmt != "bf16"
                                                           else 0.0)
        seconds = max(gemm.flops / _gemm_rate(layout, fmt, eff), traffic / bandwidth)
        quantizing = 0.0
        if fmt != "bf16":
            quantized = quantization_bytes(gemm, fmt, input_share=1 / layout.tp if gemm.name in gathering else 1.0,
                                           gradient_share=1 / layout.tp if gemm.name in scattering else 1.0)
            if emulated and (gemm.kind == "wgrad" or not layout.compiled):
                quantized += (4 + 2) * gemm.M * gemm.N  # the FP32 output scaled and rounded to BF16
            if gemm.name in codes:
                quantized += _code_gathered_weight_bytes(gemm.kind, codes[gemm.name], fmt, layout,
                                                         gemm.name.startswith(last_block))
            quantizing = quantized / (bandwidth * eff.quantization)
        yield gemm, seconds, quantizing


def _code_gathered_weight_bytes(kind: str, elements: int, fmt: str, layout: RunLayout, kept: bool) -> float:
    """What a linear whose weight (``elements``, TP-local) FSDP2 gathers as codes changes in a micro-batch's
    quantization traffic, booked on its GEMMs: Fprop (repeated in a recomputing block) no longer quantizes W, and
    the emulated layer expands the codes to its values there instead (read the codes, write the compute dtype);
    each rank quantizes its 1/S of the rows at every gather (once a step with reshard=per_step; per micro-batch
    before the forward and again before the backward, unless the block stays gathered between them), booked on
    Wgrad, which no recomputation repeats."""
    cost = FORMAT_COSTS[fmt]
    whole = elements * HIGH_PRECISION_BYTES * cost.reads_per_quantization + cost.weight_bytes(elements)
    if kind == "fprop":
        expand = (code_gathered_bytes(elements) + layout.compute_bytes * elements) if layout.backend == "emulated" else 0
        return expand - whole
    if kind == "wgrad":
        gathers = 1 / layout.accumulation if layout.reshard == "per_step" else (1 if kept else 2)
        return whole * gathers / layout.shard
    return 0.0


def hidden_tp_seconds(cfg: ModelConfig, layout: RunLayout, eff: Efficiency = H200_CALIBRATED) -> float:
    """Seconds of TP collectives a micro-batch hides behind its GEMMs (NCCL on its own stream, the GEMM assumed
    not slowed by it):

    - a linear that gathers its input quantized gathers X^T's codes while its Dgrad runs (quantization
      included) and reduce-scatters dX while its Wgrad runs: each hides what of the collective the GEMM covers;
    - a linear that scatters its output runs Fprop and the reduce-scatter a sequence at a time (B of them, r
      seconds each, f of Fprop each): a two-stage pipeline hides (B - 1) min(r, f), again in a recomputing
      block's forward; in the backward it gathers dY^T's codes while Dgrad runs."""
    gathering, scattering = quantized_input_gathers(cfg, layout), quantized_output_scatters(cfg, layout)
    if not gathering and not scattering:
        return 0.0
    windows: Dict[str, Dict[str, float]] = {}
    for gemm, seconds, quantizing in _each_gemm(cfg, layout, eff):
        if gemm.name in gathering:
            windows.setdefault(gemm.name, {})[gemm.kind] = seconds + quantizing
        elif gemm.name in scattering:
            windows.setdefault(gemm.name, {})[gemm.kind] = seconds  # its operands are quantized before the calls
    group, pieces = layout.tp, layout.micro_batch
    activation = layout.compute_bytes * layout.tokens_per_micro_batch * cfg.hidden_size
    scatter = call_seconds(Collective(REDUCE_SCATTER, TP, group, activation, 1, "", ""), layout, eff.network)
    piece = call_seconds(Collective(REDUCE_SCATTER, TP, group, activation // pieces, 1, "", ""), layout, eff.network)
    codes = call_seconds(Collective(ALL_GATHER, TP, group, layout.tokens_per_micro_batch * cfg.hidden_size
                                    * NVFP4_GATHERED_BYTES, 1, "", ""), layout, eff.network)
    hidden = 0.0
    for name, window in windows.items():
        if name in scattering:
            forwards = 2 if recomputes(cfg, layout, name) else 1
            hidden += forwards * (pieces - 1) * min(piece, window.get("fprop", 0.0) / pieces)
            hidden += min(codes, window.get("dgrad", 0.0))
            continue
        hidden += min(scatter, window.get("wgrad", 0.0))
        if layout.gemm_formats.get(name, {}).get("wgrad", "bf16") != "bf16":
            hidden += min(codes, window.get("dgrad", 0.0))
    return hidden


def _gemm_parts(cfg: ModelConfig, layout: RunLayout, eff: Efficiency) -> tuple[float, float]:
    """(GEMM seconds, quantization seconds) of one micro-batch on one TP rank; recomputing blocks run their
    Fprop twice."""
    gpu = layout.gpu
    device = (gpu.name, tuple(sorted(gpu.peak_flops.items())), gpu.hbm_bytes_per_s)
    totals = memoized(_MICRO_CACHE, cfg, layout, lambda: _gemm_totals(cfg, layout, eff), "gemms", device, eff,
                      checkpointing=False)
    gemms = quantization = 0.0
    for symbol, entry in totals.items():
        repeat = 2 if symbol is not None and symbol in layout.checkpointed else 1
        gemms += repeat * entry["fprop"] + entry["rest"]
        quantization += repeat * entry["fprop_quant"] + entry["rest_quant"]
    return gemms, quantization


def _saved_by_symbol(cfg: ModelConfig, layout: RunLayout) -> Dict[str, float]:
    """Per block symbol: the activations its blocks save per token without tensor parallelism (summed)."""
    out: Dict[str, float] = {}
    for index, symbol in enumerate(cfg.pattern):
        out[symbol] = out.get(symbol, 0.0) + block_activation_bytes(cfg, layout, index, tp=1)
    return out


def _local_linear_weights(cfg: ModelConfig, layout: RunLayout) -> float:
    """Linear weights one TP rank casts each micro-batch: its shard of every block linear and of the LM head."""
    gemms = local_training_gemms(cfg, layout.seq_len, layout.seq_len, 1)
    blocks = sum(g.N * g.K for g in gemms if g.kind == "fprop" and g.layer is not None)
    return (blocks + cfg.vocab_size * cfg.hidden_size) / layout.tp


def weight_copy_bytes(cfg: ModelConfig, layout: RunLayout) -> float:
    """Bytes one rank moves per micro-batch copying weights and their gradients, outside the GEMMs.

    Without FSDP: CAST_BYTES_PER_WEIGHT per linear weight (autocast's compute copy of the FP32 weight, the
    gradient accumulated into FP32). Under FSDP2 the parameters arrive in the compute dtype c (cast on the
    shard before the gather) and the gradient leaves in it; what remains, per TP-local parameter (torch's
    _fsdp_collectives): each all-gather's copy out of the gathered buffer into the parameters (read and write
    c), each reduction's copy of the gradients into the reduce-scatter's input (read c, write the reduce
    dtype g), and, while grad_reduce=per_step accumulates, autograd adding each micro-batch's gradient into
    the held one (read c twice, write c); per micro-batch: gathers 2 (reshard=per_micro_batch: forward and
    backward; 1 for the units kept gathered between them and the embedding, as trainer.planning.collectives
    counts them) or 1/A, reductions 1 or 1/A, accumulations (A - 1)/A or 0."""
    if not layout.fsdp:
        return CAST_BYTES_PER_WEIGHT * _local_linear_weights(cfg, layout)
    A, c, g = layout.accumulation, layout.compute_bytes, layout.reduce_bytes
    parameters = local_parameters(cfg, layout.tp)
    codes = code_gathered_linears(cfg, layout)  # copied out as codes: 1/2 + 1/256 byte each

    def copied_bytes(elements: int, code_elements: int) -> float:
        return c * (elements - code_elements) + code_gathered_bytes(code_elements)

    copied = copied_bytes(parameters, sum(codes.values()))
    if layout.reshard == "per_micro_batch":
        units = unit_sizes(cfg, layout.tp, layout.shard)
        once = sum(copied_bytes(u.local_numel, sum(n for name, n in codes.items() if name.startswith(u.name + ".")))
                   for u in units if u.name in (EMBEDDINGS, units[-2].name, HEAD))
        gathered = 2.0 * copied - once
    else:
        gathered = copied / A
    per_step_reduce = layout.grad_reduce == "per_step"
    reductions = 1 / A if per_step_reduce else 1.0
    accumulations = (A - 1) / A if per_step_reduce else 0.0
    return gathered * 2 + (reductions * (c + g) + accumulations * 3 * c) * parameters


def _joined_pieces_bytes(cfg: ModelConfig, layout: RunLayout) -> float:
    """Bytes copied joining a scattering linear's per-sequence outputs into the rank's [B, t, h] (read and
    written once, again in a recomputing block's forward)."""
    if layout.micro_batch == 1:
        return 0.0
    forwards = sum(2 if recomputes(cfg, layout, name) else 1
                   for name in quantized_output_scatters(cfg, layout))
    return forwards * 2 * layout.compute_bytes * layout.tokens_per_micro_batch / layout.tp * cfg.hidden_size


def _compute_micro_batch_parts(cfg: ModelConfig, layout: RunLayout, eff: Efficiency) -> Dict[str, float]:
    tokens, seq, tp = layout.tokens_per_micro_batch, layout.seq_len, layout.tp
    bandwidth, peak = layout.gpu.hbm_bytes_per_s, layout.gpu.peak_flops["bf16"]
    recomputes = layout.checkpointed
    parts = dict.fromkeys(("GEMMs", "quantization", "attention", "SSD scan", "elementwise", "loss"), 0.0)
    parts["GEMMs"], parts["quantization"] = _gemm_parts(cfg, layout, eff)

    flops = flops_breakdown(cfg, seq)
    attention_share = 1 + (1 / 3 if "*" in recomputes else 0)  # a recomputing block repeats the forward third
    imbalance = (2 * layout.cp - 1) / layout.cp  # the last context-parallel piece's share of the causal work
    parts["attention"] = imbalance * attention_share * tokens * flops["attention"] / (peak * eff.attention) / tp
    mamba_layers = cfg.pattern.count("M")
    ssd_share = 1 + (1 / 3 if "M" in recomputes else 0)
    parts["SSD scan"] = ssd_share * tokens * (flops["ssd_scan"] / (peak * eff.ssd)
                                              + mamba_layers * SSD_BYTES_PER_TOKEN_LAYER / bandwidth) / tp
    if layout.cp > 1:  # the state passing's matmuls, a recomputing block's forward third again
        state_flops = CP_STATE_FLOPS * cfg.mamba_inner_size * cfg.ssm_state_size * mamba_layers * tokens / tp
        parts["SSD scan"] += ssd_share * state_flops / (peak * eff.gemm)
        per_d = CP_STATE_BYTES[0] * layout.compute_bytes + CP_STATE_BYTES[1]
        state_bytes = per_d * cfg.mamba_inner_size * mamba_layers * tokens / tp
        parts["SSD scan"] += ssd_share * state_bytes / (bandwidth * eff.memory)

    # The elementwise work of one TP rank: 1/T of the unsplit model's (its saved activations as the proxy).
    by_symbol = memoized(_MICRO_CACHE, cfg, layout, lambda: _saved_by_symbol(cfg, layout), "saved",
                         checkpointing=False, micro_batch=False)
    saved = sum(total * (1 + (1 / 3 if symbol in recomputes else 0)) for symbol, total in by_symbol.items())
    saved += layout.residual_bytes * cfg.hidden_size + cfg.hidden_size * linear_saved_input_bytes(layout, "lm_head")
    elementwise_bytes = (ELEMENTWISE_PASSES * tokens * saved / tp
                         + (0.0 if layout.fsdp else weight_copy_bytes(cfg, layout))  # FSDP's: plan_step_time
                         + _joined_pieces_bytes(cfg, layout))
    parts["elementwise"] = elementwise_bytes / (bandwidth * eff.memory)
    parts["loss"] = tokens / tp * cfg.vocab_size * LOSS_BYTES_PER_LOGIT / (bandwidth * eff.memory)
    return parts


_MICRO_CACHE: dict = {}


def micro_batch_parts(cfg: ModelConfig, layout: RunLayout, eff: Efficiency = H200_CALIBRATED) -> Dict[str, float]:
    """Seconds of one micro-batch's forward and backward on one GPU, by part, before the idle share (cached:
    parallel=auto asks it for many layouts that share their micro-batch)."""
    gpu = layout.gpu
    device = (gpu.name, tuple(sorted(gpu.peak_flops.items())), gpu.hbm_bytes_per_s)
    return dict(memoized(_MICRO_CACHE, cfg, layout, lambda: _compute_micro_batch_parts(cfg, layout, eff), device, eff))


def exposed_tail(layout: RunLayout, collectives: Sequence[Collective], eff: Efficiency,
                 block_seconds: float = 0.0) -> Tuple[float, float]:
    """Seconds of FSDP/HSDP calls nothing can hide (module docstring), (in a forward that gathers, in a backward
    that reduces); ``block_seconds``: one block's share of a micro-batch's compute, forward and backward."""
    first_block = "layers.0"
    ends = [c for c in collectives if c.overlapped and c.unit in (EMBEDDINGS, first_block, HEAD)]

    def seconds(unit: str, op: str) -> float:
        return sum(call_seconds(c, layout, eff.network) for c in ends if c.unit == unit and c.op == op)

    forward, backward = FORWARD_SHARE * block_seconds, (1 - FORWARD_SHARE) * block_seconds
    start = seconds(EMBEDDINGS, "all_gather") + seconds(first_block, "all_gather")
    end = seconds(EMBEDDINGS, "reduce_scatter") + seconds(EMBEDDINGS, "all_reduce")
    head_gather = max(0.0, seconds(HEAD, "all_gather") - 2 * forward)
    head_reduction = max(0.0, seconds(HEAD, "reduce_scatter") + seconds(HEAD, "all_reduce") - backward)
    return start + head_gather, end + head_reduction


def exposed_fsdp_seconds(layout: RunLayout, collectives: Sequence[Collective], eff: Efficiency,
                         forward: float, backward: float, block_seconds: float) -> float:
    """Seconds a step waits for FSDP/HSDP traffic, phase by phase (module docstring): ``forward`` and ``backward``
    the compute (and TP/CP waiting) of one micro-batch's forward and backward."""
    A = layout.accumulation
    gathering = A if layout.reshard == "per_micro_batch" else 1  # forwards that gather
    reducing = A if layout.grad_reduce == "per_micro_batch" else 1  # backwards that reduce
    gathered = regathered = reduced = 0.0
    for c in collectives:
        if not c.overlapped:
            continue
        seconds = call_seconds(c, layout, eff.network)
        if c.op == ALL_GATHER:  # the forwards' gathers first, the rest again in backward
            gathered += seconds * gathering
            regathered += seconds * (c.calls_per_step - gathering)
        else:
            reduced += seconds * c.calls_per_step
    tail_forward, tail_backward = exposed_tail(layout, collectives, eff, block_seconds)
    waits = gathering * max(tail_forward, gathered / gathering - forward)
    regather = regathered / A  # each backward's
    if reducing == A:
        waits += A * max(tail_backward, regather + reduced / A - backward)
    else:
        waits += (A - 1) * max(0.0, regather - backward) + max(tail_backward, regather + reduced - backward)
    return waits


def plan_step_time(cfg: ModelConfig, layout: RunLayout, eff: Efficiency = H200_CALIBRATED) -> StepTime:
    """Seconds of one optimizer step on one GPU (module docstring: the terms and their shares)."""
    micro = micro_batch_parts(cfg, layout, eff)
    if layout.fsdp:  # its copies depend on the policies and the accumulation, not in micro_batch_parts' cache key
        micro["elementwise"] += weight_copy_bytes(cfg, layout) / (layout.gpu.hbm_bytes_per_s * eff.memory)
    idle_share = eff.graphed_idle if layout.cuda_graph else eff.idle
    parts = {name: seconds * layout.accumulation for name, seconds in micro.items()}
    parts["idle between kernels"] = sum(micro.values()) * idle_share * layout.accumulation
    local = local_parameters(cfg, layout.tp) / layout.shard
    parts["optimizer"] = local * OPTIMIZER_BYTES_PER_PARAMETER / (layout.gpu.hbm_bytes_per_s * eff.memory)
    compute = sum(parts.values())

    collectives = tuple(step_collectives(cfg, layout))
    kinds = seconds_by_kind(list(collectives), layout, eff.network)
    gpu = layout.gpu
    links = (gpu.name, tuple(sorted(gpu.peak_flops.items())), gpu.hbm_bytes_per_s, gpu.nvlink_bytes_per_s,
             gpu.network_bytes_per_s, layout.gpus_per_node)
    hidden = layout.accumulation * memoized(_MICRO_CACHE, cfg, layout, lambda: hidden_tp_seconds(cfg, layout, eff),
                                            "hidden tp", eff, links)
    waited = kinds["tensor parallel"] - hidden + kinds["context parallel"] + kinds["scalars"]
    per_micro = sum(micro.values()) * (1 + idle_share)
    block = per_micro / len(cfg.pattern)
    exposed_dp = 0.0
    if kinds["overlapped"]:
        phase = per_micro + waited / layout.accumulation  # one micro-batch's compute and TP/CP waiting
        # Recomputed blocks run their forward again inside the backward: the forward phase is the share of
        # the micro-batch without that repeat (a block's share of the compute taken as equal).
        recomputed = sum(symbol in layout.checkpointed for symbol in cfg.pattern) / len(cfg.pattern)
        forward = FORWARD_SHARE * phase / (1 + FORWARD_SHARE * recomputed)
        exposed_dp = exposed_fsdp_seconds(layout, collectives, eff, forward, phase - forward, block)
    parts["tensor-parallel communication"] = kinds["tensor parallel"] - hidden
    if layout.cp > 1:
        parts["context-parallel communication"] = kinds["context parallel"]
    parts["scalar collectives"] = kinds["scalars"]
    parts["communication (exposed)"] = exposed_dp
    return StepTime(parts=parts, compute=compute, communication=sum(kinds.values()),
                    exposed_communication=waited + exposed_dp, collectives=collectives, hidden_tensor_parallel=hidden)
