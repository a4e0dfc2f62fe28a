"""User errors of the command line end in one line naming the culprit and exit status 2: a config that does not
compose (a duplicated YAML key, an interpolation that does not resolve), a sequence length NVFP4 cannot block.
`--help` says what the command does and where the docs are."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from trainer.config import compose
from trainer.validate import ConfigError, validate_train_config
from trainer_testing import ROOT, tiny_overrides


def _cli(args, cwd=ROOT, env=None):
    full_env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", **(env or {}))
    full_env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run([sys.executable, "-m", "trainer", *args], cwd=cwd, env=full_env, capture_output=True,
                          text=True, timeout=300)


def _one_line(result) -> str:
    assert result.returncode == 2, (result.returncode, result.stderr[-3000:])
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    return lines[0]


def test_a_duplicated_key_in_an_experiment_file_is_one_line_naming_the_file_and_line(tmp_path):
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "dup.yaml").write_text("# @package _global_\ntrain:\n  steps: 2\ntrain:\n  steps: 3\n")
    line = _one_line(_cli(["--config-dir", str(tmp_path), "+experiment=dup", f"run_dir={tmp_path / 'run'}"]))
    assert line == (f"Error in the config: {tmp_path / 'experiment' / 'dup.yaml'} line 4: found duplicate key train "
                    "(while constructing a mapping at line 2)")
    assert not (tmp_path / "run").exists()


def test_an_unset_environment_variable_in_run_dir_is_one_line_naming_it(tmp_path):
    line = _one_line(_cli(["run_dir=${oc.env:HYBRID_SURELY_UNSET_VARIABLE}"], cwd=tmp_path))
    assert line == ("Error in the config: KeyError raised while resolving interpolation: \"Environment variable "
                    "'HYBRID_SURELY_UNSET_VARIABLE' not found\" (key run_dir)")
    assert list(tmp_path.iterdir()) == []  # nothing written where it was started


def test_a_sequence_length_nvfp4_cannot_block_is_refused_at_start_naming_data_seq_len(tmp_path, data_cache):
    cfg = compose(tiny_overrides(data_cache) + ["data.seq_len=63"])
    with pytest.raises(ConfigError, match=r"^data\.seq_len=63: a micro-batch holds train\.micro_batch_size x "
                                          r"data\.seq_len = 2 x 63 = 126 tokens, not a multiple of 16, the nvfp4 block"):
        validate_train_config(cfg)
    validate_train_config(compose(tiny_overrides(data_cache) + ["data.seq_len=63", "train.micro_batch_size=16",
                                                                "train.global_batch_size=16"]))  # 1008 tokens: fine
    validate_train_config(compose(tiny_overrides(data_cache) + ["data.seq_len=63", "precision=bf16"]))  # nothing quantized
    line = _one_line(_cli([*tiny_overrides(data_cache), "data.seq_len=63", f"run_dir={tmp_path / 'run'}"]))
    assert line.startswith("ConfigError: data.seq_len=63: ") and not (tmp_path / "run").exists()


def test_help_says_what_the_command_does_and_where_the_docs_are():
    result = subprocess.run([sys.executable, "-m", "trainer", "--help"], cwd=ROOT, capture_output=True, text=True,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=120)
    assert result.returncode == 0
    assert result.stdout.startswith("python -m trainer: pretrain a hybrid Mamba-Transformer")
    assert "docs/reliability.md" in result.stdout and "powered by Hydra" not in result.stdout
    import importlib.util
    import re

    tools = set(re.findall(r"python -m ([\w.]+)", result.stdout)) - {"trainer"}
    assert {"trainer.prepare_data", "trainer.plan_run", "trainer.export_hf", "reports.compare_runs"} <= tools
    assert all(importlib.util.find_spec(tool) is not None for tool in tools), tools  # shipped modules, not scripts/
    assert "scripts/" not in result.stdout


def test_a_misspelt_prepared_dir_never_fills_with_the_builtin_corpus_under_a_data_requirement(tmp_path, data_cache):
    from trainer.validate import check_data_requirement

    misspelt = tmp_path / "shrads"
    base = ["+experiment=nvfp4_12b", *tiny_overrides(data_cache), "parallel=data_parallel", "data.seq_len=64"]
    cfg = compose([*base, f"data.prepared_dir={misspelt}"])
    with pytest.raises(ConfigError, match=rf"^data\.prepared_dir={misspelt}: data\.sources names the built-in corpus "
                                          rf"\(source 'builtin'; {misspelt}/builtin does not exist: the built-in corpus "
                                          r"would be prepared there\), and experiment 'nvfp4_12b' trains on a corpus"):
        check_data_requirement(cfg)
    line = _one_line(_cli([*base, f"data.prepared_dir={misspelt}", f"run_dir={tmp_path / 'run'}"]))
    assert line.startswith(f"ConfigError: data.prepared_dir={misspelt}: ")
    assert not misspelt.exists() and not (tmp_path / "run").exists()
    # the corpus it was prepared from, named as `python -m trainer.prepare_data` prepared it, passes
    check_data_requirement(compose([*base, "data=local_jsonl", f"data.sources.0.path={tmp_path / 'c.jsonl'}",
                                    f"data.prepared_dir={tmp_path / 'shards'}"]))


def test_a_start_the_preflight_refuses_leaves_no_directory_behind(tmp_path):
    result = _cli(["+experiment=nvfp4_12b"], cwd=tmp_path)  # far too large for this machine
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert list(tmp_path.iterdir()) == []  # no empty outputs/<date>/<time>/


@pytest.mark.parametrize("args, expected", [
    (["--config-dir", "{configs}", "+experiment=bad_indent"],
     "Error in the config: {configs}/experiment/bad_indent.yaml line 4: mapping values are not allowed here"),
    (["data=mixture_example"], "Error in the config: ValueError raised while resolving interpolation: data.tokenizer "
                               "must be set: the chosen config marks it required; give data.tokenizer=... on the "
                               "command line (key data.tokenizer)"),
    (["train.steps=abc"], "Error in the config: Error merging override train.steps=abc; Value 'abc' of type 'str' "
                          "could not be converted to Integer (key train.steps)"),
    (["+experiment=nvfp4_21b"], "Error in the config: In 'train': Could not find 'experiment/nvfp4_21b'; Available "
                                "options in 'experiment': bf16_12b, bf16_8b, fp8_12b, fp8_8b, nvfp4_12b, nvfp4_8b, "
                                "quickstart"),
], ids=["yaml_syntax", "required_value_missing", "wrong_type", "unknown_experiment"])
def test_a_config_that_does_not_compose_is_one_line_naming_the_culprit(tmp_path, args, expected):
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "bad_indent.yaml").write_text("# @package _global_\ntrain:\n  steps: 2\n"
                                                             "   micro_batch_size: 3\n")
    line = _one_line(_cli([a.format(configs=tmp_path) for a in args], cwd=tmp_path / "experiment"))
    assert line.startswith(expected.format(configs=tmp_path)), line
    assert sorted(p.name for p in (tmp_path / "experiment").iterdir()) == ["bad_indent.yaml"]  # nothing written


def test_a_negative_checkpoint_interval_in_minutes_is_refused_naming_it(data_cache):
    with pytest.raises(ConfigError, match=r"^checkpoint\.every_minutes must be a number of minutes >= 0 \(0 "
                                          r"disables\), got -1"):
        validate_train_config(compose(tiny_overrides(data_cache) + ["checkpoint.every_minutes=-1"]))
