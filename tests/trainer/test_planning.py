"""The run planner's arithmetic against hand counts, and its predictions against the H200 measurements."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from models import build_model
from models.config import ModelConfig
from trainer.config import compose
from trainer.hardware import GPUS, GpuSpec, cpu_spec
from trainer.planning import plan_run, smallest_changes
from trainer.planning.layout import resolve_layout
from trainer.planning.collectives import seconds_by_kind, step_collectives
from trainer.planning.step_time import H200_CALIBRATED, plan_step_time
from trainer.validate import ConfigError

GIB = 2**30


def hand_config() -> ModelConfig:
    """Small enough to count by hand: h 64, F 256, 4 query heads (2 KV) of 16, 8 Mamba heads of 16, N 16, G 1."""
    return ModelConfig(name="hand", pattern="M*-", vocab_size=512, hidden_size=64, ffn_hidden_size=256,
                       num_attention_heads=4, num_key_value_heads=2, attention_head_dim=16, mamba_num_heads=8,
                       mamba_head_dim=16, ssm_state_size=16, mamba_num_groups=1, conv_kernel=4, chunk_size=16).validate()


# By hand: embedding and LM head 512 x 64 each, final norm 64, three block norms of 64;
# Mamba in_proj 64 x (2*128 + 2*16 + 8) = 18944, conv (128 + 32) x (4 + 1) = 800, dt_bias/A_log/D 24,
# gated norm 128, out_proj 128 x 64 = 8192; attention q 64x64 + k 64x32 + v 64x32 + o 64x64 = 12288;
# MLP 2 x 64 x 256 = 32768.
HAND_PARAMS = 2 * 32768 + 64 + 3 * 64 + (18944 + 800 + 24 + 128 + 8192) + 12288 + 32768
HAND_LINEAR = 18944 + 8192 + 12288 + 32768 + 32768  # every GEMM weight, the LM head included


def hand_run(*overrides: str):
    cfg = compose(["model=tiny", "precision=bf16", "data.seq_len=32", *overrides])
    cfg.model = hand_config()
    return cfg


def test_parameters_and_flops_of_a_hand_counted_model():
    cfg = hand_run("train.micro_batch_size=2", "train.global_batch_size=2")
    assert HAND_PARAMS == 138936
    assert HAND_PARAMS == sum(p.numel() for p in build_model(cfg.model).parameters())
    plan = plan_run(cfg, GPUS["H200"], 1)
    assert plan.params == HAND_PARAMS
    # 6 x linear weights + attention 3 x 2 x 2 x (Hq a) x s/2 + SSD 3 x 7 d N, per token; 64 tokens a step
    per_token = 6 * HAND_LINEAR + 3 * 2 * 2 * 64 * 32 / 2 + 3 * 7 * 128 * 16
    assert plan.flops_per_step == pytest.approx(64 * per_token, rel=1e-12)


def test_memory_of_one_gpu_without_fsdp_by_hand():
    """BF16 autocast over FP32 master weights, 2 x 32 tokens: the peak is a block's backward (state dominates)."""
    plan = plan_run(hand_run("train.micro_batch_size=2", "train.global_batch_size=2"), GPUS["H200"], 1)
    P = HAND_PARAMS
    weight_copies = 2 * HAND_LINEAR  # autocast's BF16 copy of every linear's weight, held for Dgrad
    # Saved per token (residual FP32 4 x 64 + rstd 4, then c = 2 bytes per element):
    mamba = 256 + 4 + 2 * (296 + 2 * 160 + 128) + 4 * (2 * 8 + 1) + 2 * 64 + 2 * 128  # + in_proj, out_proj inputs
    attention = 256 + 4 + 2 * (2 * 64 + 2 * 32) + 4 * 4 + 2 * 64 + 2 * 64  # q, k, v, out, lse; qkv and o inputs
    mlp = 256 + 4 + 2 * 256 + 2 * 64 + 2 * 256  # ReLU output; up and down inputs
    assert (mamba, attention, mlp) == (2200, 916, 1412)
    head = 256 + 4 + 2 * 64
    logits = 2 * 512 + 4 * 512 + 8 * 512
    at_loss = 12 * P + weight_copies + 64 * (mamba + attention + mlp + head + logits)
    at_block = 16 * P + weight_copies + 64 * (mamba + attention + mlp)
    assert (at_loss, at_block) == (2650528, 2722688)
    assert plan.memory.at_loss_backward == at_loss and plan.memory.at_block_backward == at_block
    assert plan.memory.peak == at_block == pytest.approx(sum(plan.memory.parts.values()))
    assert plan.memory.parts["gradients (fp32)"] == 4 * P


