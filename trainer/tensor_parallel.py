"""Tensor parallelism with sequence parallelism (Megatron-style) over the hybrid blocks.

    apply_tensor_parallel(model, tp_mesh) -> dict   after the precision pass, before activation
                                                    checkpointing, compile and FSDP2
    cross_entropy(logits, labels, tp_mesh) -> loss   the mean loss of the batch's tokens, from each rank's
                                                    vocabulary columns of the logits
    reduce_tp_replicated_grads(model) -> int         after the step's last backward (after FSDP2's
                                                    reduce-scatter), before clipping

tp ranks, r this one (``tp_mesh.get_local_rank()``). Every parameter becomes a DTensor on ``tp_mesh``
(so a distributed checkpoint reshards between degrees by itself; FSDP2 later shards them again over the
data-parallel mesh: 2-D DTensors):

    parameter                                       placement   rank r holds
    attention q_proj, k_proj, v_proj  [heads*hd, h]  Shard(0)    heads [r Hq/tp, ...), kv heads [r Hkv/tp, ...)
    MLP up_proj                       [ffn, h]       Shard(0)    hidden columns [r ffn/tp, ...)
    Mamba in_proj                     [rows, h]      Shard(0)    groups [r G/tp, ...) (group-major rows, models.mamba2)
    Mamba conv1d weight, bias; dt_bias, A_log, D;    Shard(0)    the same groups' channels / heads
      gated norm weight
    o_proj, down_proj, out_proj       [h, in]        Shard(1)    the input columns of its heads / groups
    embeddings, lm_head               [V, h]         Shard(0)    vocabulary rows [r V/tp, ...) (Megatron's
                                                                 vocab-parallel embedding and logits)
    block norms, norm_f                              Replicate   everything

The forward computes with local tensors (``.to_local()``, differentiable) and these collectives, all
over the tp group and autograd-aware (torch's functional collectives), per block and micro-batch
(B batch, T sequence, h hidden):

    embedding      each rank looks up the ids its rows hold (zeros for the rest), then a reduce-scatter
                   along the sequence sums the ranks' rows [B, T, h] -> [B, T/tp, h] (backward: all-gather)
    mixer input    all-gather along the sequence  [B, T/tp, h] -> [B, T, h]   (backward: reduce-scatter)
                   (and the LM head's input, the final norm's output: the head is column-parallel over the
                   vocabulary, logits [B, T, V/tp])
    mixer output   reduce-scatter along the sequence, summing the row-parallel partial outputs
                   [B, T, h] -> [B, T/tp, h]                                  (backward: all-gather)
    quantized      an all-reduce (MAX) of one fp32 amax per sharded operand with a per-tensor scale
    linears        (NVFP4, FP8 per tensor; ``models.quant.quantized_linear.TP_AMAX_OPERANDS``); the native
                   NVFP4 layer stacks a phase's into one all-reduce (``merges_phase_amaxes``)

(forward hooks on each mixer: ``gather_sequence`` / ``reduce_scatter_sequence``; where the native NVFP4 layer
runs, the mixer's linears move these operands themselves, quantized: ``quantized_input_gatherer`` /
``quantized_output_scatterer`` below, models.quant.nvfp4_torch). Everything else runs
on the rank's contiguous T/tp tokens with no communication: norms, residual adds and the final norm (the
model takes the full input_ids [B, T] and returns each rank's vocabulary columns of every token's logits,
[B, T, V/tp]). ``cross_entropy`` then reduces the softmax's max, its sum and the target's logit over the
tp group (three all-reduces of [B, T] FP32; Megatron's vocab-parallel cross-entropy), so every tp rank
holds the same loss of all B x T tokens, and its backward is each rank's softmax columns minus the
one-hot target. The embedding is
split by rows rather than replicated because it is the one parameter FSDP2 gathers before the first
forward and reduces after the last backward with nothing to hide behind (trainer.distributed.apply_fsdp):
split over tp, that traffic is 1/tp; the price is one reduce-scatter and one all-gather of [B, T, h] per
micro-batch, each one of a block's. The LM head likewise: FSDP2 gathers it as the forward reaches the
last blocks and reduces it first in backward, hidden behind a block or two only, so a replicated head
of the 12B (1.34 GB) would wait on InfiniBand twice a step; split, it moves 1/tp. Each id lands on exactly one rank, so the sum is the looked-up row
itself (the others add exact zeros): bit-identical to the unsharded lookup. The loop backpropagates the batch's mean loss (the same on every tp rank); the gradients of sharded
parameters are then complete on each rank, those of replicated ones (the norms, on the rank's tokens)
partial: ``reduce_tp_replicated_grads`` sums them over the tp group (one all-reduce per dtype, on the
local tensors, whatever FSDP2's sharding).

Quantized linears (``QuantizedLinear.set_tensor_parallel``): column-parallel layers reduce the amax of
W and of the output's gradient (the LM head among them), row-parallel ones of W and of the input. Each rank's share must hold whole quantization blocks
(checked here: ValueError naming the layer and dim); a sharded layer then quantizes exactly as the
unsharded one with round-to-nearest. On CUDA the NVFP4 kernels quantize them, their own amax pass over
the shard reduced over the group first (models.quant.linear); FP8 per tensor takes the torch quantizer. Stochastic rounding mixes the tp rank into the
seed (shards draw independently), so an SR run is not bit-identical to the unsharded one. Transformer
Engine layers are refused. Call this on an initialized model (``init_weights`` permutes plain tensors,
not DTensors). Tested on the CPU with gloo (tests/trainer/test_tensor_parallel*.py), compiled blocks
included (inductor on the CPU); not yet on several GPUs over NCCL.
"""

