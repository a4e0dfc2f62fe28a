"""`python -m trainer.prepare_data` (run as a user runs it): one source from flags (files, save_to_disk directories),
configs and experiments through trainer.config.compose_data, and clear refusals of what it cannot read."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from scripts_testing import run_script
from trainer.config import compose_data
from data_testing import SMALL_CORPUS_MB, SMALL_VOCAB, ascii_documents, shared_builtin_cache, write_jsonl

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory) -> Path:
    """The small builtin BPE written as a tokenizer.json, as a user's tokenizer file."""
    from data import DataConfig, build_tokenizer

    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    build_tokenizer(DataConfig(builtin_vocab_size=SMALL_VOCAB, builtin_corpus_mb=SMALL_CORPUS_MB,
                               cache_dir=shared_builtin_cache())).save(path)
    return path


def _tokens(directory: Path) -> np.ndarray:
    manifest = json.loads((directory / "manifest.json").read_text())
    return np.concatenate([np.fromfile(directory / s["bin"], dtype=np.uint32) for s in manifest["shards"]
                           if s["split"] == "train"])


def _prepare(*arguments):
    return run_script("trainer.prepare_data", "--no-progress", *arguments,
                      f"cache_dir={shared_builtin_cache()}").returncode


def test_readme_flags_prepare_one_source(tokenizer_file, tmp_path):
    texts = ascii_documents(60, seed=1)
    write_jsonl(tmp_path / "corpus" / "part-0.jsonl", texts[:30])
    write_jsonl(tmp_path / "corpus" / "part-1.jsonl", texts[30:])
    assert _prepare("--source", "files", "--path", tmp_path / "corpus", "--tokenizer", tokenizer_file,
                    "--out", tmp_path / "shards", "--num-proc", 1) == 0
    manifest = json.loads((tmp_path / "shards" / "corpus" / "manifest.json").read_text())
    assert manifest["documents"] == 60 and manifest["source"]["format"] == "json"
    assert manifest["tokenizer"]["name"] == tokenizer_file.parent.name


def test_a_save_to_disk_directory_is_a_source(tokenizer_file, tmp_path):
    import datasets

    texts = ascii_documents(40, seed=2)
    write_jsonl(tmp_path / "as_jsonl" / "docs.jsonl", texts)
    datasets.Dataset.from_dict({"content": texts}).save_to_disk(str(tmp_path / "saved"))
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"content": texts[:5]}),
                          "web": datasets.Dataset.from_dict({"content": texts})}).save_to_disk(str(tmp_path / "dict"))
    common = ["--tokenizer", tokenizer_file, "--out", tmp_path / "shards", "--num-proc", 1]
    assert _prepare("--source", "files", "--path", tmp_path / "saved", "--text-field", "content", *common) == 0
    assert _prepare("--source", "files", "--path", tmp_path / "as_jsonl", *common) == 0
    assert _prepare("--source", "files", "--path", tmp_path / "dict", "--text-field", "content", *common,
                    "--split", "web") == 0
    saved = json.loads((tmp_path / "shards" / "saved" / "manifest.json").read_text())
    assert saved["source"]["format"] == "saved_dataset" and saved["documents"] == 40
    # the same documents give the same tokens, whichever container they came in
    np.testing.assert_array_equal(_tokens(tmp_path / "shards" / "saved"), _tokens(tmp_path / "shards" / "as_jsonl"))
    np.testing.assert_array_equal(_tokens(tmp_path / "shards" / "dict"), _tokens(tmp_path / "shards" / "as_jsonl"))
    with pytest.raises(Exception, match=r"splits \['train', 'web'\], not 'test'"):
        _prepare("--source", "files", "--path", tmp_path / "dict", "--text-field", "content", *common,
                 "--name", "dict_test", "--split", "test")
    with pytest.raises(SystemExit, match="as flags"):
        _prepare("--source", "files", "--path", tmp_path / "dict", *common, "sources.0.split=web")


@pytest.mark.parametrize("files", [("corpus.bin", "corpus.idx"), ("corpus.csv",)])
def test_unsupported_inputs_name_the_file_and_the_supported_formats(tokenizer_file, tmp_path, files):
    for name in files:
        (tmp_path / "in" / name).parent.mkdir(exist_ok=True)
        (tmp_path / "in" / name).write_bytes(b"\x00" * 64)
    target = tmp_path / "in" if len(files) > 1 else tmp_path / "in" / files[0]
    with pytest.raises(Exception) as raised:
        _prepare("--source", "files", "--path", target, "--tokenizer", tokenizer_file, "--out", tmp_path / "o")
    message = str(raised.value)
    assert files[0] in message and "supported" in message and ".jsonl" in message and "save_to_disk" in message
    if files[0].endswith(".bin"):
        assert "Megatron" in message


def test_configs_overrides_and_experiments_compose(tmp_path):
    cfg = compose_data("local_jsonl", [f"sources.0.path={tmp_path}", "num_proc=3"])
    assert (cfg.sources[0].path, cfg.num_proc, cfg.sources[0].kind) == (str(tmp_path), 3, "files")
    cfg = compose_data(None, ["+experiment=nvfp4_12b", "data.prepared_dir=/fast/shards"])
    assert (cfg.seq_len, cfg.prepared_dir) == (8192, "/fast/shards")  # the experiment's data, as training reads it
    own = tmp_path / "my_data.yaml"
    own.write_text("seq_len: 32\nsources:\n  - name: mine\n    kind: files\n    path: /somewhere\n")
    cfg = compose_data(str(own), ["validation_fraction=0.5"])
    assert (cfg.seq_len, cfg.sources[0].name, cfg.validation_fraction) == (32, "mine", 0.5)
    with pytest.raises(SystemExit, match="path must be set"):
        run_script("trainer.prepare_data", "--config", "local_jsonl")
    with pytest.raises(SystemExit, match="nonexistent"):
        run_script("trainer.prepare_data", "nonexistent_key=1")
    with pytest.raises(SystemExit, match="available"):
        run_script("trainer.prepare_data", "--config", "no_such_config")
