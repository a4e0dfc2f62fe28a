"""The preflight plans every run before anything is built; user errors end with one message and exit status 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import trainer.loop
from trainer.preflight import PreflightError
from trainer.validate import ConfigError
from trainer_testing import ROOT, compose_train_config, read_jsonl, run_cli, tiny_overrides


def _must_not_start(*args, **kwargs):
    raise AssertionError("the run started: the preflight did not stop it first")


def test_an_oversized_run_is_refused_before_anything_is_built(tmp_path, data_cache, monkeypatch):
    """The tiny model's plan needs ~0.09 GiB; stated 0.02 GiB per device, the run stops with the table."""
    cfg = compose_train_config(tiny_overrides(data_cache) + ["train.preflight_memory_gib=0.02"], tmp_path / "run")
    monkeypatch.setattr(trainer.loop, "init_distributed", _must_not_start)
    monkeypatch.setattr(trainer.loop, "build_model_on", _must_not_start)
    with pytest.raises(PreflightError) as refused:
        trainer.loop.train(cfg)
    message = str(refused.value)
    assert "the run does not fit" in message and "usable of 0.0 GiB" in message
    for part in ("master weights (fp32)", "optimizer states (AdamW, fp32)", "activations", "peak per device"):
        assert part in message
    assert "train.preflight=false" in message
    assert not (tmp_path / "run").exists()


def test_preflight_false_skips_the_check(tmp_path, data_cache):
    cfg = compose_train_config(tiny_overrides(data_cache, steps=2) + ["train.preflight_memory_gib=0.02",
                                                                      "train.preflight=false"], tmp_path / "run")
    assert trainer.loop.train(cfg)["status"] == "completed"
    assert json.loads((tmp_path / "run" / "run_info.json").read_text())["plan"] is None


def test_the_plan_is_in_run_info_and_the_run_checks_it(tmp_path, data_cache):
    cfg = compose_train_config(tiny_overrides(data_cache, steps=4), tmp_path / "run")
    assert trainer.loop.train(cfg)["status"] == "completed"
    plan = json.loads((tmp_path / "run" / "run_info.json").read_text())["plan"]
    assert plan["gpu"] == "CPU" and plan["fits"] and plan["params"] > 0
    assert plan["layout"]["gradient_accumulation"] == 2 and plan["layout"]["micro_batch"] == 2
    assert plan["peak_memory_gib_per_gpu"] == pytest.approx(sum(plan["memory_gib_per_gpu"].values()))
    checks = [e for e in read_jsonl(tmp_path / "run" / "events.jsonl") if e["event"] == "plan_check"]
    assert len(checks) == 1 and checks[0]["step"] == 2  # the second metrics line
    check = checks[0]
    assert check["planned_step_time_s"] == pytest.approx(plan["step_time_s"])
    assert check["measured_step_time_s"] > 0 and check["measured_peak_memory_gib"] > 0
    assert check["step_time_ratio"] == pytest.approx(check["measured_step_time_s"] / check["planned_step_time_s"])


def test_paper_experiments_refuse_the_builtin_corpus(tmp_path, data_cache, monkeypatch):
    cfg = compose_train_config(["+experiment=nvfp4_12b", *tiny_overrides(data_cache),
                                "parallel=data_parallel", "parallel.compile=false", "precision.keep_indivisible_in_bf16=true",
                                "data.seq_len=64"], tmp_path / "run")
    monkeypatch.setattr(trainer.loop, "init_distributed", _must_not_start)
    with pytest.raises(ConfigError, match="data.prepared_dir is not set: experiment 'test' trains on a corpus of "
                                          "~10T tokens prepared with `python -m trainer.prepare_data`"):
        trainer.loop.train(cfg)


def _cli(args, env=None, timeout=240):
    return subprocess.run([sys.executable, "-m", "trainer", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, **(env or {})))


def test_the_12b_on_this_machine_stops_at_once_with_what_it_needs_and_what_would_fit(tmp_path):
    result = _cli(["+experiment=nvfp4_12b", f"run_dir={tmp_path / 'run'}"])
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    first = result.stderr.splitlines()[0]
    assert first.startswith("PreflightError: the run does not fit: hybrid_12b (12.31B parameters) needs ")
    assert "GiB per device" in first
    assert "What would fit:" in result.stderr and " x H200: " in result.stderr and " x B200: " in result.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_user_errors_exit_2_without_a_traceback_unless_hydra_full_error(tmp_path, data_cache):
    args = tiny_overrides(data_cache) + ["train.global_batch_size=6", "train.micro_batch_size=4"]
    result = run_cli(args, tmp_path / "run")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "ConfigError: train.global_batch_size (6) must be a multiple of train.micro_batch_size (4)" in result.stderr
    shown = run_cli(args, tmp_path / "run", env={"HYDRA_FULL_ERROR": "1"})
    assert shown.returncode != 0 and "Traceback" in shown.stderr
    missing = run_cli(tiny_overrides(data_cache) + [f"checkpoint.resume={tmp_path / 'nowhere'}"], tmp_path / "run2")
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert "is not a checkpoint directory" in missing.stderr.splitlines()[-1]