from __future__ import annotations

import functools
from typing import Dict, List

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

from models.collectives import all_gather, reduce_scatter
from models.norms import local_tensor
from models.quant.format_registry import FORMAT_SPECS, GEMMS
from models.quant.quantized_linear import QuantizedLinear

LINEAR_ROLES = {
    "M": {"in_proj": "column", "out_proj": "row"},
    "*": {"q_proj": "column", "k_proj": "column", "v_proj": "column", "o_proj": "row"},
    "-": {"up_proj": "column", "down_proj": "row"},
}
"""Pattern symbol -> the mixer's linears and their tensor-parallel role (column: W Shard(0), row: Shard(1))."""

SHARDED_VECTORS = {"M": ("conv1d.weight", "conv1d.bias", "dt_bias", "A_log", "D", "norm.weight")}
"""Pattern symbol -> the mixer's per-group / per-head parameters, Shard(0)."""

_PLACEMENTS = {"column": Shard(0), "row": Shard(1)}

_OPERANDS = {"fprop": ("Fprop X", "Fprop W"), "dgrad": ("Dgrad dY", "Dgrad W^T"), "wgrad": ("Wgrad dY^T", "Wgrad X^T")}


# ----------------------------------------------------------------------------------------------
# The collectives and the token slice


def gather_sequence(hidden: torch.Tensor, group) -> torch.Tensor:
    """[B, T/tp, ...] on each rank -> [B, T, ...] (ranks' slices in rank order); backward: reduce-scatter."""
    return all_gather(hidden, 1, group)


def reduce_scatter_sequence(partial: torch.Tensor, group) -> torch.Tensor:
    """[B, T, ...] partial sums on each rank -> this rank's [B, T/tp, ...] of their sum; backward: all-gather."""
    return reduce_scatter(partial, 1, group)


