"""The precision study (results/study/study.yaml): every run composes, the runs of a size share what they
must, seeds change only the seeds, and each ablation changes exactly the intended GEMM operands of the
precision plan and nothing else."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch

from models import build_model
from models.quant.recipe import GEMMS, linear_spec, plan_layers
from study.definition import load_study
from trainer.config import TrainConfig, compose
from trainer.validate import validate_train_config

REPOSITORY = Path(__file__).resolve().parents[2]
STUDY = load_study(REPOSITORY / "results" / "study" / "study.yaml")
SIZE = "9m"
"""The size every arm runs at (the others run bf16, nvfp4 and fp8)."""


def compose_run(arm: str, seed: int = 0, size: str = SIZE) -> TrainConfig:
    (run,) = STUDY.select([f"{size}/{arm}/seed{seed}"])
    return compose(run.trainer_arguments())


@pytest.fixture(scope="module")
def configs() -> dict[str, TrainConfig]:
    return {arm: compose_run(arm) for arm in STUDY.arms}


@pytest.fixture(scope="module")
def study_model():
    with torch.device("meta"):
        return build_model(compose_run("bf16").model)


def operand_table(cfg: TrainConfig, model) -> dict:
    """{(layer, gemm, operand): (format, tile, rounding, rht, four_over_six)} of every quantized GEMM operand."""
    table = {}
    for layer in plan_layers(model, cfg.precision):
        if not layer.quantized:
            continue
        spec = linear_spec(cfg.precision, layer)
        for gemm in GEMMS:
            gemm_spec = getattr(spec, gemm)
            if gemm_spec is None:
                continue
            for operand in ("a", "b"):
                o = getattr(gemm_spec, operand)
                table[(layer.name, gemm, operand)] = (o.fmt, o.tile, o.rounding, o.rht, o.four_over_six)
    return table


def without(config: TrainConfig, *paths: str) -> dict:
    """The config as a dict with the given dotted fields removed (to compare everything else)."""
    value = dataclasses.asdict(config)
    for path in paths:
        *parents, leaf = path.split(".")
        node = value
        for parent in parents:
            node = node[parent]
        node.pop(leaf)
    return value


def test_every_run_passes_the_start_up_validation():
    for run in STUDY.runs():
        validate_train_config(compose(run.trainer_arguments()))


def test_every_run_of_a_size_shares_model_data_schedule_and_budget(configs):
    reference = configs[STUDY.reference]
    assert reference.model.name == "study" and reference.data.sources[0].kind == "tree"
    for name, cfg in configs.items():
        for part in ("model", "data", "optim", "train", "parallel", "checkpoint"):
            assert getattr(cfg, part) == getattr(reference, part), (name, part)
        assert cfg.seed == 0 and cfg.precision.seed == 0, name


def test_a_seed_changes_the_initialization_and_rounding_seeds_only():
    for seed in STUDY.seeds[1:]:
        for arm in ("bf16", "nvfp4"):
            cfg, base = compose_run(arm, seed), compose_run(arm, 0)
            assert (cfg.seed, cfg.precision.seed) == (seed, seed)
            assert cfg.data.seed == base.data.seed  # the data order stays: arms of one seed see the same batches
            assert without(cfg, "seed", "precision.seed") == without(base, "seed", "precision.seed")


def test_model_dims_fit_every_format(study_model):
    for name, module in study_model.named_modules():
        if isinstance(module, torch.nn.Linear):
            assert module.in_features % 128 == 0 and module.out_features % 128 == 0, name


def test_nvfp4_fp8_and_bf16_differ_only_in_precision(configs):
    for name in ("fp8", "nvfp4"):
        assert without(configs[name], "precision") == without(configs["bf16"], "precision")


def test_fp8_and_nvfp4_quantize_the_same_layers(configs, study_model):
    fp8 = {key[0] for key in operand_table(configs["fp8"], study_model)}
    nvfp4 = {key[0] for key in operand_table(configs["nvfp4"], study_model)}
    assert fp8 == nvfp4 and len(nvfp4) > 0


def changed_operands(configs, model, name) -> dict:
    base, ablation = operand_table(configs["nvfp4"], model), operand_table(configs[name], model)
    assert set(ablation) >= set(base) if name == "nvfp4_all_layers" else set(ablation) == set(base), name
    return {key: (base.get(key), ablation[key]) for key in ablation if base.get(key) != ablation[key]}


def test_no_rht_changes_only_the_wgrad_transform(configs, study_model):
    changed = changed_operands(configs, study_model, "nvfp4_no_rht")
    assert changed and all(gemm == "wgrad" for _, gemm, _ in changed)
    for before, after in changed.values():
        assert before[:3] == after[:3] and (before[3], after[3]) == (True, False)
    assert without(configs["nvfp4_no_rht"], "precision.wgrad_rht") == without(configs["nvfp4"], "precision.wgrad_rht")


def test_no_sr_changes_only_the_gradient_rounding(configs, study_model):
    changed = changed_operands(configs, study_model, "nvfp4_no_sr")
    # dY is operand a of Dgrad and Wgrad; nothing else was stochastic
    assert changed and {(gemm, operand) for _, gemm, operand in changed} == {("dgrad", "a"), ("wgrad", "a")}
    for before, after in changed.values():
        assert (before[2], after[2]) == ("stochastic", "nearest") and before[:2] + before[3:] == after[:2] + after[3:]


def test_no_2d_changes_only_the_weight_tiles(configs, study_model):
    changed = changed_operands(configs, study_model, "nvfp4_no_2d")
    assert changed and {(gemm, operand) for _, gemm, operand in changed} == {("fprop", "b"), ("dgrad", "b")}
    for before, after in changed.values():
        assert (before[1], after[1]) == ((16, 16), (1, 16)) and before[2:] == after[2:]


def test_all_layers_adds_exactly_the_bf16_blocks(configs, study_model):
    base = operand_table(configs["nvfp4"], study_model)
    every = operand_table(configs["nvfp4_all_layers"], study_model)
    assert changed_operands(configs, study_model, "nvfp4_all_layers") == {
        key: (None, value) for key, value in every.items() if key not in base}
    blocks = len(study_model.layers)
    added_blocks = {int(key[0].split(".")[1]) for key in every if key not in base}
    assert added_blocks == {0, blocks - 2, blocks - 1}
    assert not any(key[0] == "lm_head" for key in every)


def test_mxfp4_changes_the_format_and_keeps_the_recipe(configs, study_model):
    changed = changed_operands(configs, study_model, "mxfp4")
    assert set(changed) == set(operand_table(configs["nvfp4"], study_model))  # every operand
    for (layer, gemm, operand), (before, after) in changed.items():
        assert (before[0], after[0]) == ("nvfp4", "mxfp4")
        assert after[1] == (1, 32)  # OCP MX has no 2D weight blocks
        assert before[2:] == after[2:], (layer, gemm, operand)  # same rounding and RHT


def test_four_over_six_changes_only_the_block_scale_choice(configs, study_model):
    """Every operand of the quantized layers chooses its block scales by Four Over Six (MSE); format,
    tiles, rounding and RHT stay the recipe's, and the config differs in the format and name only."""
    changed = changed_operands(configs, study_model, "nvfp4_4over6")
    assert set(changed) == set(operand_table(configs["nvfp4"], study_model))  # every operand
    for before, after in changed.values():
        assert before[:4] == after[:4] and (before[4], after[4]) == (None, "mse")
    assert (without(configs["nvfp4_4over6"], "precision.format", "precision.name")
            == without(configs["nvfp4"], "precision.format", "precision.name"))


