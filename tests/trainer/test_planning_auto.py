"""parallel=auto (trainer.planning.auto) and `python -m trainer.plan_run`: the choice, its speed, the issue's goal,
the CLI."""

from __future__ import annotations

import json
import time

import pytest

from trainer.config import compose
from trainer.hardware import GPUS, cpu_spec, host_memory_gib
from trainer.planning import plan_run
from trainer.planning.auto import TIE_TOLERANCE, checkpoint_options, choose_layout, explicit_vs_auto, mesh_options
from trainer.planning.plan import format_count, format_duration
from trainer.validate import ConfigError

AUTO_12B = ["+experiment=nvfp4_12b", "parallel=auto"]


def auto_12b(gpus: int, gpu: str = "B200"):
    return choose_layout(compose(AUTO_12B), GPUS[gpu], gpus, token_budget=10e12)


def test_the_search_space():
    assert checkpoint_options("M-M*-") == ["none", "M", "*", "-", "M*", "M-", "*-", "full"]
    assert checkpoint_options("M-M-") == ["none", "M", "-", "full"]
    assert mesh_options(8) == [(8, 1), (4, 2), (2, 4), (1, 8)]


def test_the_choice_is_plan_run_of_the_chosen_config_and_fits():
    choice = auto_12b(64)
    again = plan_run(choice.config, GPUS["B200"], 64, token_budget=10e12)
    assert choice.fits and choice.config.parallel.auto
    assert again.step_time_s == choice.plan.step_time_s and again.peak_memory_gib == choice.plan.peak_memory_gib
    # A runner-up is slower, or within the tie tolerance and lost on the preferences (float32 reduction here).
    assert all(plan.seconds_per_token >= choice.plan.seconds_per_token * (1 - TIE_TOLERANCE) for plan in choice.runners_up)
    assert "parallel.auto=false" in choice.overrides()
    assert f"parallel.dp_shard={choice.config.parallel.dp_shard}" in choice.overrides() and "parallel.cp=1" in choice.overrides()
    line = choice.line()
    assert line.startswith("parallel=auto on 64 x B200: ") and "MFU" in line and "\n" not in line


def test_the_configured_batch_wins_a_tie_and_8_gpus_run_736():
    choice = auto_12b(8)
    assert choice.plan.layout.global_batch == 736 and not choice.plan.layout.batch.adjusted


def test_auto_is_fast_enough_for_every_start():
    """The 12B at 2048 GPUs: about a second on a 2-core CPU (the precision plan cached, the combinations pruned)."""
    started = time.perf_counter()
    auto_12b(2048)
    assert time.perf_counter() - started < 10


def test_an_explicit_layout_says_how_much_slower_it_is_than_auto():
    fixed = compose(["+experiment=nvfp4_12b", "parallel=fsdp_ac"])
    choice, slower = explicit_vs_auto(fixed, GPUS["B200"], 64)
    assert choice.fits and slower > 0.25  # flat FSDP over InfiniBand, gathering twice per micro-batch


def test_nothing_fits_returns_the_leanest_plan_and_a_batch_no_layout_runs_is_refused():
    one = choose_layout(compose(AUTO_12B), GPUS["H100"], 1)
    assert not one.fits and one.plan.peak_memory_gib > one.plan.usable_memory_gib
    with pytest.raises(ConfigError, match=r"parallel=auto: no micro-batch at parallel.tp in \[1, 2, 4, 8\]"):
        choose_layout(compose(AUTO_12B + ["train.batch_tolerance=0.0"]), GPUS["B200"], 2048)


# The scaling goal: the 12B (and the 8B) in NVFP4 on B200 with parallel=auto at >= 90% of its 8-GPU MFU at 64 and
# 256 GPUs, >= 80% at 1024 and 2048. The planner (honest, not tuned to it) meets it at 64, 256 and 1024 for both;
# at 2048 (3,072 tokens a GPU a step) tp 2 x cp 4 still waits for the FSDP calls at the step's ends (the
# embedding's and the head's, 671 MB each), attention's uneven causal load over the cp pieces and the work per
# weight: docs/planning.md, "The 12B on B200: the scaling goal".
GOAL = {64: 0.90, 256: 0.90, 1024: 0.80, 2048: 0.80}
NOT_MET = {("nvfp4_12b", 2048): "plans 70.7% of the 8-GPU MFU (tp 4 x cp 2)",
           ("nvfp4_8b", 2048): "plans 69.5% of the 8-GPU MFU (tp 2 x cp 4)"}


def auto_b200(experiment: str, gpus: int):
    return choose_layout(compose([f"+experiment={experiment}", "parallel=auto"]), GPUS["B200"], gpus,
                         token_budget=10e12)


@pytest.mark.parametrize("experiment", ["nvfp4_12b", "nvfp4_8b"])
@pytest.mark.parametrize("gpus", sorted(GOAL))
def test_the_goal(experiment, gpus, request):
    if (experiment, gpus) in NOT_MET:
        request.applymarker(pytest.mark.xfail(strict=True, reason=f"not met by the honest model: "
                                                                  f"{NOT_MET[(experiment, gpus)]}"))
    assert auto_b200(experiment, gpus).plan.mfu >= GOAL[gpus] * auto_b200(experiment, 8).plan.mfu


# ---------------------------------------------------------------------------- python -m trainer.plan_run
def plan_run_script():
    import trainer.plan_run

    return trainer.plan_run


def cli(capsys, *argv):
    status = plan_run_script().main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


