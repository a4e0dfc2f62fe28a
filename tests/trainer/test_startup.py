"""The start-up stage (trainer/startup.py): parallel=auto's layout, the batch policy, FSDP in one process."""

from __future__ import annotations

import dataclasses
import json

import pytest

from trainer.loop import train
from trainer.startup import start_run
from trainer.validate import ConfigError
from trainer_testing import compose_train_config, losses_by_step, read_jsonl, tiny_overrides


def _world(monkeypatch, size: int) -> None:
    """The launch environment torchrun would set for rank 0 of ``size`` processes on one node."""
    monkeypatch.setenv("WORLD_SIZE", str(size))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(size))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")


def test_a_world_that_cannot_divide_the_batch_runs_the_nearest_one_announced(tmp_path, monkeypatch, data_cache):
    _world(monkeypatch, 3)
    cfg = compose_train_config(tiny_overrides(data_cache) + ["train.micro_batch_size=2", "train.global_batch_size=20",
                                                             "train.batch_tolerance=0.1", "parallel.fsdp=on"], tmp_path)
    settled = start_run(cfg)
    # 3 ranks x micro-batch 2 run multiples of 6: 18 and 24 are 2 (10%) and 4 away from 20
    assert settled.batch.adjusted and settled.cfg.train.global_batch_size == 18
    assert settled.batch.accumulation == 3
    assert "train.global_batch_size 20 -> 18" in settled.batch.announcement()
    assert settled.record()["batch"]["configured"] == 20


@pytest.mark.parametrize("policy, tolerance", [("exact", 0.05), ("nearest", 0.05)])
def test_a_batch_the_policy_refuses_names_the_fields_and_the_gpu_counts_that_run_it(tmp_path, monkeypatch, data_cache,
                                                                                    policy, tolerance):
    _world(monkeypatch, 3)
    cfg = compose_train_config(tiny_overrides(data_cache) + [
        "train.micro_batch_size=2", "train.global_batch_size=8", "parallel.fsdp=on",
        f"train.batch_policy={policy}", f"train.batch_tolerance={tolerance}"], tmp_path)
    with pytest.raises(ConfigError) as refused:
        start_run(cfg)
    message = str(refused.value)
    assert "train.global_batch_size (8)" in message and "\n" not in message
    assert "GPU counts that run 8 at micro-batch 2 and tp 1: 1, 2, 4" in message


def test_parallel_auto_picks_a_layout_records_it_and_trains(tmp_path, data_cache):
    cfg = compose_train_config(tiny_overrides(data_cache, steps=2) + ["parallel=auto", "parallel.compile=false",
                                                                      "parallel.device=cpu"], tmp_path)
    summary = train(cfg)
    assert summary["step"] == 2
    chosen = [e for e in read_jsonl(tmp_path / "events.jsonl") if e["event"] == "layout_chosen"]
    assert len(chosen) == 1 and chosen[0]["line"].startswith("parallel=auto on 1 x CPU")
    assert "parallel.auto=false" in chosen[0]["overrides"]
    info = json.loads((tmp_path / "run_info.json").read_text())
    assert info["start"]["auto"]["line"] == chosen[0]["line"]


def test_fsdp_in_one_plain_process_trains_as_without_fsdp(tmp_path, data_cache):
    """parallel.fsdp=on without torchrun runs on a process group of one, and computes what no FSDP does."""
    losses = {}
    for fsdp in ("on", "off"):
        run_dir = tmp_path / fsdp
        cfg = compose_train_config(tiny_overrides(data_cache, steps=3) + [f"parallel.fsdp={fsdp}", "precision=bf16"],
                                   run_dir)
        assert train(cfg)["step"] == 3
        losses[fsdp] = losses_by_step(run_dir)
    assert losses["on"].keys() == losses["off"].keys() == {1, 2, 3}
    for step in losses["on"]:
        assert losses["on"][step] == pytest.approx(losses["off"][step], rel=1e-5), step


def test_tensor_parallel_runs_the_projects_own_quantized_linears_not_transformer_engines():
    """The tensor-parallel pass shards the emulated and torch linears: precision.backend=te with tp > 1 is refused
    at start, auto never picks te under tp, and the planner keeps NVFP4 under tp on Blackwell native (torch's NVFP4
    scaled matmul) but not on Hopper, and FP8 on Hopper native (torch._scaled_mm)."""
    import torch

    from models.quant.recipe import resolve_backend
    from trainer.config import compose
    from trainer.hardware import GPUS
    from trainer.planning.layout import resolve_layout
    from trainer.validate import validate_train_config

    with pytest.raises(ConfigError, match="precision.backend=te with parallel.tp > 1"):
        validate_train_config(compose(["+experiment=nvfp4_12b", "parallel.tp=2", "precision.backend=te"]))
    nvfp4 = compose(["+experiment=nvfp4_12b"]).precision
    with pytest.raises(ValueError, match="not Transformer Engine's"):
        resolve_backend(dataclasses.replace(nvfp4, backend="te"), torch.device("cpu"), tensor_parallel=True)
    assert resolve_backend(nvfp4, torch.device("cpu"), tensor_parallel=True) == "emulated"

    def planned_backend(gpu: str, tp: int, *overrides: str) -> str:
        cfg = compose(["+experiment=nvfp4_12b", "parallel=fsdp_ac", f"parallel.tp={tp}", *overrides])
        return resolve_layout(cfg, GPUS[gpu], 64).backend

    assert planned_backend("B200", 1) == "native"
    assert planned_backend("B200", 2) == "native"
    assert planned_backend("H100", 2) == "emulated"
    # per-tensor FP8 (its in_proj shards need no 128-row tiles) stays native on Hopper under tp
    assert planned_backend("H100", 2, "precision.format=fp8_tensor") == "native"