def test_ue5m3_changes_only_the_element_format(configs, study_model):
    """Every operand of the quantized layers takes UE5M3 block scales; tiles, rounding, RHT and Four Over Six
    stay the recipe's, and the config differs in the format and name only."""
    changed = changed_operands(configs, study_model, "nvfp4_ue5m3")
    assert set(changed) == set(operand_table(configs["nvfp4"], study_model))  # every operand
    for before, after in changed.values():
        assert (before[0], after[0]) == ("nvfp4", "nvfp4_ue5m3") and before[1:] == after[1:]
    assert (without(configs["nvfp4_ue5m3"], "precision.format", "precision.name")
            == without(configs["nvfp4"], "precision.format", "precision.name"))


def test_late_switch_keeps_the_plan_and_switches_at_80_percent(configs, study_model):
    assert changed_operands(configs, study_model, "nvfp4_late_bf16") == {}
    cfg = configs["nvfp4_late_bf16"]
    switch = cfg.precision.switch_to_bf16_at_step
    assert switch == int(0.8 * cfg.train.steps) and cfg.precision.switch_mode == "forward"
    assert (without(cfg, "precision.switch_to_bf16_at_step")
            == without(configs["nvfp4"], "precision.switch_to_bf16_at_step"))


def test_the_size_axis_keeps_the_pattern_and_the_budget_rules():
    """Every size: the study's block pattern, 10 tokens per parameter (steps rounded up to a multiple of 20),
    <= 4 epochs of the corpus, every linear dim a multiple of 128, FP8 and NVFP4 quantizing the same layers,
    the learning rate 2e-3 x 256 / hidden (min_lr = lr / 100), warm-up 2% of the steps rounded up to 10,
    evaluation every 5%; at least four sizes, the largest >= 8x the smallest; arms of one size differ only
    in precision."""
    from models.flops import count_parameters

    import json

    # the study corpus's training split as prepared on the GPU machine, recorded by every run
    record = json.loads((STUDY.results / SIZE / STUDY.reference / "seed0" / "run.json").read_text())
    corpus_tokens = record["corpus"]["tokens"]["train"]
    parameters = {}
    for size in STUDY.sizes:
        cfg = compose_run("bf16", size=size)
        assert cfg.model.pattern == compose_run("bf16").model.pattern
        parameters[size] = count_parameters(cfg.model)
        step_tokens = cfg.train.global_batch_size * cfg.data.seq_len
        tokens = cfg.train.steps * step_tokens
        assert cfg.train.steps == 20 * math.ceil(10 * parameters[size] / step_tokens / 20), size
        assert tokens >= 10 * parameters[size] and tokens <= 4 * corpus_tokens, size
        assert cfg.optim.lr == pytest.approx(2e-3 * 256 / cfg.model.hidden_size, rel=1e-3), size
        assert cfg.optim.min_lr == pytest.approx(cfg.optim.lr / 100, rel=1e-3), size
        assert cfg.optim.warmup_steps == 10 * math.ceil(0.02 * cfg.train.steps / 10), size
        assert cfg.train.eval_every * 20 == cfg.train.steps, size
        with torch.device("meta"):
            model = build_model(cfg.model)
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear):
                assert module.in_features % 128 == 0 and module.out_features % 128 == 0, (size, name)
        arms = [run.arm for run in STUDY.runs() if run.size == size and run.seed == 0]
        assert {"bf16", "fp8", "nvfp4"} <= set(arms), size
        fp8, nvfp4 = compose_run("fp8", size=size), compose_run("nvfp4", size=size)
        for arm_cfg in (fp8, nvfp4):
            assert without(arm_cfg, "precision") == without(cfg, "precision")
        quantized = {name: {key[0] for key in operand_table(c, model)} for name, c in (("fp8", fp8), ("nvfp4", nvfp4))}
        assert quantized["fp8"] == quantized["nvfp4"] and quantized["nvfp4"], size
        blocks = len(model.layers)  # the first block and the last two stay BF16, as at every size
        assert {int(layer.split(".")[1]) for layer in quantized["nvfp4"]} == set(range(1, blocks - 2)), size
    assert len(parameters) >= 4 and max(parameters.values()) >= 8 * min(parameters.values())