def _sequence_slice(tensor: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    length = tensor.shape[1]
    if length % size:
        raise ValueError(f"tensor parallelism: the sequence length {length} is not divisible by tp={size} "
                         "(sequence parallelism gives each rank T/tp tokens)")
    share = length // size
    return tensor.narrow(1, rank * share, share)


def _gather_hook(group, module, args):
    return (gather_sequence(args[0], group), *args[1:])


def _reduce_scatter_hook(group, module, args, output):
    return reduce_scatter_sequence(output, group)


class VocabParallelEmbedding(nn.Embedding):
    """nn.Embedding split by vocabulary rows over the tp group, under sequence parallelism: the full
    input_ids [B, T] in, this rank's [B, T/tp, h] out (module docstring). ``tp_rank`` and ``tp_group`` are
    set by ``apply_tensor_parallel``; the weight is a DTensor Shard(0) holding rows [tp_rank V/tp, ...)."""

    tp_rank: int
    tp_group: object

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        # Ids must lie in [0, V) (the data loader checks them against the vocabulary): one outside every
        # rank's rows would come out as a zero row rather than an IndexError.
        _sequence_slice(input_ids, self.tp_rank, self.tp_group.size())  # T divisible by tp, or the clear error
        weight = local_tensor(self.weight)  # [V/tp, h]
        rows = weight.shape[0]
        local_ids = input_ids - self.tp_rank * rows
        elsewhere = (local_ids < 0) | (local_ids >= rows)  # another rank's rows
        partial = F.embedding(local_ids.masked_fill(elsewhere, 0), weight, None, self.max_norm, self.norm_type,
                              self.scale_grad_by_freq, self.sparse)
        return reduce_scatter_sequence(partial.masked_fill(elsewhere.unsqueeze(-1), 0.0), self.tp_group)


class LocalLinear(nn.Linear):
    """A high-precision nn.Linear whose weight (and bias) may be DTensors: the GEMM takes the local values."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, local_tensor(self.weight), None if self.bias is None else local_tensor(self.bias))


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Per-token cross-entropy [N] from this rank's vocabulary columns [N, V/tp] (FP32) of the logits."""

    @staticmethod
    def forward(ctx, logits, labels, first, group):
        columns = logits.shape[-1]
        top = logits.max(dim=-1).values
        dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)
        exp = (logits - top.unsqueeze(-1)).exp()
        total = exp.sum(dim=-1)
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=group)
        local = labels - first
        elsewhere = (local < 0) | (local >= columns)  # the target is another rank's column
        local = local.masked_fill(elsewhere, 0)
        target = (logits.gather(-1, local.unsqueeze(-1)).squeeze(-1) - top).masked_fill(elsewhere, 0.0)
        dist.all_reduce(target, op=dist.ReduceOp.SUM, group=group)
        softmax = exp.div_(total.unsqueeze(-1))
        ctx.save_for_backward(softmax, local, elsewhere)
        return total.log() - target

    @staticmethod
    def backward(ctx, grad):
        softmax, local, elsewhere = ctx.saved_tensors
        grad_logits = softmax.clone()
        grad_logits.scatter_add_(-1, local.unsqueeze(-1), -(~elsewhere).to(softmax.dtype).unsqueeze(-1))
        return grad_logits.mul_(grad.unsqueeze(-1)), None, None, None


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor, tp_mesh=None) -> torch.Tensor:
    """The mean FP32 cross-entropy of every token: ``F.cross_entropy`` of logits [B, T, V] and labels [B, T];
    under tensor parallelism (``tp_mesh`` of more than one rank) the logits are this rank's vocabulary
    columns [B, T, V/tp] (the LM head's rows [r V/tp, ...)), reduced over the tp group (module docstring).
    Labels must lie in [0, V)."""
    if tp_mesh is None or tp_mesh.size() == 1:
        return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
    columns = logits.shape[-1]
    per_token = _VocabParallelCrossEntropy.apply(logits.flatten(0, 1).float(), labels.flatten(),
                                                 tp_mesh.get_local_rank() * columns, tp_mesh.get_group())
    return per_token.mean()


# ----------------------------------------------------------------------------------------------
# The pass


class TensorParallelState:
    """What ``reduce_tp_replicated_grads`` needs, kept on the model (``model.tensor_parallel``): the tp
    mesh and the names of the replicated parameters (names survive FSDP2, which replaces the objects)."""

    def __init__(self, tp_mesh, replicated: List[str]):
        self.mesh = tp_mesh
        self.replicated = frozenset(replicated)

    @property
    def size(self) -> int:
        return self.mesh.size()


def _distribute(module: nn.Module, name: str, placement, tp_mesh) -> None:
    """Replace ``module.<name>`` by a Parameter holding a DTensor of it (rank 0's values, scattered)."""
    param = getattr(module, name)
    tensor = distribute_tensor(param.detach(), tp_mesh, [placement])
    setattr(module, name, nn.Parameter(tensor, requires_grad=param.requires_grad))


def _block_edge(spec) -> int:
    """The largest quantization block edge among the layer's quantized operands (1 if none)."""
    edges = [FORMAT_SPECS[operand.fmt].block_edge for gemm in GEMMS if getattr(spec, gemm) is not None
             for operand in (getattr(spec, gemm).a, getattr(spec, gemm).b)]
    return max(edges, default=1)


def _check_whole_blocks(name: str, layer: QuantizedLinear, role: str, tp: int) -> None:
    """ValueError naming the layer and dim unless each rank's share of the sharded dim holds whole blocks."""
    if not layer.spec.quantized:
        return
    dim, size = ("out_features", layer.out_features) if role == "column" else ("in_features", layer.in_features)
    edge = _block_edge(layer.spec)
    if size % (tp * edge):
        raise ValueError(
            f"tensor parallelism: layer {name!r} ({role}-parallel) splits {dim} {size} into {tp} shards of "
            f"{size / tp:g}, not a multiple of its quantization block ({edge}), so a shard would cut blocks "
            "and quantize differently from the whole layer. Keep it in BF16 (precision.bf16_layer_globs) or "
            "choose another parallel.tp")


