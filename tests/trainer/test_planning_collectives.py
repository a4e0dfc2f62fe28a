"""The planner's communication model: the parameter table, the collectives list by hand, the seconds of a
call, and (distributed) the list against every collective the trainer's step issues on gloo."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from trainer.config import compose
from trainer.hardware import GPUS, cpu_spec
from trainer.planning.collectives import (
    BASE_LATENCY_S,
    HOP_LATENCY_S,
    Collective,
    call_seconds,
    group_span,
    step_collectives,
)
from trainer.planning.layout import (code_gathered_linears, quantized_input_gathers, quantized_output_scatters,
                                     resolve_layout)
from trainer.planning.parameters import fsdp_units, unit_sizes

ROOT = Path(__file__).resolve().parents[2]
TINY = ["model=tiny", "data.seq_len=32", "train.micro_batch_size=1", "parallel.fsdp=on", "parallel.compile=false"]


def by_key(collectives):
    """(op, mesh_dim, unit) -> (group, bytes per call, calls per step)."""
    return {(c.op, c.mesh_dim, c.unit or c.purpose): (c.group_size, c.bytes_per_call, c.calls_per_step)
            for c in collectives}


@pytest.mark.parametrize("overrides", [["+experiment=nvfp4_12b"], ["model=tiny"], ["+experiment=study_bf16"]])
def test_the_parameter_table_is_the_models(overrides):
    from models import build_model

    cfg = compose(overrides).model
    with torch.device("meta"):
        model = build_model(cfg)
    built = sorted((name, tuple(p.shape)) for name, p in model.named_parameters())
    assert built == sorted((p.name, p.shape) for unit in fsdp_units(cfg) for p in unit.params)


def test_fsdp_pads_each_parameter_to_the_shard_group():
    """The tiny Mamba block over 16 ranks: dt_bias, A_log, D (16 heads) fit; in_proj's 336 rows pad to 336,
    conv's 160 channels fit... every dim 0 rounds up to a multiple of 16."""
    cfg = compose(["model=tiny"]).model
    block = fsdp_units(cfg)[0]
    padded = sum(math.ceil(p.shape[0] / 16) * 16 * math.prod(p.shape[1:]) for p in block.params)
    assert unit_sizes(cfg, 1, 16)[0].padded_numel == padded
    assert unit_sizes(cfg, 1, 1)[0].padded_numel == block.numel()
    # 3 ranks: the 64-wide norm pads to 66, the 16 heads' vectors to 18 each.
    assert unit_sizes(cfg, 1, 3)[0].padded_numel - block.numel() == sum(
        math.ceil(p.shape[0] / 3) * 3 * math.prod(p.shape[1:]) - math.prod(p.shape) for p in block.params)


def test_policies_change_the_calls_per_unit():
    """4 micro-batches on 4 ranks: per_micro_batch gathers 8 times (the last block, the head and the embedding,
    whose backward needs no parameters, 4), per_step once; grad_reduce per_step reduces once, per_micro_batch 4
    times."""
    def calls(*policy):
        cfg = compose(TINY + ["precision=bf16", "train.global_batch_size=16", *policy])
        layout = resolve_layout(cfg, GPUS["H200"], 4)
        return {(c.op, c.unit): c.calls_per_step for c in step_collectives(cfg.model, layout) if c.unit}

    default = calls()
    assert default[("all_gather", "layers.0")] == 8 and default[("all_gather", "layers.5")] == 4
    assert default[("all_gather", "head")] == 4 and default[("all_gather", "embeddings")] == 4
    assert default[("reduce_scatter", "layers.0")] == 1
    once = calls("parallel.reshard=per_step", "parallel.grad_reduce=per_micro_batch")
    assert once[("all_gather", "layers.0")] == once[("all_gather", "head")] == once[("all_gather", "embeddings")] == 1
    assert once[("reduce_scatter", "layers.0")] == once[("reduce_scatter", "head")] == 4