def test_memory_under_fsdp_with_checkpointing_and_accumulation_by_hand():
    """FSDP over 4, every block recomputed, 2 micro-batches: sharded state, the unsharded accumulated
    gradient, the head and two blocks gathered, the logits at the loss's backward."""
    cfg = hand_run("train.micro_batch_size=2", "train.global_batch_size=16", "parallel.activation_checkpoint=full")
    plan = plan_run(cfg, GPUS["H200"], 4)
    assert (plan.layout.fsdp, plan.layout.shard, plan.layout.accumulation) == (True, 4, 2)
    P = HAND_PARAMS
    largest_block = 64 + 32768  # the MLP block: norm + up + down
    gathered = 2 * (32768 + 64 + 2 * largest_block)  # the head (LM head + norm_f) and two blocks
    buffers = 4 * largest_block
    common = 12 * P // 4 + 4 * P + gathered + buffers
    kept = 3 * (2 * 64 + 4)  # each block keeps only its BF16 input (and rstd)
    recomputed_mamba = 128 + 4 + 2 * 744 + 68 + 2 * 64 + 2 * 128
    head, logits = 128 + 4 + 2 * 64, 14 * 512
    at_loss = common + 64 * (kept + head + logits)
    at_block = common + 4 * P // 4 + 64 * (kept + recomputed_mamba)
    assert (at_loss, at_block) == (1801608, 1597760)
    assert plan.memory.peak == at_loss == pytest.approx(sum(plan.memory.parts.values()))
    assert plan.memory.parts["accumulated gradients (unsharded)"] == 4 * P


def test_gemm_time_is_flops_over_the_rate_when_bandwidth_is_free():
    """With unbounded bandwidth every term but the GEMMs, attention and the SSD FLOPs vanishes."""
    ideal = GpuSpec("ideal", {"bf16": 1e15}, float("inf"), 80, 0.0, 1, 0.0)
    cfg = hand_run("train.micro_batch_size=2", "train.global_batch_size=2")
    step = plan_step_time(cfg.model, resolve_layout(cfg, ideal, 1))
    eff = H200_CALIBRATED
    assert step.parts["GEMMs"] == pytest.approx(6 * HAND_LINEAR * 64 / (1e15 * eff.gemm), rel=1e-12)
    assert step.parts["attention"] == pytest.approx(64 * 3 * 2 * 2 * 64 * 32 / 2 / (1e15 * eff.attention), rel=1e-12)
    assert step.parts["SSD scan"] == pytest.approx(64 * 3 * 7 * 128 * 16 / (1e15 * eff.ssd), rel=1e-12)
    assert step.parts["elementwise"] == step.parts["loss"] == step.parts["optimizer"] == 0.0


# The hand model's FSDP units by hand: the Mamba block (norm 64, dt_bias/A_log/D 24, in_proj 18944, conv 640 +
# bias 160, gated norm 128, out_proj 8192), the attention block, the MLP block, the embedding, the head (LM head, norm_f).
HAND_UNITS = {"embeddings": 32768, "layers.0": 28152, "layers.1": 12352, "layers.2": 32832, "head": 32832}


def test_fsdp_traffic_by_hand():
    """FSDP over 8 H200s in BF16, 2 micro-batches: each unit gathered in every micro-batch's forward and again in
    its backward (the last block and the head, kept gathered, and the embedding, whose backward needs no
    parameters, once), its gradient reduce-scattered once (FP32),
    each at 7/8 of its size over NVLink (450 GB/s at 80%) plus the calls' latency."""
    assert sum(HAND_UNITS.values()) == HAND_PARAMS
    cfg = hand_run("train.micro_batch_size=1", "train.global_batch_size=16")
    layout = resolve_layout(cfg, GPUS["H200"], 8)
    collectives = step_collectives(cfg.model, layout)
    got = {(c.op, c.unit): (c.mesh_dim, c.group_size, c.bytes_per_call, c.calls_per_step) for c in collectives if c.unit}
    for unit, numel in HAND_UNITS.items():
        kept = unit in ("embeddings", "layers.2", "head")
        assert got[("all_gather", unit)] == ("dp_shard", 8, 2 * numel, 2 if kept else 4)
        assert got[("reduce_scatter", unit)] == ("dp_shard", 8, 4 * numel, 1)
    latency = 5e-6 + 7 * 1e-6  # BASE_LATENCY_S + 7 NVLink hops of the ring
    expected = sum(calls * (7 / 8 * size / (450e9 * 0.8) + latency)
                   for _, _, size, calls in (got[key] for key in got))
    assert seconds_by_kind(collectives, layout, H200_CALIBRATED.network)["overlapped"] == pytest.approx(expected, rel=1e-12)
    # HSDP: 2 replicas of 4 on 8 GPUs of 4 per node: shards over NVLink, the all-reduce over InfiniBand.
    hsdp = resolve_layout(compose(["model=tiny", "parallel=hsdp", "parallel.dp_shard=4", "train.micro_batch_size=1",
                                   "train.global_batch_size=8"]), GPUS["H200"], 8, gpus_per_node=4)
    assert (hsdp.shard, hsdp.replicate) == (4, 2)


