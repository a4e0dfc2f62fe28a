"""Bad input stops with a clear error naming the culprit: file, directory or config field."""

from __future__ import annotations

import json
import re

import pytest

from data import DataConfig, DataError, SourceConfig, build_tokenizer, build_train_loader, build_validation_batches
from data import prepare_source, validate_data_config
from data.shards import open_split
from data_testing import files_config, shared_builtin_cache, write_jsonl, write_synthetic, prepare_small_jsonl_source


@pytest.fixture
def prepared(tmp_path):
    """A small local source prepared into tmp_path/out/local with the shared builtin tokenizer."""
    return prepare_small_jsonl_source(tmp_path, seed=11)


def test_the_prepared_fixture_loads(prepared):
    cfg, _ = prepared
    batch = next(build_train_loader(cfg, micro_batch_size=2))
    assert batch["inputs"].shape == (2, 16)


def test_missing_shard_names_the_file(prepared):
    cfg, directory = prepared
    (directory / "train-00001.bin").unlink()
    with pytest.raises(DataError, match=re.escape(str(directory / "train-00001.bin")) + ".*manifest.json"):
        build_train_loader(cfg, micro_batch_size=2)


def test_truncated_shard_names_the_file(prepared):
    cfg, directory = prepared
    shard = directory / "train-00002.bin"
    shard.write_bytes(shard.read_bytes()[:-4])
    with pytest.raises(DataError, match="truncated.*" + re.escape(str(shard))):
        build_train_loader(cfg, micro_batch_size=2)
    index = directory / "train-00000.idx.npy"
    index.write_bytes(index.read_bytes()[:-8])
    with pytest.raises(DataError, match=re.escape(str(index))):
        open_split(directory, "train", expected_tokenizer=None)


def test_checksum_mismatch_names_the_file_unless_verification_is_off(prepared):
    cfg, directory = prepared
    shard = directory / "train-00000.bin"
    content = bytearray(shard.read_bytes())
    content[5] ^= 0x01  # same size, one bit flipped
    shard.write_bytes(bytes(content))
    with pytest.raises(DataError, match="checksum mismatch.*" + re.escape(str(shard))):
        build_train_loader(cfg, micro_batch_size=2)
    cfg.verify_checksums = False  # explicit opt-out: opens (sizes still checked)
    build_train_loader(cfg, micro_batch_size=2)


def test_checksum_work_is_split_across_ranks(prepared):
    cfg, directory = prepared
    shard = directory / "train-00001.bin"  # the second train shard: hashed by rank 1 of 2
    content = bytearray(shard.read_bytes())
    content[0] ^= 0x01
    shard.write_bytes(bytes(content))
    open_split(directory, "train", expected_tokenizer=None, checksum_rank=0, checksum_world_size=2)
    with pytest.raises(DataError, match=re.escape(str(shard))):
        open_split(directory, "train", expected_tokenizer=None, checksum_rank=1, checksum_world_size=2)


def test_tokenizer_mismatch_names_the_manifest(prepared, tmp_path):
    cfg, directory = prepared
    cfg.builtin_vocab_size = 600  # another builtin tokenizer
    with pytest.raises(DataError, match="tokenizer mismatch for " + re.escape(str(directory / "manifest.json"))):
        build_train_loader(cfg, micro_batch_size=2)


def test_validation_fraction_mismatch_names_the_manifest(prepared):
    cfg, directory = prepared
    cfg.validation_fraction = 0.3
    with pytest.raises(DataError, match=re.escape(str(directory / "manifest.json")) + ".*validation_fraction"):
        build_train_loader(cfg, micro_batch_size=2)


def test_incomplete_preparation_and_no_auto_prepare_name_the_directory(prepared):
    cfg, directory = prepared
    (directory / "manifest.json").unlink()
    with pytest.raises(DataError, match=re.escape(str(directory)) + ".*auto_prepare is false"):
        build_train_loader(cfg, micro_batch_size=2)
    with pytest.raises(DataError, match=re.escape(str(directory)) + ".*no manifest.json"):
        open_split(directory, "train", expected_tokenizer=None)


def test_resuming_with_other_settings_names_the_settings_file(prepared):
    cfg, directory = prepared
    (directory / "manifest.json").unlink()
    cfg.documents_per_shard = 7
    with pytest.raises(DataError, match="documents_per_shard.*" + re.escape(str(directory / "prepare-settings.json"))):
        prepare_source(cfg, cfg.sources[0], build_tokenizer(cfg), progress=False)


