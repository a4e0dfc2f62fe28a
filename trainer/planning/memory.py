"""Per-GPU memory of a training step, by part, from the layout alone (no tensor is allocated).

State (P_T the parameters one tensor-parallel rank holds: the TP-split ones / T plus the replicated ones,
trainer.planning.parameters; S the FSDP shard group, 1 without FSDP):

    master weights        4 P_T / S   FP32, the optimizer's copy
    gradients             4 P_T / S   FP32 (FSDP2 reduce-scatters into the sharded FP32 gradient)
    optimizer states      8 P_T / S   AdamW exp_avg and exp_avg_sq, FP32
    accumulated grads     R P_T       FSDP2 with gradient accumulation and parallel.grad_reduce=per_step:
                                      micro-batches before the last skip the reduce-scatter and keep the
                                      unsharded gradient in the reduce dtype (R bytes; torch's
                                      FSDPParam.to_accumulated_grad_if_needed); none with per_micro_batch
                                      (each micro-batch reduce-scatters into the sharded gradient)

Compute weights (held between a linear's forward and its backward):
    without FSDP          autocast's BF16 copy of each BF16 linear's weight (saved for Dgrad); a quantized
                          linear saves its quantized weight when Dgrad reuses it (NVFP4 2D tiles: the
                          emulation keeps the values in BF16, a native GEMM its 4-bit codes; FP8 128x128
                          tiles: W^T in FP8); nothing for blocks that recompute their activations
    with FSDP             parallel.reshard=per_micro_batch: the head's parameters (LM head, final norm:
                          kept unsharded from forward to backward; the embedding is freed after its forward,
                          its backward needs no parameters) and two
                          blocks in flight (the one computing, the one prefetched); per_step: every unit's
                          parameters, gathered once and kept all step (c P_T); in the compute dtype c, plus
                          quantized weights saved as above (a TP rank's shard of each block linear)

Activations, per token of a micro-batch (c compute bytes, r residual bytes; h hidden, F ffn, d Mamba
inner width, G groups, N state, H heads, Hq/Hkv attention heads of width a, V vocabulary; T the
tensor-parallel degree: the residual, norms, LM head and loss hold t/T tokens (sequence parallelism), the
mixers 1/T of their width, a column-parallel linear the whole all-gathered input):

    every block           (r h + 4) / T (the residual saved by the pre-norm, its rstd) + each linear's
                          saved input (column-parallel: in_features, row-parallel: in_features / T, x the
                          bytes its format saves: c for BF16 and the emulation, the quantized X^T for
                          native GEMMs; q, k and v share one input)
    MLP                   + c F / T (the ReLU's output, which the square also saves)
    attention             + (c (2 Hq a + 2 Hkv a) + 4 Hq) / T (q, k, v, SDPA's output, the log-sum-exp)
    Mamba-2               + (c ((2d + 2GN + H) + 2 (d + 2GN) + d) + 4 (2H + G)) / T (in_proj's output, the
                          conv's input and output, the SSD's output; dt, cumulative dA, the gated norm's rstd)
    a recomputing block   only (r h + 4) / T (its input); its full set again while its backward runs
    LM head and loss      (r h + 4) / T + the LM head's saved input (whole: column-parallel over the
                          vocabulary, its input all-gathered), then at the loss's backward: the logits
                          (c V), log-softmax's FP32 output (4 V) and its two FP32 gradients (8 V), / T; the
                          logits' FP32 copy that log-softmax reads is not saved (with FP32 compute it is
                          the logits themselves)

Per token means per token of the rank's piece under context parallelism (micro_batch x seq_len / cp of
them); each attention layer also keeps the K and V it gathered from the other pieces ((cp - 1)/cp of the
sequence's), each Mamba layer the SSD state entering its piece (``context_parallel_bytes``).

The peak is the larger of two moments: the loss's backward (all activations, the logits at their
largest, gradients only from earlier micro-batches) and a block's backward (the activations, one
recomputing block's full set, all gradients: an upper bound, since backward frees activations as
it creates gradients). Communication buffers: the reduce-scatter's unsharded gradient of the largest
FSDP unit (a block, or the head: the LM head's rows / tp) in the reduce dtype. Not counted: the CUDA context and allocator fragmentation (the preflight
keeps a margin for them), torch.compile's and cuBLAS's workspaces, the data loader, FSDP2's padding,
the TP all-gather's output buffer beyond what the linears save.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict

from models.config import ModelConfig
from models.gemms import block_linears
from trainer.planning.gemm_costs import FORMAT_COSTS
from trainer.planning.layout import (RunLayout, code_gathered_bytes, code_gathered_linears, memoized,
                                     quantized_input_gathers)
from trainer.planning.parameters import COLUMN_PARALLEL, head_local, largest_block_local, local_parameters

GIB = 2**30


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes per GPU at the step's peak, by part (``parts``), and the two moments it is the larger of."""

    parts: Dict[str, float]
    """Part -> bytes at the peak moment."""
    at_loss_backward: float
    at_block_backward: float

    @property
    def peak(self) -> float:
        return max(self.at_loss_backward, self.at_block_backward)

    def gib(self) -> Dict[str, float]:
        return {name: value / GIB for name, value in self.parts.items()}