def _amax_reductions(layer: nn.Module) -> Dict[str, int]:
    """How many amax all-reduces the layer runs per forward and per backward: one per quantized operand its
    ``amax_reduction`` names whose format has a per-tensor scale, or, in a layer that reduces a phase's amaxes
    together (``merges_phase_amaxes``: the torch NVFP4 layer), one per phase that has any."""
    counts = {"forward": 0, "backward": 0}
    if not isinstance(layer, QuantizedLinear) or layer.amax_reduction is None:
        return counts
    spec = layer.spec
    for gemm in GEMMS:
        gemm_spec = getattr(spec, gemm)
        if gemm_spec is None:
            continue
        for operand_spec, operand in zip((gemm_spec.a, gemm_spec.b), _OPERANDS[gemm]):
            if operand == "Dgrad W^T" and spec.reuses_forward_weight:
                continue  # Fprop's quantized W, saved
            if layer.amax_reduction.applies(operand, operand_spec.fmt):
                counts["forward" if gemm == "fprop" else "backward"] += 1
    if getattr(layer, "merges_phase_amaxes", False):
        counts = {phase: min(n, 1) for phase, n in counts.items()}
    return counts


def quantized_input_gatherer(block: nn.Module):
    """The mixer's column-parallel linear that gathers the sequence-parallel input itself, quantized, or None.

    The native NVFP4 layer does (``TorchNvfp4Linear.gather_input``) when it is the mixer's only column-parallel
    linear (Mamba's in_proj, the MLP's up_proj; attention's q, k and v share one gathered input) and its Fprop
    is NVFP4 when the pass runs; every other mixer gathers its input in BF16 before it (``_gather_hook``)."""
    from models.quant.nvfp4_torch import TorchNvfp4Linear

    columns = [child for child, role in LINEAR_ROLES[block.symbol].items() if role == "column"]
    if len(columns) != 1:
        return None
    layer = getattr(block.mixer, columns[0])
    return layer if isinstance(layer, TorchNvfp4Linear) and layer.spec.fprop is not None else None


def quantized_output_scatterer(block: nn.Module):
    """The mixer's row-parallel linear when it reduce-scatters its output itself and gathers the output's
    gradient as codes, or None: the native NVFP4 layer whose Dgrad and Wgrad are both NVFP4 when the pass runs
    (``TorchNvfp4Linear.scatter_output``); every other mixer's output is reduce-scattered after it
    (``_reduce_scatter_hook``), its gradient gathered in high precision."""
    from models.quant.nvfp4_torch import TorchNvfp4Linear

    rows = [child for child, role in LINEAR_ROLES[block.symbol].items() if role == "row"]
    layer = getattr(block.mixer, rows[0]) if len(rows) == 1 else None
    quantized = isinstance(layer, TorchNvfp4Linear) and layer.spec.dgrad is not None and layer.spec.wgrad is not None
    return layer if quantized else None


def _check_linear(layer: nn.Module, name: str, role: str, tp: int) -> None:
    """ValueError naming the layer unless this pass can shard it in ``role``."""
    if isinstance(layer, QuantizedLinear):
        _check_whole_blocks(name, layer, role, tp)
    elif type(layer) not in (nn.Linear, LocalLinear):
        raise ValueError(f"tensor parallelism: layer {name!r} is a {type(layer).__name__}; it shards nn.Linear and "
                         "the emulated and torch quantized linears, not Transformer Engine's (precision.backend=te)")
    if layer.bias is not None and role == "row":  # it would be added once per rank before the reduction
        raise ValueError(f"tensor parallelism: row-parallel layer {name!r} has a bias, which is not supported")


def _prepare_linear(parent: nn.Module, child: str, role: str, tp_mesh, counts: dict) -> None:
    layer = getattr(parent, child)
    if isinstance(layer, QuantizedLinear):
        layer.set_tensor_parallel(role, tp_mesh.get_group(), tp_mesh.get_local_rank())
    else:
        layer.__class__ = LocalLinear  # same object, parameters and hooks; computes on the local weight
    _distribute(layer, "weight", _PLACEMENTS[role], tp_mesh)
    if layer.bias is not None:  # the output's rows: sharded with a column-parallel weight, else replicated
        _distribute(layer, "bias", Shard(0) if role == "column" else Replicate(), tp_mesh)