def test_seq_len_longer_than_the_dataset_names_the_manifest(prepared):
    cfg, directory = prepared
    cfg.seq_len = 1_000_000
    with pytest.raises(DataError, match="seq_len 1000000.*" + re.escape(str(directory / "manifest.json"))):
        build_train_loader(cfg, micro_batch_size=2)


def test_too_small_validation_split_names_the_manifest(prepared):
    cfg, directory = prepared
    cfg.validation_batches = 1000
    with pytest.raises(DataError, match="validation split of " + re.escape(str(directory / "manifest.json"))):
        build_validation_batches(cfg, micro_batch_size=2)


def test_empty_sources_name_the_file(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    cfg = files_config(shared_builtin_cache(), empty, prepared_dir=str(tmp_path / "out"))
    with pytest.raises(DataError, match="empty.jsonl is empty"):
        build_train_loader(cfg, micro_batch_size=1)
    (tmp_path / "nodata").mkdir()
    (tmp_path / "nodata" / "README.md").write_text("not data")
    cfg = files_config(shared_builtin_cache(), tmp_path / "nodata", prepared_dir=str(tmp_path / "out"))
    with pytest.raises(DataError, match="nodata.*no data files"):
        build_train_loader(cfg, micro_batch_size=1)
    cfg = files_config(shared_builtin_cache(), tmp_path / "missing.jsonl", prepared_dir=str(tmp_path / "out"))
    with pytest.raises(DataError, match="missing.jsonl.*no such file"):
        build_train_loader(cfg, micro_batch_size=1)


def test_missing_or_null_text_field_names_the_source(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", ["x", "y"], field="body")
    cfg = files_config(shared_builtin_cache(), tmp_path / "a.jsonl", prepared_dir=str(tmp_path / "out"))
    with pytest.raises(DataError, match="a.jsonl.*no text field 'text'.*'body'"):
        build_train_loader(cfg, micro_batch_size=1)
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": "fine"}) + "\n" + json.dumps({"text": None}) + "\n")
    cfg = files_config(shared_builtin_cache(), tmp_path / "b.jsonl", prepared_dir=str(tmp_path / "out2"))
    with pytest.raises(DataError, match="b.jsonl.*document 1 has no text"):
        build_train_loader(cfg, micro_batch_size=1)
    # also when raised inside a datasets.map worker process
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"text": None if i == 20 else "t"}) + "\n" for i in range(40)))
    cfg = files_config(shared_builtin_cache(), tmp_path / "c.jsonl", prepared_dir=str(tmp_path / "out3"), num_proc=2)
    with pytest.raises(DataError, match="c.jsonl.*document 20 has no text"):
        build_train_loader(cfg, micro_batch_size=1)


def test_empty_training_split_names_the_manifest(tmp_path):
    write_synthetic(tmp_path / "tiny", "tiny", [3])
    with pytest.raises(DataError, match="seq_len 8 .*" + re.escape(str(tmp_path / "tiny" / "manifest.json"))):
        from data.loader import PackedLoader

        PackedLoader([open_split(tmp_path / "tiny", "train", expected_tokenizer=None)], [1.0], seq_len=8,
                     micro_batch_size=1, dp_rank=0, dp_world_size=1, seed=0)


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"seq_len": 0}, "data.seq_len"),
        ({"sources": []}, "data.sources"),
        ({"validation_fraction": 1.0}, "data.validation_fraction"),
        ({"sources": [SourceConfig(name="a"), SourceConfig(name="a")]}, r"data.sources\[1\] \('a'\).name is not unique"),
        ({"sources": [SourceConfig(kind="web")]}, r"data.sources\[0\] \('builtin'\).kind"),
        ({"sources": [SourceConfig(name="f", kind="files")]}, r"data.sources\[0\] \('f'\).path"),
        ({"sources": [SourceConfig(weight=0.0)]}, r"data.sources\[0\] \('builtin'\).weight"),
        ({"builtin_vocab_size": 100}, "data.builtin_vocab_size"),
    ],
)
def test_config_errors_name_the_field(changes, field):
    with pytest.raises(ValueError, match=field):
        validate_data_config(DataConfig(**changes))


def test_loader_arguments_are_checked(prepared):
    cfg, _ = prepared
    with pytest.raises(ValueError, match="dp_rank"):
        build_train_loader(cfg, micro_batch_size=2, dp_rank=2, dp_world_size=2)
    with pytest.raises(ValueError, match="micro_batch_size"):
        build_validation_batches(cfg, micro_batch_size=0)