def test_native_linears_save_their_input_quantized():
    """Per input element, a native GEMM saves X^T in its format: NVFP4 0.5 + 1/16 (E4M3 per 16), FP8
    blockwise 1 + 4/128 (FP32 per 128); the per-tensor scale is per tensor, not per element."""
    from trainer.planning.memory import linear_saved_input_bytes

    for precision, expected in (("nvfp4", 0.5 + 1 / 16), ("fp8", 1 + 4 / 128)):
        cfg = compose(["+experiment=study_bf16", f"precision={precision}", "precision.bf16_layers_at_start=0",
                       "precision.bf16_layers_at_end=0"])
        layout = resolve_layout(cfg, GPUS["B200"], 1)
        assert layout.backend == "native"
        assert linear_saved_input_bytes(layout, "layers.0.mixer.in_proj") == pytest.approx(expected)
        assert linear_saved_input_bytes(layout, "lm_head") == 2  # the LM head stays BF16


@pytest.mark.parametrize("gpu, overrides, quantized", [
    ("B200", ["parallel.tp=2"], False),  # auto under tp on Blackwell: the torch NVFP4 layer, which keeps X in BF16
    ("B200", ["precision.backend=torch"], False),
    ("B200", ["precision.backend=te"], True),  # Transformer Engine keeps the quantized X^T
    ("H100", ["precision=fp8", "precision.format=fp8_tensor", "parallel.tp=2"], True),  # the torch FP8 layer too
])
def test_what_a_native_linear_keeps_for_wgrad_follows_the_layer_that_runs(gpu, overrides, quantized):
    from trainer.planning.memory import linear_saved_input_bytes

    cfg = compose(["+experiment=nvfp4_12b", "parallel=fsdp_ac", *overrides])
    layout = resolve_layout(cfg, GPUS[gpu], 8)
    assert layout.backend == "native" and layout.saves_quantized_input == quantized
    assert layout.linear_format("layers.2.mixer.in_proj") != "bf16"  # a quantized block (the first stays BF16)
    saved = linear_saved_input_bytes(layout, "layers.2.mixer.in_proj")
    assert saved < 2 if quantized else saved == 2


def test_layouts_the_trainer_refuses_are_config_errors():
    with pytest.raises(ConfigError, match="train.global_batch_size"):
        plan_run(hand_run("train.micro_batch_size=2", "train.global_batch_size=6"), GPUS["H200"], 2)
    with pytest.raises(ConfigError, match="parallel.fsdp=off"):
        plan_run(hand_run("train.global_batch_size=16", "parallel.fsdp=off"), GPUS["H200"], 2)


def test_the_12b_needs_more_than_one_h200_and_the_planner_says_what_fits():
    cfg = compose(["+experiment=nvfp4_12b"])
    one = plan_run(cfg, GPUS["H200"], 1)
    assert one.params == 12_310_001_152
    # 16 bytes per parameter of state (FP32 weights, gradients, two Adam moments) alone: 183.5 GiB
    assert one.memory.parts["master weights (fp32)"] * 4 == pytest.approx(16 * 12_310_001_152)
    assert not one.fits and one.peak_memory_gib > 16 * 12_310_001_152 / GIB
    changes = smallest_changes(cfg, GPUS["H200"], 1)
    assert changes and all(change.plan.fits for change in changes)
    eight = plan_run(cfg, GPUS["B200"], 8, token_budget=10e12)
    assert eight.fits and eight.layout.backend == "native" and eight.layout.accumulation == 92
    assert 0.2 < eight.mfu < 0.8


