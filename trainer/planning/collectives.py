"""Every collective of one optimizer step, as a list, and the seconds each takes on its links.

``step_collectives(model, layout)`` lists what each rank issues in one step (the trainer issues it on
every rank of the group alike); the step-time model (trainer.planning.step_time) takes its communication
from this list and nothing else. A ``Collective`` names its op, the mesh dimension and group size it runs
over, its bytes per call and its calls per step, and what it is for. Bytes per call:

    all_gather       the unsharded (gathered) buffer: group size x each rank's input
    reduce_scatter   the unsharded input buffer: group size x each rank's output
    all_reduce       the tensor reduced

FSDP2 (parallel.fsdp; U units: the embedding, one per block, the head, trainer.planning.parameters), per unit, with
A micro-batches a step, S = dp_shard, R = dp_replicate, c the compute bytes (parallel.param_dtype) and
g the reduce bytes (parallel.reduce_dtype); buffers are the unit's TP-local parameters, each padded to a
multiple of S along dim 0, in one flat buffer (torch's _fsdp_collectives: foreach_all_gather,
foreach_reduce):

    all_gather over dp_shard      c x padded    reshard=per_micro_batch: 2A calls (each micro-batch's
                                                forward and backward), A for the last block and the head
                                                (kept gathered from forward to backward) and the embedding
                                                (its backward needs no parameters);
                                                reshard=per_step: 1 call (gathered once, kept all step)
    reduce_scatter over dp_shard  g x padded    grad_reduce=per_step: 1 call; per_micro_batch: A calls
    all_reduce over dp_replicate  g x padded/S  HSDP: as many as the reduce-scatters (the sharded gradient)

FSDP2 issues neither all-gather nor reduce-scatter on a shard group of one rank (it copies); the HSDP
all-reduce still runs. Tensor parallelism (parallel.tp = T > 1, sequence parallel; t tokens a micro-batch,
h hidden), per block and micro-batch, not overlapped with compute (but for the few that step_time's
``hidden_tp_seconds`` puts beside a GEMM):

    all_gather over tp      c t h    the mixer input along the sequence (unless its linear gathers it
                                     quantized, below): forward, backward (the reduce-scatter's gradient),
                                     and again in a recomputing block's forward
    reduce_scatter over tp  c t h    the mixer output: forward, backward (the all-gather's gradient); not
                                     in a recomputation (torch's non-reentrant checkpoint stops at the last
                                     saved tensor backward needs, before the output's reduce-scatter)
    reduce_scatter over tp  c t h    once a micro-batch, the vocabulary-parallel embedding's rows summed
                                     into the rank's tokens (forward); all_gather over tp, c t h: its
                                     gradient (backward)
    all_gather over tp      c t h    once a micro-batch, the LM head's input (forward; column-parallel
                                     over the vocabulary); reduce_scatter over tp, c t h: its gradient
    all_reduce over tp      4 t      three a micro-batch, the vocabulary-parallel loss: the logits' max,
                                     the sum of their exponentials, the target's logit (FP32 per token)
    all_gather over tp      t h (1/2 + 1/16)  where a mixer's one column-parallel linear (Mamba's in_proj, the
                                     MLP's up_proj) runs in NVFP4 on the torch layer, it gathers its input
                                     itself as packed codes and block scales in place of the mixer's BF16
                                     gather: X forward (again in a recomputing block), X^T for Wgrad in the
                                     backward (c t h: X, when Wgrad runs in the compute dtype); its dX
                                     reduce-scatter is the mixer input's above
    reduce_scatter over tp  c t h / B  a mixer's row-parallel linear in NVFP4 (Dgrad and Wgrad) on the torch
                                     layer reduce-scatters its output itself, in place of the mixer output's
                                     forward one above, one sequence of the micro-batch's B at a time (each
                                     moving while the next sequence's Fprop runs; inside its autograd
                                     function, so a recomputing block's scatters again)
    all_gather over tp      t h (1/2 + 1/16)  twice: the same linear gathers the output's gradient as dY's
                                     codes and scales, then dY^T's (moving while Dgrad runs), in place of the
                                     mixer's BF16 gather
    all_reduce over tp      4 bytes  each per-tensor amax of a quantized TP linear whose format has a tensor
                                     scale (NVFP4, per-tensor FP8): column-parallel W (Fprop), dY (Dgrad),
                                     dY^T (Wgrad); row-parallel and gathering ones W and X (Fprop), X^T
                                     (Wgrad); a recomputing block repeats its Fprop ones; a quantized LM
                                     head, column-parallel over the vocabulary, as a column-parallel linear.
                                     The torch NVFP4 layer reduces a phase's amaxes (Fprop's; Dgrad's and
                                     Wgrad's) in one all-reduce of 4 bytes each (models.quant.linear.phase_amaxes)
    all_reduce over tp      4 x n    once a step, the gradients of every parameter replicated over TP
                                     (block norms, final norm) in one flat FP32
                                     buffer of their FSDP-sharded local tensors (n = sum of padded / S;
                                     trainer.tensor_parallel.reduce_tp_replicated_grads)

Context parallelism (parallel.cp = C > 1; models/context_parallel.py), per micro-batch, not overlapped, B
sequences of L tokens, each rank's heads and channels (1/T of them under TP):

    all_gather over cp   c C B (K-1) ch        each Mamba layer: the last K-1 tokens of the conv's input
                                               (ch its channels, d + 2 G N), forward (again in a
                                               recomputing block); reduce_scatter of the same: backward
    all_gather over cp   4 C B H (P N + 1)     each Mamba layer: the piece's SSD end state and log decay
                                               (FP32), forward (again when recomputing); reduce_scatter: backward
    all_gather over cp   c 2 B Hkv L hd        each attention layer: K and V of every piece, forward (again
                                               when recomputing); reduce_scatter: backward

Scalars, once a step, marked ``scalar`` (latency only): the loss's mean over the world (4 bytes,
trainer.distributed.all_reduce_mean), the gradient norm's reduction: torch's clip_grad_norm_ stacks one
partial norm per parameter tensor and the DTensor's full_tensor all-reduces them over each mesh dimension
that splits the gradients, dp_shard and tp (4 bytes x parameter tensors each; counted on gloo), the
preemption flag's MAX over the world (8 bytes,
trainer.guards.PreemptionFlag); with NVFP4 weights gathered as codes (parallel.gather_nvfp4_weights), before
each micro-batch's forward, the MAX over the world of those weights' amaxes (4 bytes each,
trainer.nvfp4_weight_gather), whose all-gathers then move 1/2 + 1/256 byte an element of those weights (codes
and 16x16 block scales, one uint8 buffer with the unit's other parameters) and whose linears reduce no W amax
over tp. Evaluation and checkpoint collectives are not per step and not listed.

Seconds of one call (``call_seconds``), an alpha-beta model of NCCL's ring (all-gather, reduce-scatter)
and tree (all-reduce) algorithms on a group of n ranks spanning k nodes (m of its ranks in a node):

    bandwidth  B = NVLink per GPU if k = 1, else min(NVLink, m x the network (InfiniBand) per GPU): NCCL runs
               one ring (channel) per NIC, each crossing every node boundary once, so the m ranks of a node
               move the data over m NICs at once (rail-optimised nodes; m = 1 is one NIC); x Efficiency.network
    transfer   (n - 1)/n x bytes / B for a ring, twice that for a tree
    ring       transfer + BASE_LATENCY + (n - k) x HOP[nvlink] + (k if k > 1) x HOP[network]
    tree       transfer + BASE_LATENCY + 2 (ceil(log2 m) x HOP[nvlink] + ceil(log2 k) x HOP[network])

A group of one rank costs nothing. The link of a group follows from the mesh order (dp_replicate, dp_shard,
cp, tp; tp innermost): a cp group strides over T ranks, a dp_shard group (FSDP's dp_shard x cp) spans S x T
consecutive ranks, a dp_replicate group strides over them.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Dict, List, Tuple

from models.config import ModelConfig
from models.gemms import block_linears
from trainer.planning.gemm_costs import FORMAT_COSTS
from trainer.planning.layout import (RunLayout, code_gathered_bytes, code_gathered_linears, memoized,
                                     quantized_input_gathers, quantized_output_scatters, recomputes)
from trainer.planning.parameters import COLUMN_PARALLEL, EMBEDDINGS, HEAD, UnitSize, fsdp_units, unit_sizes

ALL_GATHER, REDUCE_SCATTER, ALL_REDUCE = "all_gather", "reduce_scatter", "all_reduce"
DP_SHARD, DP_REPLICATE, TP, CP, WORLD = "dp_shard", "dp_replicate", "tp", "cp", "world"
DTYPE_NAMES = {2: "bfloat16", 4: "float32"}

BASE_LATENCY_S = 5e-6
"""Per call: NCCL's launch and synchronisation. With HOP_LATENCY_S, a small all-reduce inside one 8-GPU node
comes to ~11 us, the ~10 us floor reported for in-node NCCL calls on HGX H100 (Scale Atlas, "Tree-reduce
latency"; Hu et al., "Demystifying NCCL", arXiv 2507.04786, for the protocols' per-hop costs)."""
HOP_LATENCY_S = {"nvlink": 1e-6, "network": 5e-6}
"""Per step of a ring or level of a tree: NVLink ~1 us; InfiniBand NDR 2-5 us per switch hop (the same
sources), taken at its upper end for the network's switches and NCCL's proxy."""


@dataclass(frozen=True, slots=True)
class Collective:
    """One kind of call a rank issues in a step (module docstring: what bytes_per_call counts)."""

    op: str
    """'all_gather', 'reduce_scatter' or 'all_reduce'."""
    mesh_dim: str
    """'dp_shard', 'dp_replicate', 'cp', 'tp' or 'world'."""
    group_size: int
    bytes_per_call: int
    calls_per_step: int
    dtype: str
    purpose: str
    unit: str = ""
    """The FSDP unit ('embeddings', 'layers.3', 'head') or parameter it serves; '' for activations and scalars."""
    scalar: bool = False
    """A tiny latency-bound collective (loss, gradient norm, a flag)."""
    overlapped: bool = False
    """Whether the step-time model hides it behind compute (FSDP2's prefetching streams)."""

    @property
    def bytes_per_step(self) -> int:
        return self.bytes_per_call * self.calls_per_step

    def as_dict(self) -> dict:
        return {"op": self.op, "mesh_dim": self.mesh_dim, "group_size": self.group_size,
                "bytes_per_call": self.bytes_per_call, "calls_per_step": self.calls_per_step, "dtype": self.dtype,
                "purpose": self.purpose, "unit": self.unit, "scalar": self.scalar, "overlapped": self.overlapped}


def _fsdp_unit_collectives(layout: RunLayout, unit: UnitSize, kept: bool, codes: int = 0) -> List[Collective]:
    """``kept``: the unit stays gathered from its forward to its backward, or its backward needs no parameters
    (the embedding's: trainer.distributed.apply_fsdp), so reshard=per_micro_batch gathers it once a micro-batch;
    ``codes``: the unit's weight elements gathered as NVFP4 codes (the rest in the compute dtype, one uint8
    buffer)."""
    S, R, A = layout.shard, layout.replicate, layout.accumulation
    padded = unit.padded_numel
    gathers = 1 if layout.reshard == "per_step" else A * (1 if kept else 2)
    reductions = 1 if layout.grad_reduce == "per_step" else A
    compute, reduce = DTYPE_NAMES.get(layout.compute_bytes, "float16"), layout.reduce_dtype
    gathered = layout.compute_bytes * (padded - codes) + code_gathered_bytes(codes)
    out = []
    if S > 1:
        out.append(Collective(ALL_GATHER, DP_SHARD, S, gathered, gathers, "uint8" if codes else compute,
                              f"FSDP parameters of {unit.name} ({layout.reshard}"
                              f"{', NVFP4 weights as codes' if codes else ''})", unit.name, overlapped=True))
        out.append(Collective(REDUCE_SCATTER, DP_SHARD, S, layout.reduce_bytes * padded, reductions, reduce,
                              f"FSDP gradients of {unit.name} ({layout.grad_reduce})", unit.name, overlapped=True))
    if R > 1:
        out.append(Collective(ALL_REDUCE, DP_REPLICATE, R, layout.reduce_bytes * padded // S, reductions, reduce,
                              f"HSDP sharded gradients of {unit.name}", unit.name, overlapped=True))
    return out


_FSDP_CACHE: Dict[tuple, Tuple[Collective, ...]] = {}


def fsdp_collectives(model: ModelConfig, layout: RunLayout) -> List[Collective]:
    """FSDP2's all-gathers, reduce-scatters and HSDP all-reduces, unit by unit (cached per mesh and policy)."""
    if not layout.fsdp:
        return []
    key = (repr(model), layout.tp, layout.shard, layout.replicate, layout.accumulation, layout.reshard,
           layout.grad_reduce, layout.compute_bytes, layout.reduce_bytes, layout.reduce_dtype,
           tuple(sorted(code_gathered_linears(model, layout).items())))
    if key not in _FSDP_CACHE:
        _FSDP_CACHE[key] = tuple(_fsdp_collectives(model, layout))
    return list(_FSDP_CACHE[key])


def _fsdp_collectives(model: ModelConfig, layout: RunLayout) -> List[Collective]:
    units = unit_sizes(model, layout.tp, layout.shard)
    last_block = units[-2].name
    codes = code_gathered_linears(model, layout)
    out: List[Collective] = []
    for unit in units:
        in_unit = sum(n for name, n in codes.items() if name.startswith(unit.name + "."))
        out += _fsdp_unit_collectives(layout, unit, kept=unit.name in (EMBEDDINGS, last_block, HEAD), codes=in_unit)
    return out


NVFP4_GATHERED_BYTES = 0.5 + 1 / 16
"""Bytes per element of a gathered NVFP4 operand: its E2M1 code (half a byte) and a 16th of its block's E4M3
scale (a reduction of a multiple of 32, as the hidden sizes are: no padding)."""


def _has_tensor_scale(fmt: str) -> bool:
    return fmt != "bf16" and FORMAT_COSTS[fmt].amax_pass


def _linear_amaxes(model: ModelConfig, layout: RunLayout, name: str, column: bool, recomputes: bool,
                   gathers: bool = False) -> Counter:
    """Per micro-batch: amax all-reduces of one TP linear (module docstring), bytes -> calls; ``gathers``: it
    gathers a quantized operand along the sequence (a column-parallel one X, a row-parallel one dY)."""
    formats = layout.gemm_formats.get(name, {})
    fprop, dgrad, wgrad = (_has_tensor_scale(formats.get(kind, "bf16")) for kind in ("fprop", "dgrad", "wgrad"))
    forward = fprop * (1 if column and not gathers else 2)  # column: W; row, or gathering its input: W and X
    forward -= fprop * (name in code_gathered_linears(model, layout))  # W came gathered as codes: no amax
    if column:
        backward = dgrad + wgrad * (2 if gathers else 1)  # dY, dY^T; + X^T where it gathers X
    else:
        backward = wgrad + (dgrad + wgrad if gathers else 0)  # X^T; + dY and dY^T where it gathers dY
    backward += dgrad * (not layout.weight_reused)  # Dgrad's W^T quantized again (1D weight blocks)
    forwards = 2 if recomputes else 1
    if layout.gathers_quantized_input:  # the torch NVFP4 layer: one all-reduce of a phase's amaxes, stacked
        return Counter({4 * forward: forwards * (forward > 0)}) + Counter({4 * backward: int(backward > 0)})
    return Counter({4: forward * forwards + backward})


_AMAX_CACHE: dict = {}


def amaxes_per_micro_batch(model: ModelConfig, layout: RunLayout) -> Counter:
    """Amax all-reduces of one micro-batch over the TP group (module docstring), bytes -> calls."""
    amaxes = Counter()
    gathering = quantized_input_gathers(model, layout) | quantized_output_scatters(model, layout)
    for index, symbol in enumerate(model.pattern):
        for module, _, _, _ in block_linears(model, symbol):
            name = f"layers.{index}.mixer.{module}"
            amaxes += _linear_amaxes(model, layout, name, module in COLUMN_PARALLEL, symbol in layout.checkpointed,
                                     name in gathering)
    return amaxes + _linear_amaxes(model, layout, "lm_head", True, False)  # column-parallel over the vocabulary


def tp_collectives(model: ModelConfig, layout: RunLayout) -> List[Collective]:
    """Sequence-parallel gathers and scatters, amax reductions and replicated gradients over the TP group."""
    T, A = layout.tp, layout.accumulation
    if T == 1:
        return []
    activation = layout.compute_bytes * layout.tokens_per_micro_batch * model.hidden_size
    compute = DTYPE_NAMES.get(layout.compute_bytes, "float16")
    blocks = len(model.pattern)
    gathering = quantized_input_gathers(model, layout)
    gathering_blocks = {int(name.split(".")[1]): name for name in gathering}
    recomputing = sum(symbol in layout.checkpointed for index, symbol in enumerate(model.pattern)
                      if index not in gathering_blocks)
    # Forward and backward (the output's gradient); a recomputing block gathers its input again, but torch's
    # checkpoint stops recomputing at the last tensor backward needs, before the output's reduce-scatter (which
    # saves none). A block whose linear gathers its input quantized gathers only the output's gradient here.
    scattering = quantized_output_scatters(model, layout)
    recomputing_scatters = sum(recomputes(model, layout, name) for name in scattering)
    out = [Collective(ALL_GATHER, TP, T, activation, A * (2 * blocks - len(gathering) - len(scattering) + recomputing),
                      compute, "sequence-parallel mixer input"),
           Collective(REDUCE_SCATTER, TP, T, activation, A * (2 * blocks - len(scattering)), compute,
                      "sequence-parallel mixer output"),
           Collective(REDUCE_SCATTER, TP, T, activation, A, compute, "vocabulary-parallel embedding rows (forward)"),
           Collective(ALL_GATHER, TP, T, activation, A, compute, "vocabulary-parallel embedding gradient (backward)"),
           Collective(ALL_GATHER, TP, T, activation, A, compute, "vocabulary-parallel LM head input (forward)"),
           Collective(REDUCE_SCATTER, TP, T, activation, A, compute, "vocabulary-parallel LM head input gradient "
                      "(backward)"),
           Collective(ALL_REDUCE, TP, T, 4 * layout.tokens_per_micro_batch, 3 * A, "float32",
                      "vocabulary-parallel loss (max, sum of exponentials, target logit)")]
    # A gathering linear: X's codes and block scales forward (again when its block recomputes), X^T's for Wgrad
    # in the backward (X itself when Wgrad runs in the compute dtype); its dX reduce-scatter is the one above.
    codes = layout.tokens_per_micro_batch * model.hidden_size * NVFP4_GATHERED_BYTES
    forward_gathers = sum(1 + recomputes(model, layout, name) for name in gathering)
    wgrad_quantized = sum(layout.gemm_formats.get(name, {}).get("wgrad", "bf16") != "bf16" for name in gathering)
    if gathering:
        out.append(Collective(ALL_GATHER, TP, T, codes, A * (forward_gathers + wgrad_quantized), "uint8",
                              "sequence-parallel input of a column-parallel NVFP4 linear, quantized (codes and "
                              "block scales)"))
    if scattering:
        # A scattering linear reduce-scatters its output a sequence at a time (inside its autograd function,
        # whose saved tensors are packed as it returns: a recomputing block's scatters again, its result unused),
        # and gathers dY for Dgrad, then dY^T for Wgrad.
        B = layout.micro_batch
        out.append(Collective(REDUCE_SCATTER, TP, T, activation // B, A * B * (len(scattering) + recomputing_scatters),
                              compute, "sequence-parallel mixer output of a row-parallel NVFP4 linear, a sequence at "
                              "a time"))
        out.append(Collective(ALL_GATHER, TP, T, codes, 2 * A * len(scattering), "uint8",
                              "sequence-parallel output gradient of a row-parallel NVFP4 linear, quantized (dY, then "
                              "dY^T: codes and block scales)"))
    if len(gathering) > wgrad_quantized:
        out.append(Collective(ALL_GATHER, TP, T, activation, A * (len(gathering) - wgrad_quantized), compute,
                              "sequence-parallel input of a column-parallel NVFP4 linear for its BF16 Wgrad"))
    amaxes = memoized(_AMAX_CACHE, model, layout, lambda: amaxes_per_micro_batch(model, layout), micro_batch=False)
    for size, calls in sorted(amaxes.items()):
        out.append(Collective(ALL_REDUCE, TP, T, size, A * calls, "float32",
                              "amax of quantized TP operands (NVFP4/FP8 tensor scales)", scalar=True))
    replicated = sum(padded for unit in unit_sizes(model, T, layout.shard) for _, padded in unit.replicated_padded)
    out.append(Collective(ALL_REDUCE, TP, T, 4 * replicated // layout.shard, 1, "float32",
                          "gradients of the TP-replicated parameters (flat, FSDP-sharded)"))
    return out


def cp_collectives(model: ModelConfig, layout: RunLayout) -> List[Collective]:
    """What crosses a context-parallel piece boundary (module docstring): per Mamba layer its conv halo and SSD
    state, per attention layer K and V; forward all-gathers (again in a recomputing block), backward
    reduce-scatters."""
    C, T, A, B = layout.cp, layout.tp, layout.accumulation, layout.micro_batch
    if C == 1:
        return []
    compute, c = DTYPE_NAMES.get(layout.compute_bytes, "float16"), layout.compute_bytes
    out = []

    def both(bytes_per_call: int, symbol: str, dtype: str, what: str) -> None:
        layers = model.pattern.count(symbol)
        if not layers:
            return
        forwards = layers * (2 if symbol in layout.checkpointed else 1)
        out.append(Collective(ALL_GATHER, CP, C, bytes_per_call, A * forwards, dtype, f"context-parallel {what}"))
        out.append(Collective(REDUCE_SCATTER, CP, C, bytes_per_call, A * layers, dtype,
                              f"context-parallel {what} (gradient)"))

    channels = (model.mamba_inner_size + 2 * model.mamba_num_groups * model.ssm_state_size) // T
    heads = model.mamba_num_heads // T
    both(c * C * B * (model.conv_kernel - 1) * channels, "M", compute, "Mamba conv halo (last K-1 tokens)")
    both(4 * C * B * heads * (model.mamba_head_dim * model.ssm_state_size + 1), "M", "float32",
         "Mamba SSD end state and log decay")
    both(c * 2 * B * model.num_key_value_heads // T * layout.seq_len * model.attention_head_dim, "*", compute,
         "attention K and V")
    return out


def scalar_collectives(model: ModelConfig, layout: RunLayout) -> List[Collective]:
    """The loss's mean, the gradient norm's reduction and the preemption flag, once a step."""
    if layout.gpus == 1:
        return []
    out = [Collective(ALL_REDUCE, WORLD, layout.gpus, 4, 1, "float32", "loss mean over ranks", scalar=True)]
    if layout.fsdp:  # clip_grad_norm_ stacks one partial norm per parameter tensor; each split mesh dim reduces it
        tensors = sum(len(unit.params) for unit in fsdp_units(model))
        for mesh_dim, size in ((DP_SHARD, layout.shard), (TP, layout.tp)):
            if size > 1:
                out.append(Collective(ALL_REDUCE, mesh_dim, size, 4 * tensors, 1, "float32",
                                      "gradient norm (the stacked per-parameter norms)", scalar=True))
    out.append(Collective(ALL_REDUCE, WORLD, layout.gpus, 8, 1, "int64", "preemption flag (MAX)", scalar=True))
    codes = code_gathered_linears(model, layout)
    if codes:  # before every forward: the amaxes of the weights gathered as codes (trainer.nvfp4_weight_gather)
        out.append(Collective(ALL_REDUCE, WORLD, layout.gpus, 4 * len(codes), layout.accumulation, "float32",
                              "amaxes of the NVFP4 weights gathered as codes (MAX)", scalar=True))
    return out


def step_collectives(model: ModelConfig, layout: RunLayout) -> List[Collective]:
    """Every collective one rank issues in one optimizer step (module docstring)."""
    return (fsdp_collectives(model, layout) + tp_collectives(model, layout) + cp_collectives(model, layout)
            + scalar_collectives(model, layout))


# ---------------------------------------------------------------------------- seconds on the links
def group_span(layout: RunLayout, mesh_dim: str, group_size: int) -> Tuple[int, int]:
    """(ranks of the group in one node m, nodes the group spans k) from the mesh order."""
    node = max(1, min(layout.gpus_per_node, layout.gpu.nvlink_domain)) if layout.gpu.nvlink_bytes_per_s > 0 else 1
    stride = {TP: 1, CP: layout.tp, DP_SHARD: layout.tp, DP_REPLICATE: layout.shard * layout.tp, WORLD: 1}[mesh_dim]
    in_node = max(1, min(group_size, node // stride)) if stride <= node else 1
    return in_node, math.ceil(group_size / in_node)


def call_seconds(collective: Collective, layout: RunLayout, network_efficiency: float) -> float:
    """Seconds of one call of ``collective`` on this layout's links (module docstring)."""
    n = collective.group_size
    if n <= 1:
        return 0.0
    gpu = layout.gpu
    m, k = group_span(layout, collective.mesh_dim, n)
    # Across nodes NCCL runs one ring (channel) per NIC: each crosses every node boundary once, so the m ranks of
    # a node move the data over m NICs at once, and NVLink inside the node bounds it too.
    across = m * gpu.network_bytes_per_s
    bandwidth = (gpu.nvlink_bytes_per_s if k == 1
                 else min(gpu.nvlink_bytes_per_s, across) if gpu.nvlink_bytes_per_s else across) * network_efficiency
    passes = 2 if collective.op == ALL_REDUCE else 1  # a tree all-reduce: reduce, then broadcast
    transfer = passes * (n - 1) / n * collective.bytes_per_call / bandwidth
    if collective.op == ALL_REDUCE:
        levels = (math.ceil(math.log2(m)), math.ceil(math.log2(k)))
        hops = 2 * (levels[0] * HOP_LATENCY_S["nvlink"] + levels[1] * HOP_LATENCY_S["network"])
    else:
        hops = (n - k) * HOP_LATENCY_S["nvlink"] + (k * HOP_LATENCY_S["network"] if k > 1 else 0.0)
    return transfer + BASE_LATENCY_S + hops


def kind_of(collective: Collective) -> str:
    """'overlapped' (FSDP/HSDP), 'tensor parallel', 'context parallel' or 'scalars' (none of those overlapped)."""
    if collective.overlapped:
        return "overlapped"
    return {TP: "tensor parallel", CP: "context parallel"}.get(collective.mesh_dim, "scalars")


def seconds_by_kind(collectives: List[Collective], layout: RunLayout, network_efficiency: float) -> Dict[str, float]:
    """Seconds per step by kind_of: each call's seconds x its calls, summed."""
    calls: Dict[tuple, int] = {}
    for c in collectives:  # many units share their sizes: each distinct call is timed once
        key = (kind_of(c), c.op, c.mesh_dim, c.group_size, c.bytes_per_call)
        calls[key] = calls.get(key, 0) + c.calls_per_step
    out = {"overlapped": 0.0, "tensor parallel": 0.0, "context parallel": 0.0, "scalars": 0.0}
    for (kind, op, mesh_dim, group, size), count in calls.items():
        out[kind] += count * call_seconds(Collective(op, mesh_dim, group, size, 1, "", ""), layout, network_efficiency)
    return out
