"""Per-GPU memory of a training step, by part, from the layout alone (no tensor is allocated).

State (P parameters, S the FSDP shard group, 1 without FSDP):

    master weights        4 P / S     FP32, the optimizer's copy
    gradients             4 P / S     FP32 (FSDP2 reduce-scatters into the sharded FP32 gradient)
    optimizer states      8 P / S     AdamW exp_avg and exp_avg_sq, FP32
    accumulated grads     R P         FSDP2 with gradient accumulation: micro-batches before the last
                                      skip the reduce-scatter and keep the unsharded gradient in the
                                      reduce dtype (R bytes; torch's FSDPParam.to_accumulated_grad_if_needed)

Compute weights (held between a linear's forward and its backward):
    without FSDP          autocast's BF16 copy of each BF16 linear's weight (saved for Dgrad); a quantized
                          linear saves its quantized weight when Dgrad reuses it (NVFP4 2D tiles: the
                          emulation keeps the values in BF16, a native GEMM its 4-bit codes; FP8 128x128
                          tiles: W^T in FP8); nothing for blocks that recompute their activations
    with FSDP             the root module's parameters (embedding, LM head, final norm: FSDP2 keeps the
                          root unsharded for the step) and two blocks in flight (the one computing, the
                          one prefetched), in the compute dtype, plus quantized weights saved as above

Activations, per token of a micro-batch (c compute bytes, r residual bytes; h hidden, F ffn, d Mamba
inner width, G groups, N state, H heads, Hq/Hkv attention heads of width a, V vocabulary):

    every block           r h (the residual, saved by the pre-norm) + 4 (its rstd) + each linear's saved
                          input (in_features x the bytes its format saves: c for BF16 and the emulation,
                          the quantized X^T for native GEMMs; q, k and v share one input)
    MLP                   + c F (the ReLU's output, which the square also saves)
    attention             + c (2 Hq a + 2 Hkv a) (q, k, v and SDPA's output) + 4 Hq (log-sum-exp)
    Mamba-2               + c ((2d + 2GN + H) + 2 (d + 2GN) + d) (in_proj's output, the conv's input and
                          output, the SSD's output) + 4 (2H + G) (dt, cumulative dA, the gated norm's rstd)
    a recomputing block   only r h (its input); its full set again while its backward runs
    LM head and loss      r h + 4 + the LM head's saved input, then at the loss's backward: the logits
                          (c V), log-softmax's FP32 output (4 V) and its two FP32 gradients (8 V); the
                          logits' FP32 copy that log-softmax reads is not saved (with FP32 compute it is
                          the logits themselves)

The peak is the larger of two moments: the loss's backward (all activations, the logits at their
largest, gradients only from earlier micro-batches) and a block's backward (the activations, one
recomputing block's full set, all gradients: an upper bound, since backward frees activations as
it creates gradients). Communication buffers: the reduce-scatter's unsharded gradient of the largest
block in the reduce dtype. Not counted: the CUDA context and allocator fragmentation (the preflight
keeps a margin for them), torch.compile's and cuBLAS's workspaces, the data loader.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict

from models.config import ModelConfig
from models.flops import count_parameters
from models.gemms import block_linears
from trainer.planning.gemm_costs import FORMAT_COSTS
from trainer.planning.layout import RunLayout

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
    if fmt == "bf16" or layout.backend == "emulated":
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
    """Per-token bytes a mixer saves besides its linears' inputs."""
    if symbol == "-":
        return c * cfg.ffn_hidden_size
    if symbol == "*":
        a = cfg.attention_head_dim
        return c * (2 * cfg.num_attention_heads * a + 2 * cfg.num_key_value_heads * a) + 4 * cfg.num_attention_heads
    d, gn, heads = cfg.mamba_inner_size, cfg.mamba_num_groups * cfg.ssm_state_size, cfg.mamba_num_heads
    return c * ((2 * d + 2 * gn + heads) + 2 * (d + gn * 2) + d) + 4 * (2 * heads + cfg.mamba_num_groups)