def apply_tensor_parallel(model: nn.Module, tp_mesh) -> dict:
    """Shard ``model`` (a HybridLM, after ``apply_precision``) over the 1-D ``tp_mesh`` in place, as the
    module docstring says; returns what it did (counts). tp = 1: nothing is changed.

    Afterwards ``model(input_ids [B, T])`` returns this rank's vocabulary columns of the logits [B, T, V/tp]
    (``cross_entropy`` takes them with the labels [B, T]) and ``reduce_tp_replicated_grads(model)`` must
    follow each step's backward. Everything is checked before anything changes (ValueError naming the
    layer or dim).
    """
    from trainer.validate import tensor_parallel_problem

    if tp_mesh.ndim != 1:
        raise ValueError(f"apply_tensor_parallel takes the 1-D tensor-parallel mesh (mesh['tp']), got {tp_mesh}")
    tp = tp_mesh.size()
    counts = {"tp": tp, "column_parallel_linears": 0, "row_parallel_linears": 0, "sharded_vectors": 0,
              "vocab_parallel_embeddings": 0, "vocab_parallel_lm_heads": 0,
              "replicated_parameters": 0, "quantized_sharded_linears": 0, "sequence_parallel_mixers": 0,
              "quantized_input_gathers": 0, "quantized_output_scatters": 0,
              "collectives_per_micro_batch": {
                  "forward": {"all_gather": 0, "reduce_scatter": 0, "amax_all_reduce": 0},
                  "backward": {"all_gather": 0, "reduce_scatter": 0, "amax_all_reduce": 0}},
              # and once per sequence of the micro-batch: a scattering linear's forward reduce-scatters
              "reduce_scatters_per_sequence": 0}
    if tp == 1:
        return counts
    if getattr(model, "tensor_parallel", None) is not None:
        raise ValueError("apply_tensor_parallel: the model is already tensor-parallel")
    problem = tensor_parallel_problem(model.config, tp, tp)  # the sequence is checked when it arrives
    if problem:
        raise ValueError(f"tensor parallelism over {tp} ranks: {problem}")

    # The plan: linears by role, then every other parameter with its placement (fully qualified names).
    linears = [(block.mixer, child, f"layers.{index}.mixer.{child}", role) for index, block in enumerate(model.layers)
               for child, role in LINEAR_ROLES[block.symbol].items()] + [(model, "lm_head", "lm_head", "column")]
    others = []  # (owner module, parameter name, fully qualified name, placement)
    for index, block in enumerate(model.layers):
        for path in SHARDED_VECTORS.get(block.symbol, ()):
            owner_path, _, param_name = path.rpartition(".")
            owner = block.mixer.get_submodule(owner_path) if owner_path else block.mixer
            others.append((owner, param_name, f"layers.{index}.mixer.{path}", Shard(0)))
        others.append((block.norm, "weight", f"layers.{index}.norm.weight", Replicate()))
    others += [(model.embeddings, "weight", "embeddings.weight", Shard(0)),
               (model.norm_f, "weight", "norm_f.weight", Replicate())]

    for parent, child, name, role in linears:
        _check_linear(getattr(parent, child), name, role, tp)
    if type(model.embeddings) is not nn.Embedding:
        raise ValueError(f"tensor parallelism: embeddings is a {type(model.embeddings).__name__}, expected nn.Embedding")
    embedding = model.embeddings
    if embedding.padding_idx is not None or embedding.sparse or embedding.scale_grad_by_freq or embedding.max_norm:
        raise ValueError("tensor parallelism: the vocabulary-parallel embedding takes no padding_idx, max_norm, "
                         "scale_grad_by_freq or sparse gradient (ids of other ranks' rows are looked up as row 0 "
                         "and masked)")
    planned = {name for _, _, name, _ in others} | {f"{name}.{param}" for parent, child, name, _ in linears
                                                     for param, _ in getattr(parent, child).named_parameters()}
    unplanned = sorted(set(dict(model.named_parameters())) - planned)
    if unplanned:
        raise ValueError(f"apply_tensor_parallel: no placement for parameters {unplanned[:8]} (a new parameter "
                         "needs its entry in trainer/tensor_parallel.py)")

    group, rank = tp_mesh.get_group(), tp_mesh.get_local_rank()
    for parent, child, name, role in linears:
        layer = getattr(parent, child)
        if isinstance(layer, QuantizedLinear) and layer.spec.quantized:
            counts["quantized_sharded_linears"] += 1
        _prepare_linear(parent, child, role, tp_mesh, counts)
        counts["vocab_parallel_lm_heads" if name == "lm_head" else f"{role}_parallel_linears"] += 1
    for owner, param_name, name, placement in others:
        _distribute(owner, param_name, placement, tp_mesh)
        kind = "sharded_vectors" if isinstance(placement, Shard) else "replicated_parameters"
        counts["vocab_parallel_embeddings" if name == "embeddings.weight" else kind] += 1
    for index, block in enumerate(model.layers):  # the sequence-parallel boundary around each mixer
        gatherer = quantized_input_gatherer(block)
        if gatherer is None:
            block.mixer.register_forward_pre_hook(functools.partial(_gather_hook, group))
        else:  # the mixer's one column-parallel linear gathers its input, quantized
            gatherer.gather_input(group)
            counts["quantized_input_gathers"] += 1
            counts["collectives_per_micro_batch"]["backward"]["all_gather"] += 1  # X^T's codes (or X) for Wgrad
        scatterer = quantized_output_scatterer(block)
        if scatterer is None:
            block.mixer.register_forward_hook(functools.partial(_reduce_scatter_hook, group))
        else:  # the mixer's row-parallel linear reduce-scatters its output a sequence at a time, and gathers
            # dY's and dY^T's codes (two gathers: dY^T's moves while Dgrad runs)
            scatterer.scatter_output(group)
            counts["quantized_output_scatters"] += 1
            counts["reduce_scatters_per_sequence"] += 1
            counts["collectives_per_micro_batch"]["forward"]["reduce_scatter"] -= 1
            counts["collectives_per_micro_batch"]["backward"]["all_gather"] += 1
        counts["sequence_parallel_mixers"] += 1
        for phase in ("forward", "backward"):
            counts["collectives_per_micro_batch"][phase]["all_gather"] += 1
            counts["collectives_per_micro_batch"][phase]["reduce_scatter"] += 1
    model.lm_head.register_forward_pre_hook(functools.partial(_gather_hook, group))  # every token, V/tp columns
    counts["collectives_per_micro_batch"]["forward"]["all_gather"] += 1
    counts["collectives_per_micro_batch"]["backward"]["reduce_scatter"] += 1
    model.embeddings.__class__ = VocabParallelEmbedding  # looks up its rows, then the sequence reduce-scatter
    model.embeddings.tp_rank, model.embeddings.tp_group = rank, group
    counts["collectives_per_micro_batch"]["forward"]["reduce_scatter"] += 1
    counts["collectives_per_micro_batch"]["backward"]["all_gather"] += 1

    for parent, child, _, _ in linears:  # their amax operands final (gatherers and scatterers add theirs)
        for phase, n in _amax_reductions(getattr(parent, child)).items():
            counts["collectives_per_micro_batch"][phase]["amax_all_reduce"] += n
    replicated = [name for _, _, name, placement in others if isinstance(placement, Replicate)]
    model.tensor_parallel = TensorParallelState(tp_mesh, replicated)
    model.mark_no_weight_decay()  # the Parameters were replaced
    return counts


