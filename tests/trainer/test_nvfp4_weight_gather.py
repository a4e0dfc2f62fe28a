"""FSDP2 gathering NVFP4 weights as codes (parallel.gather_nvfp4_weights, trainer/nvfp4_weight_gather.py).

Through the trainer (torchrun, gloo, CPU processes): two ranks train the tiny hybrid in emulated NVFP4 with the
weights gathered as codes and, separately, in BF16: the same losses bit for bit (each rank quantizes its rows
with the whole weight's amax, so the gathered codes are the layer's own), and a checkpoint of the codes run
resumes to the same losses. The layers do take the gathered codes (counted), and a shard amax in place of the
whole weight's parts the losses."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.fsdp import MixedPrecisionPolicy

from models.quant import nvfp4_torch
from models.quant.gemm_spec import OperandSpec
from models.quant.linear import _gathered_operand, _quantize_operand
from trainer.nvfp4_weight_gather import NVFP4ShardedWeight, WeightAmax
from trainer_testing import losses_by_step, run_cli, tiny_overrides

TILE = OperandSpec("nvfp4", (16, 16))


def _gathered(weight: torch.Tensor, shards: int, whole_amax: bool = True):
    """``weight`` (FP32) gathered as FSDP2 would from ``shards`` ranks' rows: each quantizes its rows with the
    whole weight's amax (or, as a control, its own) and the codes and scales are joined in rank order."""
    pieces, metadata = [], None
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16)
    for rows in weight.chunk(shards):
        holder = WeightAmax(rows.device)
        holder.value.copy_((weight if whole_amax else rows).to(torch.bfloat16).abs().amax().float())
        holder.fresh = True
        inputs, metadata = NVFP4ShardedWeight(rows, holder).fsdp_pre_all_gather(None, weight.shape, weight.stride(),
                                                                               None, policy)
        pieces.append(inputs)
        if not whole_amax:
            break
    if not whole_amax:  # one rank's codes and scales made with its own amax, the others' with theirs
        return None, pieces
    outputs = tuple(torch.cat(parts) for parts in zip(*pieces))
    gathered, _ = NVFP4ShardedWeight(weight, WeightAmax(weight.device)).fsdp_post_all_gather(outputs, metadata,
                                                                                              torch.bfloat16)
    return gathered, pieces


def test_gathered_codes_are_the_whole_weights_for_both_layers():
    """The codes two and four ranks gather are the codes, block scales and decode scale each layer makes of the
    whole BF16 weight: the native layer's Nvfp4Codes and the emulated layer's values; the weight's maximum sits in
    the last rank's rows, so a rank's own amax would scale its rows otherwise."""
    generator = torch.Generator().manual_seed(7)
    weight = torch.randn(128, 96, generator=generator)
    weight[120, 50] = 11.0
    whole = weight.to(torch.bfloat16)
    native = nvfp4_torch.quantize_operand(whole, TILE, transpose=False, name="Fprop W")
    emulated = _quantize_operand(whole, TILE, transpose=False, compute_dtype=torch.bfloat16, rng=None, name="Fprop W")
    for shards in (2, 4):
        gathered, _ = _gathered(weight, shards)
        codes = gathered.nvfp4_codes()
        assert torch.equal(codes.codes(), native.codes())
        assert torch.equal(codes.scales.view(torch.uint8), native.scales.view(torch.uint8))
        assert torch.equal(codes.decode, native.decode)
        values = _gathered_operand(gathered, torch.bfloat16)
        assert torch.equal(values.values, emulated.values) and torch.equal(values.decode, emulated.decode)
        assert gathered.shape == weight.shape and gathered.dtype == torch.bfloat16
    _, own = _gathered(weight, 2, whole_amax=False)  # rank 0 scaled by its own, smaller amax
    assert not torch.equal(own[0][1], torch.cat([p[1] for p in _gathered(weight, 2)[1]])[:own[0][1].shape[0]])


