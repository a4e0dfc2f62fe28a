"""DataConfig as a Hydra structured config: every configs/data/*.yaml merges into it; fields are documented."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError

from data import DataConfig, SourceConfig, validate_data_config
from trainer.config import register_configs

REPOSITORY = Path(__file__).resolve().parents[2]
DATA_CONFIGS = sorted((REPOSITORY / "configs" / "data").glob("*.yaml"))


def merged(path: Path):
    return OmegaConf.merge(OmegaConf.structured(DataConfig), OmegaConf.load(path))


def test_builtin_yaml_is_the_dataclass_default():
    cfg = OmegaConf.to_object(merged(REPOSITORY / "configs" / "data" / "builtin.yaml"))
    assert isinstance(cfg, DataConfig) and isinstance(cfg.sources[0], SourceConfig)
    assert cfg == DataConfig()
    validate_data_config(cfg)


@pytest.mark.parametrize("path", DATA_CONFIGS, ids=[path.stem for path in DATA_CONFIGS])
def test_every_data_yaml_merges_and_validates_once_its_blanks_are_filled(path, tmp_path):
    config = merged(path)
    register_configs()  # the ${required:key} resolver
    raw = OmegaConf.to_container(config, resolve=False)
    required = [key for key, value in raw.items() if isinstance(value, str) and value.startswith("${required:")]
    for key in required:  # before missing_keys, which resolves every value
        OmegaConf.update(config, key, str(tmp_path / "placeholder"))
    for key in OmegaConf.missing_keys(config):
        OmegaConf.update(config, key, str(tmp_path / "placeholder"))
    for index, source in enumerate(config.sources):
        if source.kind == "files" and source.path in (None, "???"):
            OmegaConf.update(config, f"sources.{index}.path", str(tmp_path))
    cfg = OmegaConf.to_object(config)
    validate_data_config(cfg)
    assert all(isinstance(source, SourceConfig) for source in cfg.sources)


def test_a_misspelled_key_fails_naming_it():
    with pytest.raises(ConfigKeyError, match="seqlen"):
        OmegaConf.merge(OmegaConf.structured(DataConfig), {"seqlen": 3})
    with pytest.raises(ConfigKeyError, match="wieght"):
        OmegaConf.merge(OmegaConf.structured(DataConfig), {"sources": [{"name": "a", "wieght": 2.0}]})


def test_source_defaults_fill_in_from_a_partial_yaml_entry():
    config = OmegaConf.merge(OmegaConf.structured(DataConfig), {"sources": [{"name": "a", "kind": "files", "path": "/x"}]})
    source = OmegaConf.to_object(config).sources[0]
    assert source.weight == 1.0 and source.text_field == "text" and source.path == "/x"


@pytest.mark.parametrize("cls", [DataConfig, SourceConfig])
def test_every_field_has_a_docstring(cls):
    tree = ast.parse((REPOSITORY / "data" / "config.py").read_text())
    body = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == cls.__name__).body
    documented = {
        statement.target.id
        for statement, following in zip(body, body[1:])
        if isinstance(statement, ast.AnnAssign)
        and isinstance(following, ast.Expr)
        and isinstance(following.value, ast.Constant)
        and isinstance(following.value.value, str)
    }
    assert documented == {field.name for field in dataclasses.fields(cls)}