# Measured on one H200 at 8568320 (scripts/benchmark.py --precisions bf16,fp8,fp8_lm_head,nvfp4 --compile,
# the slice): fwd+bwd ms, step ms, peak GiB.
H200_SLICE = {
    "bf16": (["precision=bf16"], 180.0, 201.7, 53.0),
    "fp8": (["precision=fp8", "precision.backend=torch"], 160.2, 186.8, 51.0),
    "fp8_lm_head": (["precision=fp8", "precision.backend=torch", "precision.quantize_lm_head=true"], 147.6, 174.4, 50.3),
    "nvfp4": (["precision=nvfp4", "precision.backend=emulated"], 192.7, 217.2, 53.1),
}
SLICE = ["model=slice_12b", "data.seq_len=8192", "train.micro_batch_size=1", "train.global_batch_size=1",
         "parallel.compile=true", "precision.bf16_layers_at_start=0", "precision.bf16_layers_at_end=0"]


@pytest.mark.parametrize("name", sorted(H200_SLICE))
def test_h200_slice_rows_within_the_stated_bounds(name):
    overrides, _, step_ms, peak_gib = H200_SLICE[name]
    plan = plan_run(compose(SLICE + overrides), GPUS["H200"], 1)
    assert plan.step_time_s * 1e3 == pytest.approx(step_ms, rel=0.15)
    assert plan.peak_memory_gib == pytest.approx(peak_gib, rel=0.10)


def test_h200_fsdp_activation_checkpointing_run_within_the_stated_bounds():
    """A 30-step training run of the slice under 1-GPU FSDP2 with activation checkpointing, compiled,
    on one H200: its plan_check event measured 246.6 ms a step (steps 11-20) and 46.1 GiB peak."""
    overrides = ["model=slice_12b", "data=study", "data.seq_len=8192", "train.micro_batch_size=1",
                 "train.global_batch_size=1", "parallel=fsdp_ac", "precision=bf16"]
    plan = plan_run(compose(overrides), GPUS["H200"], 1)
    assert plan.layout.fsdp and plan.layout.checkpointed == "M*-" and plan.layout.compiled
    assert plan.step_time_s * 1e3 == pytest.approx(246.6, rel=0.15)
    assert plan.peak_memory_gib == pytest.approx(46.1, rel=0.10)


def test_study_model_steps_within_15_percent():
    """The study model on the H200 with compiled blocks and CUDA graphs, 64 x 1024 tokens in two
    micro-batches of 32, every block linear quantized: about 40 ms in BF16, 57 ms in NVFP4."""
    study = ["+experiment=study_bf16", "train.micro_batch_size=32", "parallel.cuda_graph=true",
             "precision.bf16_layers_at_start=0", "precision.bf16_layers_at_end=0"]
    bf16 = plan_run(compose(study), GPUS["H200"], 1)
    nvfp4 = plan_run(compose(study + ["precision=nvfp4", "precision.backend=emulated"]), GPUS["H200"], 1)
    assert bf16.layout.accumulation == 2
    assert bf16.step_time_s * 1e3 == pytest.approx(40, rel=0.15)
    assert nvfp4.step_time_s * 1e3 == pytest.approx(57, rel=0.15)


def test_the_cpu_is_this_host():
    spec = cpu_spec(cores=2, memory_gib=24.0)
    assert spec.memory_gib == 24.0 and spec.peak_flops["bf16"] == 2 * 32 * 3e9
    plan = plan_run(hand_run("train.micro_batch_size=2", "train.global_batch_size=2"), spec, 1)
    assert plan.layout.compute_bytes == 4 and plan.layout.backend == "none" and plan.fits
    two = plan_run(hand_run("train.micro_batch_size=2", "train.global_batch_size=4"), spec, 2)
    assert two.layout.fsdp and two.time.communication > 0  # gloo between the processes of one host
    small = dataclasses.replace(spec, memory_gib=2.1)  # 2 GiB of it reserved for the process
    assert not plan_run(hand_run("train.micro_batch_size=2", "train.global_batch_size=2"), small, 1).fits


def test_build_model_count_matches_for_the_experiments_the_plan_reads():
    with torch.device("meta"):
        model = build_model(compose(["+experiment=nvfp4_8b"]).model)
    assert plan_run(compose(["+experiment=nvfp4_8b"]), GPUS["B200"], 8).params == sum(p.numel() for p in model.parameters())
