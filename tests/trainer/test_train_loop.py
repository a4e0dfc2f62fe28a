"""The training loop in one process: metrics, learning, NaN guard, late precision switch, CLI."""

from __future__ import annotations

import math

import torch

from trainer.loop import Callback, train
from trainer_testing import compose_train_config, read_jsonl, run_cli, tiny_overrides

REQUIRED_METRICS = ("step", "tokens", "loss", "lr", "grad_norm", "tokens_per_s")


def test_entry_point_trains_and_writes_metrics(tmp_path, data_cache):
    result = run_cli(tiny_overrides(data_cache, steps=5) + ["train.eval_every=5"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = read_jsonl(tmp_path / "metrics.jsonl")
    assert [line["step"] for line in lines] == [1, 2, 3, 4, 5]
    for line in lines:
        for key in REQUIRED_METRICS:
            assert key in line and line[key] is not None, (key, line)
        assert line["tokens"] == line["step"] * 4 * 64
    assert math.isfinite(lines[-1]["val_loss"])
    plan = (tmp_path / "precision_plan.txt").read_text()
    assert "nvfp4" in plan and "layers.5.mixer.down_proj" in plan  # the last block: BF16
    assert (tmp_path / "checkpoints" / "step_00000005" / ".metadata").exists()


def test_loss_falls(tmp_path, data_cache):
    cfg = compose_train_config(tiny_overrides(data_cache, steps=60) + ["logging.log_every=10"], tmp_path)
    summary = train(cfg)
    first, last = summary["losses"][0], sum(summary["losses"][-5:]) / 5
    assert last < 0.85 * first, (first, last)  # ln(512) = 6.24 at the start


class PoisonGradient(Callback):
    """Make one gradient NaN after the backward of a chosen step."""

    def __init__(self, at_step: int):
        self.at_step = at_step

    def on_after_backward(self, ctx):
        if ctx.state.step == self.at_step:
            next(p for p in ctx.model.parameters() if p.grad is not None).grad.fill_(float("nan"))


def test_nan_gradient_skips_the_step_and_training_continues(tmp_path, data_cache):
    cfg = compose_train_config(tiny_overrides(data_cache, steps=6), tmp_path)
    before = {}

    class Snapshot(Callback):
        def on_after_backward(self, ctx):
            if ctx.state.step == 2:
                before.update({n: p.detach().clone() for n, p in ctx.model.named_parameters()})

        def on_step_end(self, ctx, metrics):
            if ctx.state.step == 3:  # the skipped update left every parameter as it was
                for name, param in ctx.model.named_parameters():
                    assert torch.equal(param, before[name]), name

    summary = train(cfg, callbacks=[Snapshot(), PoisonGradient(at_step=2)])
    assert summary["status"] == "completed" and summary["step"] == 6
    assert summary["skipped_steps"] == 1
    events = [e for e in read_jsonl(tmp_path / "events.jsonl") if e["event"] == "skipped_step"]
    assert len(events) == 1 and events[0]["step"] == 2
    assert all(math.isfinite(loss) for loss in summary["losses"][3:])
    assert read_jsonl(tmp_path / "metrics.jsonl")[-1]["skipped_steps"] == 1


def test_repeated_nan_halts_with_a_checkpoint(tmp_path, data_cache):
    import pytest

    from trainer.guards import NonFiniteHalt

    cfg = compose_train_config(tiny_overrides(data_cache, steps=10) + ["train.max_consecutive_skips=2"], tmp_path)
    with pytest.raises(NonFiniteHalt, match="consecutive"):
        train(cfg, callbacks=[PoisonGradient(at_step=3), PoisonGradient(at_step=4)])
    assert (tmp_path / "checkpoints" / "step_00000005" / "trainer_state.json").exists()


def test_late_switch_to_bf16(tmp_path, data_cache):
    overrides = tiny_overrides(data_cache, steps=6) + ["precision.switch_to_bf16_at_step=3",
                                                        "precision.switch_mode=forward_backward"]
    cfg = compose_train_config(overrides, tmp_path)
    specs = {}

    class Inspect(Callback):
        def on_step_end(self, ctx, metrics):
            module = ctx.model.get_submodule("layers.0.mixer.in_proj")
            specs[ctx.state.step] = (module.spec.fprop, module.spec.dgrad, module.spec.wgrad)

    summary = train(cfg, callbacks=[Inspect()])
    switches = [e for e in read_jsonl(tmp_path / "events.jsonl") if e["event"] == "precision_switch"]
    assert len(switches) == 1 and switches[0]["step"] == 3 and switches[0]["mode"] == "forward_backward"
    assert all(gemm is not None for gemm in specs[3])  # step index 2 ran quantized
    assert all(gemm is None for gemm in specs[4])  # from step index 3 on: every GEMM high precision
    assert all(math.isfinite(loss) for loss in summary["losses"])
    assert summary["plan"]["switched_to_bf16"]


def test_quantization_diagnostics_every_n_steps(tmp_path, data_cache):
    cfg = compose_train_config(tiny_overrides(data_cache, steps=4) + ["logging.quant_diagnostics_every=2"], tmp_path)
    summary = train(cfg)
    lines = read_jsonl(tmp_path / "quant_diagnostics.jsonl")
    assert [line["step"] for line in lines] == [2, 4]
    quantized = {name for name, fmt in summary["plan"]["flop_share_by_format"].items()}
    assert "nvfp4" in quantized
    layers = {record["layer"] for record in lines[0]["records"]}
    assert "layers.0.mixer.in_proj" in layers and "layers.5.mixer.down_proj" not in layers  # the BF16 block
    operands = {(r["gemm"], r["operand"]) for r in lines[0]["records"] if r["layer"] == "layers.0.mixer.in_proj"}
    assert operands == {("fprop", "X"), ("fprop", "W"), ("dgrad", "dY"), ("wgrad", "dY^T"), ("wgrad", "X^T")}
    for record in lines[0]["records"]:
        assert 0 < record["rel_error"] < 0.5 and 0 <= record["flushed_to_zero"] <= 1
    assert sum(e["event"] == "quant_diagnostics" for e in read_jsonl(tmp_path / "events.jsonl")) == 2


def test_wandb_offline_run_is_written_locally(tmp_path, data_cache):
    overrides = [o for o in tiny_overrides(data_cache, steps=3) if not o.startswith("logging.wandb")]
    result = run_cli(overrides + ["logging.wandb.mode=offline"], tmp_path, env={"WANDB_SILENT": "true"})
    assert result.returncode == 0, result.stderr[-3000:]
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and any(runs[0].glob("*.wandb"))
    assert (tmp_path / "wandb_run_id.txt").read_text().strip() in runs[0].name
