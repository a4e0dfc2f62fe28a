"""Hugging Face hand-off faults: init_from_hf with a weight missing or extra, or a directory of another
architecture; `python -m trainer.export_hf` into a directory that holds an earlier export's files."""

from __future__ import annotations

import json

import pytest
import torch

from scripts_testing import run_script
from trainer.distributed import DistEnv
from trainer.hf.export import ExportDirectoryNotEmpty, export_checkpoint
from trainer.hf.load import load_hf_weights
from trainer.loop import train
from trainer_testing import compose_train_config, tiny_overrides

transformers = pytest.importorskip("transformers")


def _nemotron_h_directory(path):
    """A tiny NemotronH saved by transformers itself (attention in layer 1)."""
    from transformers import NemotronHConfig, NemotronHForCausalLM

    config = NemotronHConfig(
        vocab_size=512, hidden_size=64, layers_block_type=["linear_attention", "full_attention", "mlp"],
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=128, mlp_hidden_act="relu2",
        mamba_num_heads=16, mamba_head_dim=8, ssm_state_size=16, n_groups=2, conv_kernel=4, chunk_size=16,
        tie_word_embeddings=False, attention_bias=False, mlp_bias=False, use_bias=False, use_conv_bias=True,
    )
    torch.manual_seed(0)
    NemotronHForCausalLM(config).save_pretrained(path)
    return path


def _edit_weights(directory, edit):
    from safetensors.torch import load_file, save_file

    file = directory / "model.safetensors"
    tensors = load_file(file)
    edit(tensors)
    save_file(tensors, file, metadata={"format": "pt"})


def _init_overrides(data_cache, directory):
    overrides = [o for o in tiny_overrides(data_cache, steps=1) if not o.startswith(("model", "precision"))]
    return overrides + ["precision=bf16", f"checkpoint.init_from_hf={directory}"]


def test_init_from_hf_refuses_a_missing_or_unexpected_weight_naming_it(tmp_path, data_cache):
    directory = _nemotron_h_directory(tmp_path / "nemotron")
    _edit_weights(directory, lambda tensors: tensors.pop("backbone.layers.1.mixer.o_proj.weight"))
    with pytest.raises(ValueError, match=r"1 missing from the directory \(they would keep their random init\): "
                                         r"layers\.1\.mixer\.o_proj\.weight"):
        train(compose_train_config(_init_overrides(data_cache, directory), tmp_path / "run"))

    from models.hf import import_hf, read_hf_model_config  # the loader itself, on a model built from config.json
    from models import build_model

    model = build_model(read_hf_model_config(directory))
    _edit_weights(directory, lambda tensors: tensors.update({
        "backbone.layers.1.mixer.o_proj.weight": torch.zeros(64, 64),
        "backbone.layers.9.mixer.o_proj.weight": torch.zeros(64, 64)}))
    env = DistEnv(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))
    with pytest.raises(ValueError, match=r"1 in the directory but not in the model: layers\.9\.mixer\.o_proj\.weight"):
        load_hf_weights(model, str(directory), env)
    _edit_weights(directory, lambda tensors: tensors.pop("backbone.layers.9.mixer.o_proj.weight"))
    assert load_hf_weights(model, str(directory), env) == len(import_hf(directory).state_dict())


def test_init_from_hf_names_a_foreign_architecture_from_model_type(tmp_path, data_cache):
    directory = tmp_path / "llama"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 512}))
    with pytest.raises(ValueError, match=r"config.json describes a 'llama' model \(architectures \['LlamaForCausalLM'\]\), "
                                         r"not NemotronH \(model_type 'nemotron_h'"):
        train(compose_train_config(_init_overrides(data_cache, directory), tmp_path / "run"))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, data_cache):
    run_dir = tmp_path_factory.mktemp("export-run")
    train(compose_train_config(tiny_overrides(data_cache, steps=1), run_dir))
    return run_dir / "checkpoints" / "step_00000001"


def test_export_refuses_a_directory_with_an_earlier_exports_files_unless_overwrite(checkpoint, tmp_path):
    from transformers import AutoTokenizer

    out = tmp_path / "hf"
    out.mkdir()
    stale = {"added_tokens.json": {"<extra>": 512}, "special_tokens_map.json": {"eos_token": "<extra>"}}
    for name, content in stale.items():
        (out / name).write_text(json.dumps(content))
    (out / "chat_template.jinja").write_text("{{ messages }}")
    with pytest.raises(ExportDirectoryNotEmpty, match=r"hf is not empty \(added_tokens.json, chat_template.jinja, "
                                                      r"special_tokens_map.json\).*--overwrite"):
        export_checkpoint(checkpoint, out, "float32")
    assert sorted(path.name for path in out.iterdir()) == ["added_tokens.json", "chat_template.jinja",
                                                           "special_tokens_map.json"]  # untouched

    run_script("trainer.export_hf", checkpoint, out, "--dtype", "float32", "--overwrite")
    assert not any((out / name).exists() for name in (*stale, "chat_template.jinja"))
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert len(tokenizer) == 512 and tokenizer.eos_token_id < 512

    run_dir = checkpoint.parent.parent
    with pytest.raises(ExportDirectoryNotEmpty, match="it holds directories \\(checkpoints\\)"):
        export_checkpoint(checkpoint, run_dir, overwrite=True)  # never empties a run directory
    assert checkpoint.is_dir()


def test_end_of_run_export_refuses_a_stale_directory_before_training_and_replaces_its_own(tmp_path, data_cache):
    from transformers import AutoTokenizer

    from trainer.validate import ConfigError

    out = tmp_path / "export"
    out.mkdir()
    (out / "added_tokens.json").write_text(json.dumps({"<extra>": 512}))
    overrides = tiny_overrides(data_cache, steps=1) + ["checkpoint.export_hf_at_end=true",
                                                       "checkpoint.export_hf_dtype=float32"]
    run_dir = tmp_path / "run"
    with pytest.raises(ConfigError, match=r"checkpoint.export_hf_dir: .*export is not empty \(added_tokens.json\)"
                                          r".*checkpoint.export_hf_overwrite=true"):
        train(compose_train_config(overrides + [f"checkpoint.export_hf_dir={out}"], run_dir))
    assert not (run_dir / "metrics.jsonl").exists()  # refused before the first step

    train(compose_train_config(overrides + [f"checkpoint.export_hf_dir={out}", "checkpoint.export_hf_overwrite=true"],
                               run_dir))
    assert not (out / "added_tokens.json").exists() and len(AutoTokenizer.from_pretrained(out)) == 512

    own = tmp_path / "own"  # no export_hf_dir: <run dir>/hf, replaced by a later completion of the run
    train(compose_train_config(overrides, own))
    (own / "hf" / "added_tokens.json").write_text(json.dumps({"<extra>": 512}))
    train(compose_train_config([o for o in overrides if not o.startswith("train.steps")] + ["train.steps=2"], own))
    assert not (own / "hf" / "added_tokens.json").exists() and len(AutoTokenizer.from_pretrained(own / "hf")) == 512