def test_hsdp_all_reduces_the_sharded_gradient_and_a_shard_of_one_gathers_nothing():
    cfg = compose(TINY + ["precision=bf16", "train.global_batch_size=8", "parallel.dp_shard=2",
                          "parallel.dp_replicate=4"])
    layout = resolve_layout(cfg, GPUS["H200"], 8)
    head = unit_sizes(cfg.model, 1, 2)[-1]
    got = by_key(step_collectives(cfg.model, layout))
    assert got[("all_reduce", "dp_replicate", "head")] == (4, 4 * head.padded_numel // 2, 1)
    assert got[("reduce_scatter", "dp_shard", "head")] == (2, 4 * head.padded_numel, 1)
    single = compose(TINY + ["precision=bf16", "train.global_batch_size=8", "parallel.dp_shard=1",
                             "parallel.dp_replicate=8"])
    plain = step_collectives(single.model, resolve_layout(single, GPUS["H200"], 8))
    assert not [c for c in plain if c.op in ("all_gather", "reduce_scatter")]
    assert sum(c.mesh_dim == "dp_replicate" for c in plain) == len(fsdp_units(single.model))


def test_tensor_parallel_collectives_by_hand():
    """tp 2 x FSDP 2 on the tiny model (6 blocks, h 64), 2 micro-batches of 32 tokens, BF16 on a GPU, the Mamba
    blocks recomputed: per micro-batch one gather and one scatter of [32, 64] BF16 per block and pass, the 3
    recomputing blocks gather again, the vocabulary-parallel embedding one scatter forward and one gather
    backward, the LM head one gather forward and one scatter backward, the loss three all-reduces of [32]
    FP32; the replicated gradients (norms) once, flat."""
    cfg = compose(TINY + ["precision=bf16", "train.global_batch_size=4", "parallel.tp=2",
                          "parallel.activation_checkpoint=M"])
    layout = resolve_layout(cfg, GPUS["H200"], 4)
    assert (layout.tp, layout.shard, layout.accumulation) == (2, 2, 2)
    got = by_key(step_collectives(cfg.model, layout))
    activation = 2 * 32 * 64
    assert got[("all_gather", "tp", "sequence-parallel mixer input")] == (2, activation, 2 * (2 * 6 + 3))
    assert got[("reduce_scatter", "tp", "sequence-parallel mixer output")] == (2, activation, 2 * 2 * 6)
    m = cfg.model
    assert got[("reduce_scatter", "tp", "vocabulary-parallel embedding rows (forward)")] == (2, activation, 2)
    assert got[("all_gather", "tp", "vocabulary-parallel embedding gradient (backward)")] == (2, activation, 2)
    assert got[("all_gather", "tp", "vocabulary-parallel LM head input (forward)")] == (2, activation, 2)
    assert got[("reduce_scatter", "tp", "vocabulary-parallel LM head input gradient (backward)")] == (2, activation, 2)
    assert got[("all_reduce", "tp", "vocabulary-parallel loss (max, sum of exponentials, target logit)")] == (
        2, 4 * 32, 3 * 2)
    replicated = 6 * m.hidden_size + m.hidden_size  # block norms, norm_f
    assert got[("all_reduce", "tp", "gradients of the TP-replicated parameters (flat, FSDP-sharded)")] == (
        2, 4 * replicated // 2, 1)
    # A TP rank gathers its FSDP shard of the TP-local parameters: the MLP block's up/down halves, its whole norm.
    mlp = 64 + 2 * (128 // 2) * 64
    assert got[("all_gather", "dp_shard", "layers.1")] == (2, 2 * mlp, 4)


def test_what_the_gemms_hide_of_the_sequence_collectives():
    """The 12B in NVFP4 on 1024 B200 at tp 4, the torch NVFP4 layer: each linear that gathers its input
    quantized hides dX's reduce-scatter behind its Wgrad and X^T's gather behind its Dgrad, each linear that
    scatters its output hides all but the first sequence's reduce-scatters behind the next sequences' Fprop and
    dY^T's gather behind its Dgrad, each at most the collective's own time; nothing is hidden when the
    sequence moves in BF16."""
    from trainer.planning.step_time import hidden_tp_seconds, plan_step_time

    cfg = compose(["+experiment=nvfp4_12b", "parallel.auto=false", "parallel.tp=4", "parallel.dp_shard=2",
                   "parallel.dp_replicate=128", "train.micro_batch_size=3", "parallel.activation_checkpoint=none"])
    layout = resolve_layout(cfg, GPUS["B200"], 1024)
    gathering = quantized_input_gathers(cfg.model, layout)
    assert layout.gathers_quantized_input and layout.accumulation == 1 and len(gathering) > 40
    scattering = quantized_output_scatters(cfg.model, layout)
    assert len(scattering) > 40 and layout.micro_batch == 3
    collectives = step_collectives(cfg.model, layout)
    scatter = next(c for c in collectives if c.purpose == "sequence-parallel mixer output")
    piece = next(c for c in collectives if c.purpose.startswith("sequence-parallel mixer output of a row-parallel"))
    assert piece.bytes_per_call * 3 == scatter.bytes_per_call
    codes = next(c for c in collectives if c.purpose.startswith("sequence-parallel input of a column-parallel"))
    gathering_ceiling = len(gathering) * (call_seconds(scatter, layout, 0.8) + call_seconds(codes, layout, 0.8))
    scattering_ceiling = len(scattering) * (2 * call_seconds(piece, layout, 0.8) + call_seconds(codes, layout, 0.8))
    hidden = hidden_tp_seconds(cfg.model, layout)
    assert 0.25 * (gathering_ceiling + scattering_ceiling) < hidden <= gathering_ceiling + scattering_ceiling
    # A micro-batch of one sequence has nothing to pipeline in the forward: three of them hide less.
    one_sequence = dataclasses.replace(layout, micro_batch=1, batch=None, accumulation=3)
    assert 3 * hidden_tp_seconds(cfg.model, one_sequence) < hidden
    time = plan_step_time(cfg.model, layout)
    assert time.hidden_tensor_parallel == hidden
    issued = sum(c.calls_per_step * call_seconds(c, layout, 0.8) for c in collectives
                 if c.mesh_dim == "tp" and not c.scalar)
    assert time.parts["tensor-parallel communication"] < issued
    bf16_gathers = dataclasses.replace(layout, gathers_quantized_input=False)
    assert hidden_tp_seconds(cfg.model, bf16_gathers) == 0.0


def test_what_fsdp2_cannot_hide_at_the_ends_of_a_step():
    """The embedding's and the first block's gathers before the forward, the embedding's reduction after the
    backward; the head's gather less the last two blocks' forward, its reduction less the last block's
    backward (FSDP2 gathers one unit ahead and keeps one reduction in flight)."""
    from trainer.planning.collectives import call_seconds
    from trainer.planning.step_time import FORWARD_SHARE, H200_CALIBRATED, exposed_tail

    cfg = compose(TINY + ["precision=bf16", "train.global_batch_size=8", "parallel.dp_shard=4",
                          "parallel.dp_replicate=2"])
    layout = resolve_layout(cfg, GPUS["H200"], 8, gpus_per_node=4)
    collectives = step_collectives(cfg.model, layout)
    eff = H200_CALIBRATED

    def seconds(unit, op):
        return next(call_seconds(c, layout, eff.network) for c in collectives if c.unit == unit and c.op == op)

    start = seconds("embeddings", "all_gather") + seconds("layers.0", "all_gather")
    end = seconds("embeddings", "reduce_scatter") + seconds("embeddings", "all_reduce")
    head_gather = seconds("head", "all_gather")
    head_reduction = seconds("head", "reduce_scatter") + seconds("head", "all_reduce")
    assert exposed_tail(layout, collectives, eff, 0.0) == pytest.approx((start + head_gather, end + head_reduction))
    assert exposed_tail(layout, collectives, eff, 1.0) == pytest.approx((start, end))  # a block outlasts every call
    block = head_reduction / (1 - FORWARD_SHARE)  # its backward hides the reduction, its forward part of the gather
    assert exposed_tail(layout, collectives, eff, block) == pytest.approx(
        (start + max(0.0, head_gather - 2 * FORWARD_SHARE * block), end))


def test_a_forward_waits_for_its_gathers_however_short_the_backward_reductions():
    """Phase by phase: a step gathering once (reshard=per_step) waits for its gathers beyond its first forward's
    compute, even where the backward's compute could cover them; its reductions hide behind the backward. Pooled
    over the step, the same traffic would have hidden."""
    from trainer.planning.collectives import call_seconds
    from trainer.planning.step_time import H200_CALIBRATED, exposed_fsdp_seconds, exposed_tail

    cfg = compose(TINY + ["precision=bf16", "train.global_batch_size=8", "parallel.dp_shard=4",
                          "parallel.dp_replicate=2", "parallel.reshard=per_step", "parallel.grad_reduce=per_step"])
    layout = resolve_layout(cfg, GPUS["H200"], 8, gpus_per_node=4)
    collectives = [c for c in step_collectives(cfg.model, layout) if c.overlapped]
    eff = H200_CALIBRATED
    gathers = sum(call_seconds(c, layout, eff.network) * c.calls_per_step for c in collectives
                  if c.op == "all_gather")
    reductions = sum(call_seconds(c, layout, eff.network) * c.calls_per_step for c in collectives
                     if c.op != "all_gather")
    assert all(c.calls_per_step == 1 for c in collectives)  # once a step each
    block = 1.0  # long blocks: nothing of the ends' exposure beyond the embedding's and first block's own calls
    tail_forward, tail_backward = exposed_tail(layout, collectives, eff, block)
    forward = 0.5 * gathers  # the forward covers half its gathers, the backward all its reductions
    backward = 10 * (gathers + reductions)
    waits = exposed_fsdp_seconds(layout, collectives, eff, forward, backward, block)
    assert waits == pytest.approx(max(tail_forward, gathers - forward) + tail_backward)
    assert waits > tail_forward + tail_backward  # pooled, (forward + backward) would have hidden it all
    # the same with a forward that covers its gathers: only what nothing can hide is waited for
    assert exposed_fsdp_seconds(layout, collectives, eff, 2 * gathers, backward, block) == pytest.approx(
        tail_forward + tail_backward)


def test_amax_reductions_of_quantized_tp_linears():
    """NVFP4 (2D weights, per-tensor scales) on every block linear of the tiny model (32 Mamba heads of 4, so that
    each shard holds whole 16-blocks) at tp 2: column-parallel W, dY, dY^T and row-parallel W, X, X^T per
    micro-batch (emulated); recomputing blocks repeat their Fprop ones. The torch NVFP4 layer (B200's) adds X
    and X^T where a column-parallel linear gathers its input quantized, dY and dY^T where a row-parallel one
    gathers its output's gradient, and reduces each phase's amaxes in one all-reduce of 4 bytes an amax."""
    base = TINY + ["precision=nvfp4", "precision.bf16_layers_at_start=0", "precision.bf16_layers_at_end=0",
                   "model.mamba_num_heads=32", "model.mamba_head_dim=4", "train.global_batch_size=2"]

    def calls(*extra) -> Counter:
        """Amax all-reduces a step: bytes -> calls."""
        cfg = compose(base + list(extra))
        layout = resolve_layout(cfg, GPUS["B200"], 2)
        out = Counter()
        for c in step_collectives(cfg.model, layout):
            if c.purpose.startswith("amax"):
                out[c.bytes_per_call] += c.calls_per_step
        return out

    def amaxes(*extra) -> int:
        counted = calls(*extra)
        assert set(counted) == {4}, counted  # one amax a call
        return counted[4]

    pattern = compose(base).model.pattern
    linears = sum(2 if s in "M-" else 4 for s in pattern)  # M: in/out; -: up/down; *: q, k, v / o
    rows = len(pattern)  # one row-parallel linear per block
    per_micro_batch = 3 * linears  # column: W, dY, dY^T; row: W, X, X^T
    emulated = ("parallel.tp=2", "precision.backend=emulated")
    assert amaxes(*emulated, "parallel.activation_checkpoint=none") == 2 * per_micro_batch
    recompute = (linears - rows) + 2 * rows  # column: W again; row: W and X again
    assert amaxes(*emulated, "parallel.activation_checkpoint=full") == 2 * (per_micro_batch + recompute)
    gathers = sum(symbol in "M-" for symbol in pattern)  # Mamba's in_proj, the MLP's up_proj
    alone = linears - rows - gathers  # attention's q, k, v: W forward; dY, dY^T backward
    # Forward: q/k/v W (4 bytes); a gatherer's or row linear's X and W (8). Backward: q/k/v dY, dY^T (8);
    # a gatherer's dY, dY^T, X^T and a row linear's X^T, dY, dY^T (12). Two micro-batches a step.
    native = Counter({4: alone, 8: gathers + rows + alone, 12: gathers + rows})
    assert calls("parallel.tp=2", "parallel.activation_checkpoint=none") == Counter(
        {size: 2 * n for size, n in native.items()})
    recomputed = native + Counter({4: alone, 8: gathers + rows})  # every Fprop again
    assert calls("parallel.tp=2", "parallel.activation_checkpoint=full") == Counter(
        {size: 2 * n for size, n in recomputed.items()})


def test_a_call_takes_its_links_time_and_latency():
    layout = resolve_layout(compose(TINY + ["precision=bf16", "train.global_batch_size=16", "parallel.tp=2"]),
                            GPUS["B200"], 16)  # tp 2 x FSDP 8 over 2 nodes of 8
    assert group_span(layout, "tp", 2) == (2, 1)
    assert group_span(layout, "dp_shard", 8) == (4, 2)  # 4 of the shard group in a node, 2 nodes
    ring = Collective("all_gather", "dp_shard", 8, 10**9, 1, "", "")
    # Across nodes the 4 ranks of a node move the data over their 4 NICs at once (one ring per NIC).
    expected = 7 / 8 * 1e9 / (4 * 50e9 * 0.8) + BASE_LATENCY_S + 6 * HOP_LATENCY_S["nvlink"] + 2 * HOP_LATENCY_S["network"]
    assert call_seconds(ring, layout, 0.8) == pytest.approx(expected)
    replicas = resolve_layout(compose(TINY + ["precision=bf16", "train.global_batch_size=16", "parallel.dp_shard=8",
                                              "parallel.dp_replicate=2"]), GPUS["B200"], 16)
    assert group_span(replicas, "dp_replicate", 2) == (1, 2)  # one rank a node: one NIC
    across = Collective("all_reduce", "dp_replicate", 2, 10**9, 1, "", "")
    assert call_seconds(across, replicas, 0.8) == pytest.approx(2 * 1 / 2 * 1e9 / (50e9 * 0.8) + BASE_LATENCY_S
                                                                + 2 * HOP_LATENCY_S["network"])
    inside = Collective("all_reduce", "tp", 2, 4, 1, "", "")
    assert call_seconds(inside, layout, 0.8) == pytest.approx(2 * 1 / 2 * 4 / (900e9 * 0.8) + BASE_LATENCY_S
                                                              + 2 * HOP_LATENCY_S["nvlink"])
    assert call_seconds(Collective("all_reduce", "tp", 1, 4, 1, "", ""), layout, 0.8) == 0.0


# ---------------------------------------------------------------------------- against the trainer, on gloo
def _worker(overrides: list, out: str) -> None:
    """Under torchrun: two trainer steps (the second counted) of trainer.loop.train_step; rank 0 writes every
    c10d and functional collective it issued with its tensors."""
    import contextlib

    import torch.distributed as dist
    from torch.distributed.tensor import DTensor
    from torch.utils._python_dispatch import TorchDispatchMode

    from models.quant.recipe import apply_precision
    from trainer.distributed import init_distributed, parallelize
    from trainer.loop import build_model_on, train_step

    ops = {getattr(torch.ops.c10d, name).default: name for name in
           ("_allgather_base_", "_reduce_scatter_base_", "allgather_", "allreduce_", "broadcast_", "reduce_scatter_",
            "allgather_into_tensor_coalesced_", "reduce_scatter_tensor_coalesced_", "allreduce_coalesced_")}
    ops.update({getattr(torch.ops._c10d_functional, name).default: "functional_" + name for name in
                ("all_gather_into_tensor", "all_reduce", "reduce_scatter_tensor")})

    class Count(TorchDispatchMode):
        calls: list = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if any(isinstance(t, type) and issubclass(t, DTensor) for t in types):
                return NotImplemented  # let DTensor lower itself to the collectives counted below
            if func in ops:
                leaves = torch.utils._pytree.tree_leaves((args, kwargs or {}))
                tensors = [a for a in leaves if isinstance(a, torch.Tensor)]
                # a functional all-gather's group size is its argument after the input
                group = args[1] if ops[func].startswith("functional_all_gather") else None
                self.calls.append((ops[func], [[list(t.shape), t.element_size()] for t in tensors], group))
            return func(*args, **(kwargs or {}))

    cfg = compose(overrides)
    env = init_distributed(cfg.parallel)
    if cfg.precision.backend == "torch":  # the native NVFP4 layer on the CPU: its GEMM from the packed operands
        import models.quant.recipe as recipe
        from models.quant import nvfp4_torch

        recipe.resolve_backend = lambda *args, **kwargs: "torch"
        nvfp4_torch.nvfp4_gemm = lambda a, b, out_dtype: (a.dequantize() @ b.dequantize().t()).to(out_dtype)
        nvfp4_torch.check_native_support = lambda *args, **kwargs: None
    model = build_model_on(cfg, env.device)
    apply_precision(model, cfg.precision, device=env.device)
    parallelize(model, cfg.parallel, env, cfg.data.seq_len)
    accumulation = cfg.train.global_batch_size // (cfg.train.micro_batch_size * env.dp_size)
    generator = torch.Generator().manual_seed(env.dp_rank)
    piece = cfg.data.seq_len // env.cp  # a context-parallel rank's tokens of each sequence
    first = env.cp_rank * piece

    def batches():
        while True:
            tokens = torch.randint(0, cfg.model.vocab_size, (cfg.train.micro_batch_size, cfg.data.seq_len + 1),
                                   generator=generator)
            yield {"inputs": tokens[:, first:first + piece], "labels": tokens[:, first + 1:first + piece + 1]}

    loader, optimizer = batches(), torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step():
        train_step(model, optimizer, loader, accumulation, contextlib.nullcontext(), env.device, 1.0, lambda: None,
                   parallel=cfg.parallel, tp_mesh=env.tp_mesh)
        flag = torch.tensor([0])  # the preemption flag, as trainer.guards.PreemptionFlag.requested
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # FSDP2's lazy initialisation
    with Count():
        step()
    if env.rank == 0:
        Path(out).write_text(json.dumps(Count.calls))
    dist.destroy_process_group()


def _issued(calls: list) -> Counter:
    """(op, bytes per call as the planner counts them) -> calls."""
    out = Counter()
    for name, tensors, group in calls:
        sizes = [math.prod(shape) * element for shape, element in tensors]
        if name == "functional_all_gather_into_tensor":  # only the input is an argument: x the group
            out[("all_gather", sizes[0] * group)] += 1
        elif "allgather" in name:
            out[("all_gather", max(sizes))] += 1
        elif "reduce_scatter" in name:
            out[("reduce_scatter", max(sizes))] += 1
        else:
            out[("all_reduce", sizes[0])] += 1
    return out


@pytest.mark.distributed
@pytest.mark.parametrize("ranks, overrides", [
    (2, ["precision=bf16", "train.global_batch_size=4"]),
    (2, ["precision=bf16", "train.global_batch_size=6", "parallel.reshard=per_step",
         "parallel.grad_reduce=per_micro_batch", "parallel.activation_checkpoint=full"]),
    (4, ["precision=nvfp4", "precision.backend=emulated", "train.global_batch_size=4", "parallel.tp=2",
         "parallel.activation_checkpoint=M"]),
    (4, ["precision=bf16", "train.global_batch_size=8", "parallel.dp_shard=2", "parallel.dp_replicate=2"]),
    # parallel=auto's composition past 256 GPUs: tp x FSDP x HSDP, quantized (amax all-reduces over tp)
    (8, ["precision=nvfp4", "precision.backend=emulated", "train.global_batch_size=8", "parallel.tp=2",
         "parallel.dp_shard=2", "parallel.dp_replicate=2"]),
    # parallel=auto on Blackwell: the native NVFP4 layer, whose in_proj and up_proj gather their input quantized
    # and whose row-parallel linears reduce-scatter their output a sequence (of two) at a time
    (4, ["precision=nvfp4", "precision.backend=torch", "precision.gradient_stochastic_rounding=false",
         "precision.bf16_layers_at_start=0", "precision.bf16_layers_at_end=1", "train.global_batch_size=4",
         "train.micro_batch_size=2", "parallel.tp=2", "parallel.activation_checkpoint=M",
         "model.mamba_num_heads=32", "model.mamba_head_dim=4"]),
    # parallel=auto past 256 GPUs: context parallelism, FSDP over dp_shard x cp (the Mamba blocks recomputed:
    # their halo and state gathers again), and under tensor parallelism
    (4, ["precision=bf16", "train.global_batch_size=4", "parallel.cp=2", "parallel.activation_checkpoint=M"]),
    (4, ["precision=nvfp4", "precision.backend=emulated", "train.global_batch_size=4", "parallel.tp=2",
         "parallel.cp=2", "model.mamba_num_heads=32", "model.mamba_head_dim=4"]),
    # NVFP4 weights gathered as codes (one uint8 buffer a unit, the amaxes' MAX before each forward, no W amax
    # over tp), alone and under tensor parallelism
    (2, ["precision=nvfp4", "precision.backend=emulated", "precision.bf16_layers_at_start=0",
         "precision.bf16_layers_at_end=1", "train.global_batch_size=4", "parallel.gather_nvfp4_weights=true",
         "model.mamba_num_heads=32", "model.mamba_head_dim=4"]),
    (4, ["precision=nvfp4", "precision.backend=emulated", "precision.bf16_layers_at_start=0",
         "precision.bf16_layers_at_end=1", "train.global_batch_size=4", "parallel.tp=2",
         "parallel.gather_nvfp4_weights=true", "model.mamba_num_heads=32", "model.mamba_head_dim=4"]),
])
def test_the_list_is_what_the_trainer_issues_on_gloo(tmp_path, ranks, overrides):
    overrides = TINY + overrides
    out = tmp_path / "calls.json"
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}", __file__,
         "--worker", str(out), *overrides],
        cwd=ROOT, capture_output=True, text=True, timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert result.returncode == 0, result.stderr[-3000:]
    cfg = compose(overrides)
    layout = resolve_layout(cfg, cpu_spec(), ranks)
    if cfg.parallel.gather_nvfp4_weights:  # not a vacuous case: some weights do travel as codes
        assert code_gathered_linears(cfg.model, layout)
    if cfg.precision.backend == "torch":  # the layout Blackwell resolves, at the CPU's compute bytes
        layout = dataclasses.replace(layout, backend="native", saves_quantized_input=False,
                                     gathers_quantized_input=True)
        assert len(quantized_input_gathers(cfg.model, layout)) == 4  # M-M*M-: the last block stays in BF16
        assert len(quantized_output_scatters(cfg.model, layout)) == 5
    planned = Counter()
    for collective in step_collectives(cfg.model, layout):
        planned[(collective.op, collective.bytes_per_call)] += collective.calls_per_step
    assert _issued(json.loads(out.read_text())) == planned


if __name__ == "__main__" and "--worker" in sys.argv:
    position = sys.argv.index("--worker")
    _worker(sys.argv[position + 2:], sys.argv[position + 1])