def block_activation_bytes(cfg: ModelConfig, layout: RunLayout, index: int) -> float:
    """Per-token bytes block ``index`` saves for backward when it does not recompute."""
    symbol = cfg.pattern[index]
    total = layout.residual_bytes * cfg.hidden_size + 4 + mixer_internal_bytes(cfg, symbol, layout.compute_bytes)
    seen_inputs = set()
    for module, _, in_features, _ in block_linears(cfg, symbol):
        shares_input = module in ("q_proj", "k_proj", "v_proj")
        if shares_input and "qkv" in seen_inputs:
            continue
        seen_inputs.add("qkv" if shares_input else module)
        total += in_features * linear_saved_input_bytes(layout, f"layers.{index}.mixer.{module}")
    return total


def block_parameters(cfg: ModelConfig, symbol: str) -> int:
    """Parameters of one block: its norm and mixer."""
    linears = sum(i * o for _, _, i, o in block_linears(cfg, symbol))
    if symbol != "M":
        return cfg.hidden_size + linears
    d, gn = cfg.mamba_inner_size, cfg.mamba_num_groups * cfg.ssm_state_size
    return cfg.hidden_size + linears + (d + 2 * gn) * (cfg.conv_kernel + 1) + 3 * cfg.mamba_num_heads + d


def plan_memory(cfg: ModelConfig, layout: RunLayout) -> MemoryPlan:
    """Bytes per GPU by part at the step's peak (module docstring: what each part is)."""
    params = count_parameters(cfg)
    shard = layout.shard
    tokens = layout.tokens_per_micro_batch
    c, r, V, h = layout.compute_bytes, layout.residual_bytes, cfg.vocab_size, cfg.hidden_size
    blocks = range(cfg.num_blocks)

    state = {
        "master weights (fp32)": 4 * params / shard,
        "gradients (fp32)": 4 * params / shard,
        "optimizer states (AdamW, fp32)": 8 * params / shard,
    }
    accumulated = layout.reduce_bytes * params if layout.fsdp and layout.accumulation > 1 else 0.0

    saved_weights = 0.0
    for index in blocks:
        if cfg.pattern[index] in layout.checkpointed:
            continue
        for module, _, in_features, out_features in block_linears(cfg, cfg.pattern[index]):
            saved_weights += linear_saved_weight_bytes(layout, f"layers.{index}.mixer.{module}",
                                                       in_features * out_features)
    saved_weights += linear_saved_weight_bytes(layout, "lm_head", V * h)
    gathered = 0.0
    if layout.fsdp:
        root = 2 * V * h + h  # embedding, LM head, final norm
        gathered = c * (root + 2 * max(block_parameters(cfg, s) for s in set(cfg.pattern)))

    full = [block_activation_bytes(cfg, layout, index) for index in blocks]
    kept = sum(r * h + 4 if cfg.pattern[i] in layout.checkpointed else full[i] for i in blocks)
    recomputed = max((full[i] for i in blocks if cfg.pattern[i] in layout.checkpointed), default=0.0)
    head = r * h + 4 + h * linear_saved_input_bytes(layout, "lm_head")
    logits = c * V + 4 * V + 8 * V  # the logits, log-softmax's FP32 output, its two FP32 gradients

    buffers = 0.0
    if layout.gpus > 1:
        buffers = layout.reduce_bytes * max(block_parameters(cfg, s) for s in set(cfg.pattern))

    # Gradients present at the loss's backward: those of earlier micro-batches only.
    earlier_grads = state["gradients (fp32)"] if layout.accumulation > 1 and not layout.fsdp else 0.0
    common = sum(state.values()) - state["gradients (fp32)"] + accumulated + saved_weights + gathered + buffers
    at_loss = common + earlier_grads + tokens * (kept + head + logits)
    at_block = common + state["gradients (fp32)"] + tokens * (kept + recomputed)

    loss_is_peak = at_loss >= at_block
    parts = dict(state)
    parts["gradients (fp32)"] = earlier_grads if loss_is_peak else state["gradients (fp32)"]
    parts["accumulated gradients (unsharded)"] = accumulated
    parts["compute and quantized weight copies"] = saved_weights + gathered
    parts["activations"] = tokens * (kept + (head if loss_is_peak else recomputed))
    parts["logits and loss"] = tokens * logits if loss_is_peak else 0.0
    parts["communication buffers"] = buffers
    return MemoryPlan(parts=parts, at_loss_backward=at_loss, at_block_backward=at_block)
