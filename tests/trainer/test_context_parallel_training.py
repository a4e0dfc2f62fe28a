"""Context parallelism through the trainer (torchrun, gloo, CPU processes): each rank trains on its piece of every
sequence (the loader reads the piece), the mixers pass what crosses a piece boundary (models/context_parallel.py)
and FSDP2 reduces over dp_shard x cp, so the losses are the ones one process trains on the same batches; a
checkpoint saved at cp 2 resumes in one process with the losses the cp 2 run went on to.

BF16 here: NVFP4's per-tensor scales of activations and gradients come from the amax of the rank's own tokens
under context parallelism, as under data parallelism, so a quantized run matches one process only up to that.
The ops themselves against one process, layer by layer: tests/models/test_context_parallel.py."""

from __future__ import annotations

import pytest
import yaml

from trainer_testing import losses_by_step, read_jsonl, run_cli, tiny_overrides

BF16 = ["precision=bf16"]


@pytest.mark.distributed
def test_cp2_by_dp2_trains_as_one_process_and_resumes_at_cp1(tmp_path, data_cache):
    args = tiny_overrides(data_cache, steps=4) + BF16 + ["checkpoint.every=2", "train.eval_every=2"]
    context = run_cli(args + ["parallel.cp=2", "parallel.dp_shard=2"], tmp_path / "cp", nproc=4, timeout=600)
    assert context.returncode == 0, context.stderr[-3000:]
    # one micro-batch of the 4 sequences the 2 data-parallel ranks train, so the validation set (the same for any
    # micro-batch x data-parallel ranks of equal product) is theirs too
    single = run_cli(args + ["train.micro_batch_size=4"], tmp_path / "single", nproc=1)
    assert single.returncode == 0, single.stderr[-3000:]

    expected, split = losses_by_step(tmp_path / "single"), losses_by_step(tmp_path / "cp")
    assert sorted(split) == [1, 2, 3, 4]
    for step in split:  # the same batches and math; only the order of the sums differs
        assert split[step] == pytest.approx(expected[step], rel=1e-4), step
    validation = [[row["val_loss"] for row in read_jsonl(path / "metrics.jsonl") if "val_loss" in row]
                  for path in (tmp_path / "single", tmp_path / "cp")]
    assert len(validation[0]) == 2 and validation[1] == pytest.approx(validation[0], rel=1e-4)
    assert yaml.safe_load((tmp_path / "cp" / "config.yaml").read_text())["parallel"]["cp"] == 2

    checkpoint = tmp_path / "cp" / "checkpoints" / "step_00000002"
    resumed = run_cli(args + [f"checkpoint.resume={checkpoint}"], tmp_path / "resumed", nproc=1)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    continued = losses_by_step(tmp_path / "resumed")
    assert sorted(continued) == [3, 4]
    for step in (3, 4):
        assert continued[step] == pytest.approx(split[step], rel=1e-4), step


@pytest.mark.distributed
def test_tp2_by_cp2_trains_as_one_process(tmp_path, data_cache):
    """Both splits of the sequence at once (4 processes): tp 2 gathers each cp piece between the mixers, cp 2
    passes the Mamba states, conv halos and K/V between the pieces."""
    args = tiny_overrides(data_cache, steps=3) + BF16 + ["model.mamba_num_heads=32", "model.mamba_head_dim=4"]
    layered = run_cli(args + ["parallel.tp=2", "parallel.cp=2"], tmp_path / "tpcp", nproc=4, timeout=600)
    assert layered.returncode == 0, layered.stderr[-3000:]
    single = run_cli(args, tmp_path / "single", nproc=1)
    assert single.returncode == 0, single.stderr[-3000:]
    expected, split = losses_by_step(tmp_path / "single"), losses_by_step(tmp_path / "tpcp")
    assert sorted(split) == [1, 2, 3]
    for step in split:
        assert split[step] == pytest.approx(expected[step], rel=1e-4), step


@pytest.mark.distributed
def test_a_sequence_cp_cannot_split_is_refused_before_anything_runs(tmp_path, data_cache):
    args = tiny_overrides(data_cache, steps=1) + BF16 + ["parallel.cp=3"]
    refused = run_cli(args, tmp_path / "cp3", nproc=1, timeout=300)  # the config is checked before the world
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
    assert "parallel.cp=3: data.seq_len (64) is not divisible by the context-parallel degree" in refused.stderr