def linear_saved_input_bytes(layout: RunLayout, name: str) -> float:
    """Bytes per input element a linear saves for its Wgrad."""
    fmt = layout.linear_format(name)
    if fmt == "bf16" or layout.backend == "emulated" or not layout.saves_quantized_input:
        return layout.compute_bytes
    cost = FORMAT_COSTS[fmt]  # the quantized X^T: elements and block scales (the one tensor scale is negligible)
    return cost.element_bytes + (cost.vector_scale_bytes / cost.vector_block if cost.vector_scale_bytes else 0.0)


def linear_saved_weight_bytes(layout: RunLayout, name: str, elements: int) -> float:
    """Bytes a linear holds from its forward to its Dgrad besides the parameter itself (see the docstring)."""
    fmt = layout.linear_format(name)
    if fmt == "bf16":
        # autocast's copy; FSDP2 gathers the parameter in the compute dtype itself, FP32 compute uses it as is
        return 0.0 if layout.fsdp or layout.compute_bytes == 4 else layout.compute_bytes * elements
    cost = FORMAT_COSTS[fmt]
    reused = layout.gemm_formats[name].get("dgrad") == fmt and cost.weight_transpose_invariant
    if not reused:
        return 0.0  # Dgrad quantizes W^T again from the master weight
    return layout.compute_bytes * elements if layout.backend == "emulated" else cost.weight_bytes(elements)


def mixer_internal_bytes(cfg: ModelConfig, symbol: str, c: int) -> float:
    """Per-token bytes a mixer saves besides its linears' inputs (without tensor parallelism)."""
    if symbol == "-":
        return c * cfg.ffn_hidden_size
    if symbol == "*":
        a = cfg.attention_head_dim
        return c * (2 * cfg.num_attention_heads * a + 2 * cfg.num_key_value_heads * a) + 4 * cfg.num_attention_heads
    d, gn, heads = cfg.mamba_inner_size, cfg.mamba_num_groups * cfg.ssm_state_size, cfg.mamba_num_heads
    return c * ((2 * d + 2 * gn + heads) + 2 * (d + gn * 2) + d) + 4 * (2 * heads + cfg.mamba_num_groups)


def kept_input_bytes(cfg: ModelConfig, layout: RunLayout) -> float:
    """Per-token bytes a recomputing block keeps: its input and the pre-norm's rstd, on t/T tokens."""
    return (layout.residual_bytes * cfg.hidden_size + 4) / layout.tp


