"""Hand-off to and from Hugging Face: train -> export (weights, config, tokenizer, generation
config) -> transformers loads, tokenizes and generates; a transformers checkpoint -> training
continues from it with transformers' own loss on the first batch."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from scripts_testing import run_script
from trainer.loop import train
from trainer_testing import compose_train_config, read_jsonl, tiny_overrides

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data_cache):
    """3 steps of the tiny model, exported at the end of the run (checkpoint.export_hf_at_end)."""
    run_dir = tmp_path_factory.mktemp("hf-run")
    cfg = compose_train_config(tiny_overrides(data_cache, steps=3) + [
        "checkpoint.export_hf_at_end=true", "checkpoint.export_hf_dtype=float32"], run_dir)
    summary = train(cfg)
    return cfg, summary, run_dir


def test_checkpoint_records_its_tokenizer(trained):
    from data import build_tokenizer

    cfg, _, run_dir = trained
    state = json.loads((run_dir / "checkpoints" / "step_00000003" / "trainer_state.json").read_text())
    ours = build_tokenizer(cfg.data)
    assert state["tokenizer"]["sha256"] == ours.sha256 and state["tokenizer"]["eos_id"] == ours.eos_id
    assert state["tokenizer"]["path"] == ours.path and state["tokenizer"]["eos_token"] == "<|endoftext|>"


def test_export_holds_the_tokenizer_and_generation_stops_on_its_eos(trained, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer, LogitsProcessor, LogitsProcessorList

    from data import build_tokenizer

    cfg, _, run_dir = trained
    out = tmp_path / "hf"
    checkpoint = run_dir / "checkpoints" / "step_00000003"
    assert run_script("trainer.export_hf", checkpoint, out, "--dtype", "float32").returncode == 0
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors"):
        assert (out / name).is_file(), name

    ours = build_tokenizer(cfg.data)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.eos_token == "<|endoftext|>" and tokenizer.eos_token_id == ours.eos_id
    config = json.loads((out / "config.json").read_text())
    generation = json.loads((out / "generation_config.json").read_text())
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        assert config[key] == generation[key] == getattr(tokenizer, key), key
    text = "def main():\n    return 'hello'\n"
    assert tokenizer(text)["input_ids"] == ours.encode(text)  # the ids training saw
    assert tokenizer.decode(ours.encode(text)) == text

    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    prompt = tokenizer("import os\n", return_tensors="pt")

    class EmitAt(LogitsProcessor):
        """Make token `token` the only choice at the `at`-th generated position."""

        def __init__(self, token: int, at: int, prompt_length: int):
            self.token, self.at, self.prompt_length = token, at, prompt_length

        def __call__(self, input_ids, scores):
            if input_ids.shape[1] - self.prompt_length == self.at:
                scores = torch.full_like(scores, -float("inf"))
                scores[:, self.token] = 0.0
            return scores

    def generate(token: int):
        processors = LogitsProcessorList([EmitAt(token, 2, prompt["input_ids"].shape[1])])
        with torch.no_grad():
            return model.generate(**prompt, max_new_tokens=8, do_sample=False, logits_processor=processors)[0]

    stopped = generate(tokenizer.eos_token_id)
    assert stopped.shape[0] == prompt["input_ids"].shape[1] + 3 and stopped[-1].item() == ours.eos_id
    other = 2 if ours.eos_id != 2 else 3  # NemotronHConfig's default eos id: an ordinary token here
    assert generate(other).shape[0] == prompt["input_ids"].shape[1] + 8


def test_export_at_end_equals_the_checkpoint_export(trained, tmp_path):
    from safetensors.torch import load_file

    _, _, run_dir = trained
    checkpoint = run_dir / "checkpoints" / "step_00000003"
    assert run_script("trainer.export_hf", checkpoint, tmp_path / "hf", "--dtype", "float32").returncode == 0
    at_end, exported = load_file(run_dir / "hf" / "model.safetensors"), load_file(tmp_path / "hf" / "model.safetensors")
    assert set(at_end) == set(exported)
    for name, tensor in exported.items():
        assert torch.equal(at_end[name], tensor), name
    assert (run_dir / "hf" / "tokenizer.json").read_text() == (tmp_path / "hf" / "tokenizer.json").read_text()
    assert any(e["event"] == "export_hf" for e in read_jsonl(run_dir / "events.jsonl"))


def test_export_refuses_another_tokenizer(trained, tmp_path):
    from data import DataConfig, build_tokenizer

    cfg, _, run_dir = trained
    other = tmp_path / "other.json"
    build_tokenizer(DataConfig(builtin_vocab_size=300, builtin_corpus_mb=0.3, cache_dir=cfg.data.cache_dir)).save(other)
    checkpoint = run_dir / "checkpoints" / "step_00000003"
    with pytest.raises(SystemExit, match="not the one"):
        run_script("trainer.export_hf", checkpoint, tmp_path / "hf", "--tokenizer", other)


def _nemotron_h_directory(path, vocab_size: int):
    """A tiny NemotronH made by transformers itself (its own init), saved with save_pretrained."""
    from transformers import NemotronHConfig, NemotronHForCausalLM

    config = NemotronHConfig(
        vocab_size=vocab_size, hidden_size=64, layers_block_type=["linear_attention", "mlp", "linear_attention",
                                                                  "full_attention", "linear_attention", "mlp"],
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=128, mlp_hidden_act="relu2",
        mamba_num_heads=16, mamba_head_dim=8, ssm_state_size=16, n_groups=2, conv_kernel=4, chunk_size=16,
        tie_word_embeddings=False, attention_bias=False, mlp_bias=False, use_bias=False, use_conv_bias=True,
    )
    torch.manual_seed(123)
    model = NemotronHForCausalLM(config).eval()
    with torch.no_grad():  # move every weight off its constant init (norms 1, D 1)
        for parameter in model.parameters():
            parameter.add_(0.02 * torch.randn_like(parameter))
    model.save_pretrained(path)
    return model


def test_training_starts_from_a_transformers_checkpoint(tmp_path, data_cache):
    from data import build_train_loader

    hf_model = _nemotron_h_directory(tmp_path / "nemotron", vocab_size=512)
    overrides = [o for o in tiny_overrides(data_cache, steps=2) if not o.startswith(("model", "precision"))]
    # model.hidden_size=32 is a wrong guess the directory's config.json must overrule
    cfg = compose_train_config(overrides + ["precision=bf16", "model.hidden_size=32",
                                            f"checkpoint.init_from_hf={tmp_path / 'nemotron'}"], tmp_path / "run")
    summary = train(cfg)

    loader = build_train_loader(cfg.data, micro_batch_size=cfg.train.micro_batch_size, dp_rank=0, dp_world_size=1,
                                seed=cfg.data.seed)
    accumulation = cfg.train.global_batch_size // cfg.train.micro_batch_size
    with torch.no_grad():
        losses = []
        for _ in range(accumulation):
            batch = next(loader)
            logits = hf_model(batch["inputs"]).logits
            losses.append(F.cross_entropy(logits.flatten(0, 1).float(), batch["labels"].flatten()).item())
    expected = sum(losses) / len(losses)
    assert summary["losses"][0] == pytest.approx(expected, rel=1e-5)
    assert summary["losses"][1] != summary["losses"][0]  # it trained on
    events = read_jsonl(tmp_path / "run" / "events.jsonl")
    assert any(e["event"] == "init_from_hf" for e in events)
    written = (tmp_path / "run" / "config.yaml").read_text()
    assert "hidden_size: 64" in written  # the run directory records the adopted architecture


def test_init_from_hf_names_a_directory_without_config(tmp_path, data_cache):
    cfg = compose_train_config(tiny_overrides(data_cache, steps=1) + [f"checkpoint.init_from_hf={tmp_path}"],
                               tmp_path / "run")
    with pytest.raises(ValueError, match="checkpoint.init_from_hf.*no config.json"):  # at start, before any work
        train(cfg)
