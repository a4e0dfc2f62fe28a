"""Tensor parallelism through the trainer (torchrun, gloo, 4 CPU processes): tp=2 x dp_shard=2 trains the
losses one process trains on the same batches, and its checkpoint resumes in one process (tp=1) with the
losses the tp=2 run went on to."""

from __future__ import annotations

import pytest

from trainer_testing import losses_by_step, read_jsonl, run_cli, tiny_overrides

# The tiny hybrid (M-M*M-) with 32 Mamba heads of 4, so every rank's share of in_proj holds whole NVFP4
# blocks; BF16 here (the sharded NVFP4 operands are bit-identical, tests/trainer/test_tensor_parallel.py).
TP_MODEL = ["model.mamba_num_heads=32", "model.mamba_head_dim=4", "precision=bf16"]


@pytest.mark.distributed
def test_tp2_by_dp2_trains_as_one_process_and_resumes_at_tp1(tmp_path, data_cache):
    args = tiny_overrides(data_cache, steps=4) + TP_MODEL + ["checkpoint.every=2"]
    tensor_parallel = run_cli(args + ["parallel.tp=2", "parallel.dp_shard=2"], tmp_path / "tp", nproc=4,
                              timeout=600)
    assert tensor_parallel.returncode == 0, tensor_parallel.stderr[-3000:]
    single = run_cli(args, tmp_path / "single", nproc=1)
    assert single.returncode == 0, single.stderr[-3000:]

    expected, sharded = losses_by_step(tmp_path / "single"), losses_by_step(tmp_path / "tp")
    assert sorted(sharded) == [1, 2, 3, 4]
    for step in sharded:  # the same batches and math; only the order of the sums differs
        assert sharded[step] == pytest.approx(expected[step], rel=1e-4), step

    checkpoint = tmp_path / "tp" / "checkpoints" / "step_00000002"
    resumed = run_cli(args + [f"checkpoint.resume={checkpoint}"], tmp_path / "resumed", nproc=1)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    continued = losses_by_step(tmp_path / "resumed")
    assert sorted(continued) == [3, 4]
    for step in (3, 4):
        assert continued[step] == pytest.approx(sharded[step], rel=1e-4), step
    changed = [e for e in read_jsonl(tmp_path / "resumed" / "events.jsonl") if e["event"] == "config_changed_on_resume"]
    assert changed and changed[0]["changes"]["world_size"] == [4, 1]


@pytest.mark.distributed
def test_tp_by_fsdp_by_hsdp_trains_as_one_process(tmp_path, data_cache):
    """The composition parallel=auto picks past 256 GPUs, tp x dp_shard x dp_replicate (2 x 2 x 2, 8 processes):
    FSDP2 over the 2-D (replicate, shard) mesh of DTensors already sharded over tp, the replicated norms'
    gradients summed over tp after HSDP's all-reduce, trains the losses of one process."""
    args = tiny_overrides(data_cache, steps=3) + TP_MODEL + ["train.micro_batch_size=1"]
    layered = run_cli(args + ["parallel.tp=2", "parallel.dp_shard=2", "parallel.dp_replicate=2"], tmp_path / "tp",
                      nproc=8, timeout=600)
    assert layered.returncode == 0, layered.stderr[-3000:]
    single = run_cli(args, tmp_path / "single", nproc=1)
    assert single.returncode == 0, single.stderr[-3000:]
    expected, sharded = losses_by_step(tmp_path / "single"), losses_by_step(tmp_path / "tp")
    assert sorted(sharded) == [1, 2, 3]
    for step in sharded:
        assert sharded[step] == pytest.approx(expected[step], rel=1e-4), step


@pytest.mark.distributed
@pytest.mark.slow
def test_tp2_with_compiled_blocks_trains_as_one_process(tmp_path, data_cache):
    """parallel=auto compiles the blocks and picks tp > 1 past 256 GPUs: the compiled tensor-parallel blocks
    (their sequence gathers and scatters inside the compiled region), the vocab-parallel LM head and loss train
    and evaluate what one uncompiled process does on the same batches."""
    args = tiny_overrides(data_cache, steps=3) + TP_MODEL + ["train.eval_every=3"]
    compiled = run_cli(args + ["parallel.tp=2", "parallel.compile=true"], tmp_path / "tp", nproc=2, timeout=900)
    assert compiled.returncode == 0, compiled.stderr[-3000:]
    single = run_cli(args, tmp_path / "single", nproc=1)
    assert single.returncode == 0, single.stderr[-3000:]
    expected, sharded = losses_by_step(tmp_path / "single"), losses_by_step(tmp_path / "tp")
    assert sorted(sharded) == [1, 2, 3]
    for step in sharded:
        assert sharded[step] == pytest.approx(expected[step], rel=1e-5), step
    validation = [[row["val_loss"] for row in read_jsonl(path / "metrics.jsonl") if "val_loss" in row]
                  for path in (tmp_path / "single", tmp_path / "tp")]
    assert validation[0] and validation[1] == pytest.approx(validation[0], rel=1e-5)