def _args(data_cache):
    return tiny_overrides(data_cache, steps=4) + ["precision.backend=emulated", "train.micro_batch_size=1",
                                                  "train.global_batch_size=4", "checkpoint.every=2",
                                                  "parallel.reshard=per_micro_batch"]


@pytest.mark.distributed
def test_codes_train_as_bf16_gathers_do_and_resume(tmp_path, data_cache):
    args = _args(data_cache)
    plain = run_cli(args, tmp_path / "plain", nproc=2, timeout=600)
    assert plain.returncode == 0, plain.stderr[-3000:]
    codes = run_cli(args + ["parallel.gather_nvfp4_weights=true"], tmp_path / "codes", nproc=2, timeout=600)
    assert codes.returncode == 0, codes.stderr[-3000:]
    expected, got = losses_by_step(tmp_path / "plain"), losses_by_step(tmp_path / "codes")
    assert sorted(got) == [1, 2, 3, 4]
    assert got == expected  # bit for bit: the same codes, gathered rather than made
    assert "NVFP4 weights as their codes" in codes.stdout + codes.stderr
    assert "dequantized" not in codes.stderr  # every layer took the codes

    checkpoint = tmp_path / "codes" / "checkpoints" / "step_00000002"
    resumed = run_cli(args + ["parallel.gather_nvfp4_weights=true", f"checkpoint.resume={checkpoint}"],
                      tmp_path / "resumed", nproc=2, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    continued = losses_by_step(tmp_path / "resumed")
    assert {step: continued[step] for step in (3, 4)} == {step: got[step] for step in (3, 4)}


@pytest.mark.distributed
def test_codes_under_tensor_parallelism(tmp_path, data_cache):
    """tp 2 x dp 2: each tensor-parallel shard of a weight gathers its codes over dp with the whole weight's amax
    (the amax its layer reduces over tp)."""
    args = tiny_overrides(data_cache, steps=2) + [
        "precision.backend=emulated", "precision.gradient_stochastic_rounding=false", "train.micro_batch_size=1",
        "train.global_batch_size=4", "parallel.tp=2", "model.mamba_num_heads=32", "model.mamba_head_dim=4"]
    plain = run_cli(args, tmp_path / "plain", nproc=4, timeout=600)
    assert plain.returncode == 0, plain.stderr[-3000:]
    codes = run_cli(args + ["parallel.gather_nvfp4_weights=true"], tmp_path / "codes", nproc=4, timeout=600)
    assert codes.returncode == 0, codes.stderr[-3000:]
    assert "NVFP4 weights as their codes" in codes.stdout + codes.stderr
    assert "dequantized" not in codes.stderr  # every layer took the codes (a to_local() view keeps them)
    expected, got = losses_by_step(tmp_path / "plain"), losses_by_step(tmp_path / "codes")
    assert sorted(got) == [1, 2] and got == expected


def test_which_weights_travel_as_codes():
    """Block linears with NVFP4 16x16 weights, on a shard group of two or more ranks; not the LM head, not one
    rank's group (FSDP2 gathers nothing there); a non-finite weight gives an infinite amax (NaN does not vanish in
    the MAX), as the layers' own reduction does."""
    from test_tensor_parallel import build, precision_config, tp_config
    from trainer.nvfp4_weight_gather import refresh_weight_amaxes, wrap_nvfp4_weights

    precision = precision_config("nvfp4", backend="emulated", bf16_layers_at_start=0, bf16_layers_at_end=0,
                                 quantize_lm_head=True)
    assert wrap_nvfp4_weights(build(tp_config(), precision), 1) == []
    model = build(tp_config(), precision)
    wrapped = wrap_nvfp4_weights(model, 2)
    assert wrapped and model.lm_head not in wrapped
    assert all(isinstance(module.weight.data, NVFP4ShardedWeight) for module in wrapped)
    assert all(type(value) is torch.Tensor for value in model.state_dict().values())  # checkpoints stay plain
    with torch.no_grad():
        wrapped[0].weight._data[0, 0] = float("nan")
    refresh_weight_amaxes(wrapped, torch.float32)
    assert wrapped[0].weight._amax.value.item() == float("inf")
    assert all(torch.isfinite(module.weight._amax.value) for module in wrapped[1:])


def test_the_plan_does_not_depend_on_which_policy_was_planned_first():
    """What each rank quantizes per gather depends on the reshard policy and the accumulation, so they key the
    planner's caches: planning per_step after per_micro_batch gives what planning it alone gives."""
    from trainer.hardware import GPUS
    from trainer.planning import step_time
    from trainer.planning.layout import resolve_layout
    from test_planning_collectives import TINY, compose

    base = TINY + ["precision=nvfp4", "precision.backend=emulated", "precision.bf16_layers_at_start=0",
                   "precision.bf16_layers_at_end=1", "train.global_batch_size=16", "parallel.gather_nvfp4_weights=true",
                   "model.mamba_num_heads=32", "model.mamba_head_dim=4"]

    def quantization(reshard):
        cfg = compose(base + [f"parallel.reshard={reshard}"])
        layout = resolve_layout(cfg, GPUS["H200"], 4)
        return step_time.plan_step_time(cfg.model, layout).parts["quantization"]

    alone = {}
    for reshard in ("per_step", "per_micro_batch"):
        step_time._MICRO_CACHE.clear()
        alone[reshard] = quantization(reshard)
    assert alone["per_step"] != alone["per_micro_batch"]
    step_time._MICRO_CACHE.clear()
    assert [quantization("per_micro_batch"), quantization("per_step")] == [alone["per_micro_batch"], alone["per_step"]]


def _compiled_worker(rank: int, world: int, out_dir: str) -> None:
    """Two ranks, the blocks compiled (aot_eager: Dynamo and AOTAutograd, no code generation), with and without
    the codes gathered: every parameter's gradient."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from test_tensor_parallel import build, precision_config, tp_config
    from trainer.config import ParallelConfig
    from trainer.distributed import DistEnv, apply_fsdp
    from trainer.nvfp4_weight_gather import install_amax_refresh, wrap_nvfp4_weights

    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp_shard",))
    precision = precision_config("nvfp4", backend="emulated", bf16_layers_at_start=0, bf16_layers_at_end=0,
                                 gradient_stochastic_rounding=False)
    ids = torch.randint(0, tp_config().vocab_size, (world, 64), generator=torch.Generator().manual_seed(3))
    grads = {}
    for codes in (False, True):
        model = build(tp_config(), precision)
        wrapped = wrap_nvfp4_weights(model, world) if codes else []
        for block in model.layers:
            block.compile(backend="aot_eager")
        env = DistEnv(rank=rank, local_rank=rank, world_size=world, device=torch.device("cpu"), mesh=mesh, tp=1)
        apply_fsdp(model, env, ParallelConfig(reduce_dtype="float32"), torch.float32)
        install_amax_refresh(model, wrapped, torch.float32)
        model(ids[rank:rank + 1]).float().logsumexp(-1).mean().backward()
        grads[codes] = {name: None if p.grad is None else p.grad.full_tensor() for name, p in model.named_parameters()}
        assert not codes or wrapped
    if rank == 0:
        torch.save(grads, f"{out_dir}/grads.pt")
    dist.barrier()


@pytest.mark.distributed
def test_compiled_blocks_pass_the_gathered_weights_gradients_on(tmp_path):
    """A compiled block would take a gathered weight apart into its codes and the weight would get no gradient;
    the quantized GEMMs of those layers run outside the graph (a graph break each), so every weight gets the
    gradient the compiled BF16-gathered run computes (to the graphs' other splits' rounding)."""
    from test_tensor_parallel import run_ranks

    run_ranks(_compiled_worker, 2, str(tmp_path))
    grads = torch.load(tmp_path / "grads.pt")
    assert all(grad is not None for grad in grads[True].values())
    for name, grad in grads[False].items():
        torch.testing.assert_close(grads[True][name], grad, rtol=1e-5, atol=1e-7, msg=name)