def block_activation_bytes(cfg: ModelConfig, layout: RunLayout, index: int, tp: int = 0) -> float:
    """Per-token bytes block ``index`` saves for backward when it does not recompute, on one of ``tp``
    tensor-parallel ranks (default: the layout's)."""
    tp = tp or layout.tp
    symbol = cfg.pattern[index]
    total = (layout.residual_bytes * cfg.hidden_size + 4 + mixer_internal_bytes(cfg, symbol, layout.compute_bytes)) / tp
    seen_inputs = set()
    gathering = quantized_input_gathers(cfg, layout)  # these save their rank's tokens of X
    for module, _, in_features, _ in block_linears(cfg, symbol):
        shares_input = module in ("q_proj", "k_proj", "v_proj")
        if shares_input and "qkv" in seen_inputs:
            continue
        seen_inputs.add("qkv" if shares_input else module)
        name = f"layers.{index}.mixer.{module}"
        width = in_features if module in COLUMN_PARALLEL and name not in gathering else in_features / tp
        total += width * linear_saved_input_bytes(layout, name)
    return total


def head_activation_bytes(cfg: ModelConfig, layout: RunLayout) -> float:
    """Per-token bytes the final norm (on t/T tokens) and the LM head (its whole gathered input under tp, as
    a column-parallel linear's) save."""
    h = cfg.hidden_size
    return (layout.residual_bytes * h + 4) / layout.tp + h * linear_saved_input_bytes(layout, "lm_head")


def logits_bytes(cfg: ModelConfig, layout: RunLayout) -> float:
    """Per-token bytes at the loss's backward: the logits, log-softmax's FP32 output, its two FP32 gradients."""
    return (layout.compute_bytes + 4 + 8) * cfg.vocab_size / layout.tp


_CACHE: dict = {}


def saved_weight_bytes(cfg: ModelConfig, layout: RunLayout) -> float:
    """Weight copies held from a linear's forward to its Dgrad (a TP rank's shard of each block linear)."""
    return memoized(_CACHE, cfg, layout, lambda: _saved_weight_bytes(cfg, layout), "weights", micro_batch=False)