def reduce_tp_replicated_grads(model: nn.Module) -> int:
    """Sum the gradients of the TP-replicated parameters (the block norms, the final norm) over the tp group.

    Each tp rank computes these parameters on its own tokens (sequence parallelism), so their gradients
    are partial sums over the tokens; after this every tp rank holds the full gradient. Call once per optimizer step, after the last micro-batch's
    backward (after FSDP2's reduce-scatter / HSDP all-reduce, which are linear, so the order does not
    matter) and before clipping. Works on the gradients' local tensors (whatever FSDP2's sharding: tp
    peers hold the same data-parallel shard). One all-reduce (SUM) per gradient dtype. Returns the
    number of gradients reduced (0 without tensor parallelism).
    """
    state = getattr(model, "tensor_parallel", None)
    if state is None or state.size == 1:
        return 0
    grads = [local_tensor(param.grad) for name, param in model.named_parameters()
             if name in state.replicated and param.grad is not None]
    by_dtype: Dict[torch.dtype, List[torch.Tensor]] = {}
    for grad in grads:
        by_dtype.setdefault(grad.dtype, []).append(grad)
    group = state.mesh.get_group()
    for same in by_dtype.values():
        flat = torch.cat([grad.reshape(-1) for grad in same])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
        for grad, reduced in zip(same, flat.split([grad.numel() for grad in same])):
            grad.copy_(reduced.view_as(grad))
    return len(grads)