@pytest.mark.parametrize("gpus", [8, 64, 128, 256, 1024, 2048])
def test_plan_run_prints_a_layout_that_fits_for_the_12b_on_b200(capsys, gpus):
    status, out, _ = cli(capsys, "+experiment=nvfp4_12b", "parallel=auto", "--gpu", "B200", "--gpus", str(gpus))
    assert status == 0
    first = out.splitlines()[0]
    assert first.startswith(f"parallel=auto on {gpus} x B200: ") and "MFU" in first and "NOT fit" not in first
    assert "Fits: yes" in out and "Cost: " in out and "GPU-hours" in out
    assert "Start it: " in out


@pytest.mark.parametrize("argv, message", [
    (["+experiment=quickstart", "optim.lr=-1e-3"], "ConfigError: optim.lr must be a finite number > 0, got -0.001"),
    (["+experiment=quickstart", "train.steps=0"], "ConfigError: train.steps must be a positive integer, got 0"),
    (["+experiment=quickstart", "+train.micro_btach_size=2"],
     "Error in override '+train.micro_btach_size=2':\nUnknown config key 'train.micro_btach_size'"),
    (["+experiment=quickstart", "--tokens", "nan"], "ConfigError: --tokens must be a finite number > 0, got nan"),
    (["+experiment=quickstart", "--tokens", "-5"], "ConfigError: --tokens must be a finite number > 0, got -5.0"),
    (["+experiment=quickstart", "--gpus", "0"], "ConfigError: --gpus must be a positive integer, got 0"),
    (["+experiment=nvfp4_12b", "parallel=hsdp", "train.batch_policy=exact", "--gpu", "B200", "--gpus", "64"],
     "ConfigError: train.global_batch_size (736) must be a multiple of"),
])
def test_plan_run_refuses_what_the_trainer_refuses_in_one_line(capsys, argv, message):
    status, out, err = cli(capsys, *argv)
    assert status == 2 and out == ""
    # one line; a misspelt key gets the trainer's three: the override, the key, the valid keys there
    assert err.startswith(message) and err.count("\n") == (3 if message.startswith("Error in override") else 1)


def test_plan_run_json(capsys):
    status, out, _ = cli(capsys, "+experiment=nvfp4_12b", "parallel=auto", "--gpu", "B200", "--gpus", "64",
                         "--tokens", "10e12", "--gpu-hour-price", "3", "--json")
    plan = json.loads(out)
    assert status == 0 and plan["schema_version"] == 2
    assert (plan["model"], plan["precision"], plan["gpus"]) == ("hybrid_12b", "nvfp4", 64)
    assert {"tp", "shard", "replicate", "reshard", "grad_reduce", "reduce_dtype"} <= set(plan["layout"])
    assert plan["batch"] == {"configured": 736, "global_batch": 768, "adjusted": True, "policy": "nearest",
                             "micro_batch": plan["layout"]["micro_batch"],
                             "accumulation": plan["layout"]["gradient_accumulation"]}
    ops = {c["op"] for c in plan["collectives"]}
    assert ops == {"all_gather", "reduce_scatter", "all_reduce"}
    assert plan["auto"]["overrides"][0] == "parallel.auto=false" and plan["gpu_hours"] > 0


def test_plan_run_explicit_layout_compares_with_auto_and_prints_runnable_suggestions(capsys):
    status, out, _ = cli(capsys, "+experiment=nvfp4_12b", "parallel=fsdp_ac", "--gpu", "B200", "--gpus", "64")
    assert status == 0 and "% slower than the layout parallel=auto picks" in out
    assert "python -m trainer.plan_run +experiment=nvfp4_12b parallel=auto --gpu B200 --gpus 64" in out
    status, out, _ = cli(capsys, "+experiment=nvfp4_12b", "parallel=fsdp_ac", "parallel.activation_checkpoint=none",
                         "--gpu", "H200", "--gpus", "8")
    assert status == 0 and "Fits: NO" in out
    suggestions = [line for line in out.splitlines() if "python -m trainer.plan_run" in line]
    assert any("parallel.activation_checkpoint=full --gpu H200 --gpus 8" in line for line in suggestions)


def test_a_study_size_plan_counts_start_up_compilation_and_evaluation_in_sensible_units(capsys):
    """The 9m NVFP4 study run on an H100: ~90 s of steps, plus start-up, compilation and 20 evaluations
    (docs/study.md: such a run took 274 s with another run beside it)."""
    status, out, _ = cli(capsys, "+experiment=study_nvfp4", "--gpu", "H100")
    assert status == 0
    assert "(9.2M parameters)" in out and "0.00B" not in out and "0.00 days" not in out
    plan = plan_run(compose(["+experiment=study_nvfp4"]), GPUS["H100"], 1)
    assert plan.overheads["compilation"] > 0 and plan.overheads["evaluation"] > 0
    assert 120 < plan.run_seconds < 400
    run_line = next(line for line in out.splitlines() if line.startswith("Run: "))
    assert " min " in run_line
    assert format_duration(45) == "45 s" and format_duration(200) == "3.3 min"
    assert format_duration(3 * 86400) == "3.0 days"
    assert format_count(9_200_000) == "9.2M" and format_count(12_310_001_152) == "12.31B"


def test_plan_run_on_the_cpu_shares_the_host_among_the_processes_as_the_preflight_does(capsys):
    status, out, _ = cli(capsys, "model=tiny", "train.micro_batch_size=4", "--gpu", "CPU", "--gpus", "2", "--json")
    share = cpu_spec(memory_gib=host_memory_gib() / 2)
    assert json.loads(out)["usable_memory_gib_per_gpu"] == pytest.approx(share.memory_gib * 0.95 - 2.0)