def _saved_weight_bytes(cfg: ModelConfig, layout: RunLayout) -> float:
    total = 0.0
    for index, symbol in enumerate(cfg.pattern):
        if symbol in layout.checkpointed:
            continue
        for module, _, in_features, out_features in block_linears(cfg, symbol):
            total += linear_saved_weight_bytes(layout, f"layers.{index}.mixer.{module}",
                                               in_features * out_features // layout.tp)
    return total + linear_saved_weight_bytes(layout, "lm_head", cfg.vocab_size * cfg.hidden_size // layout.tp)


def gathered_parameter_bytes(cfg: ModelConfig, layout: RunLayout) -> float:
    """FSDP2's unsharded compute copies held at the peak (module docstring)."""
    if not layout.fsdp:
        return 0.0
    if layout.reshard == "per_step":  # every unit held: NVFP4 weights gathered as codes hold their codes
        codes = sum(code_gathered_linears(cfg, layout).values())
        return layout.compute_bytes * (local_parameters(cfg, layout.tp) - codes) + code_gathered_bytes(codes)
    return layout.compute_bytes * (head_local(cfg, layout.tp) + 2 * largest_block_local(cfg, layout.tp))


def activation_bytes_per_token(cfg: ModelConfig, layout: RunLayout) -> tuple[float, float]:
    """(bytes every block keeps per token, the largest recomputing block's full set per token)."""
    return memoized(_CACHE, cfg, layout, lambda: _activation_bytes_per_token(cfg, layout), "activations",
                    micro_batch=False)


def _activation_bytes_per_token(cfg: ModelConfig, layout: RunLayout) -> tuple[float, float]:
    kept_input = kept_input_bytes(cfg, layout)
    kept, recomputed = 0.0, 0.0
    for index, symbol in enumerate(cfg.pattern):  # per block: the recipe's formats differ between blocks
        if symbol in layout.checkpointed:
            kept += kept_input
            recomputed = max(recomputed, block_activation_bytes(cfg, layout, index))
        else:
            kept += block_activation_bytes(cfg, layout, index)
    return kept, recomputed


def context_parallel_bytes(cfg: ModelConfig, layout: RunLayout) -> tuple[float, float]:
    """Under context parallelism, (kept, recomputing): what the mixers save for backward beyond their per-token
    activations (models/context_parallel.py), for the blocks that keep their activations, and for the one
    recomputing block whose backward runs: each attention layer the other pieces' K and V it gathered (every
    rank keeps the gathered buffer, (C - 1)/C of the sequence's); each Mamba layer the entering SSD state h
    (b H P N, compute dtype) and the fold's FP32 copy of the states before the previous piece's (the last
    piece's: C - 2 of them)."""
    if layout.cp == 1:
        return 0.0, 0.0
    others = layout.micro_batch * layout.seq_len * (layout.cp - 1) // layout.cp
    per_symbol = {
        "*": layout.compute_bytes * 2 * others * cfg.num_key_value_heads // layout.tp * cfg.attention_head_dim,
        "M": (layout.micro_batch * cfg.mamba_num_heads // layout.tp * cfg.mamba_head_dim * cfg.ssm_state_size
              * (layout.compute_bytes + 4 * max(layout.cp - 2, 0))),
        "-": 0}
    kept = sum(per_symbol[symbol] for symbol in cfg.pattern if symbol not in layout.checkpointed)
    recomputing = max((per_symbol[symbol] for symbol in set(cfg.pattern) if symbol in layout.checkpointed), default=0)
    return kept, recomputing


def plan_memory(cfg: ModelConfig, layout: RunLayout) -> MemoryPlan:
    """Bytes per GPU by part at the step's peak (module docstring: what each part is)."""
    params = local_parameters(cfg, layout.tp)
    shard = layout.shard
    tokens = layout.tokens_per_micro_batch

    state = {
        "master weights (fp32)": 4 * params / shard,
        "gradients (fp32)": 4 * params / shard,
        "optimizer states (AdamW, fp32)": 8 * params / shard,
    }
    accumulating = layout.accumulation > 1
    accumulated = (layout.reduce_bytes * params
                   if layout.fsdp and accumulating and layout.grad_reduce == "per_step" else 0.0)
    copies = saved_weight_bytes(cfg, layout) + gathered_parameter_bytes(cfg, layout)

    kept, recomputed = activation_bytes_per_token(cfg, layout)
    gathered_kv, recomputed_kv = context_parallel_bytes(cfg, layout)
    head, logits = head_activation_bytes(cfg, layout), logits_bytes(cfg, layout)
    largest_unit = max(largest_block_local(cfg, layout.tp), head_local(cfg, layout.tp) if layout.fsdp else 0)
    buffers = layout.reduce_bytes * largest_unit if layout.gpus > 1 else 0.0

    # Gradients present at the loss's backward: those of earlier micro-batches, where they are sharded already.
    earlier_grads = (state["gradients (fp32)"]
                     if accumulating and (not layout.fsdp or layout.grad_reduce == "per_micro_batch") else 0.0)
    common = sum(state.values()) - state["gradients (fp32)"] + accumulated + copies + buffers
    at_loss = common + earlier_grads + tokens * (kept + head + logits) + gathered_kv
    at_block = common + state["gradients (fp32)"] + tokens * (kept + recomputed) + gathered_kv + recomputed_kv

    loss_is_peak = at_loss >= at_block
    parts = dict(state)
    parts["gradients (fp32)"] = earlier_grads if loss_is_peak else state["gradients (fp32)"]
    parts["accumulated gradients (unsharded)"] = accumulated
    parts["compute and quantized weight copies"] = copies
    parts["activations"] = (tokens * (kept + (head if loss_is_peak else recomputed)) + gathered_kv
                            + (0.0 if loss_is_peak else recomputed_kv))
    parts["logits and loss"] = tokens * logits if loss_is_peak else 0.0
    parts["communication buffers"] = buffers
    return MemoryPlan(parts=parts, at_loss_backward=at_loss, at_block_backward=at_block)
