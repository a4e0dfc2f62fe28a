"""Kind `hf`: a dataset of the Hugging Face Hub by name (`hf_name`, `hf_config`, `split`).

Read with `datasets.load_dataset(hf_name, hf_config, split=...)`, streamed when `streaming`;
it needs the network unless the datasets cache (under data.cache_dir) holds it. Nothing in the
defaults or the tests reads one. The description (and so the cache key) is the name,
configuration and split, without a revision: a dataset updated on the Hub keeps its key, and an
automatically prepared cache keeps serving the shards first made from it.
"""

from __future__ import annotations

from data.config import DataConfig, SourceConfig
from data.errors import DataError
from data.sources.kind import SourceKind, check_documents, hf_cache_dir


def validate(source: SourceConfig, where: str) -> None:
    if not source.hf_name:
        raise ValueError(f"{where}.hf_name must be set for kind='hf'")


def describe(source: SourceConfig, cfg: DataConfig) -> dict:
    return {"kind": source.kind, "split": source.split, "text_field": source.text_field,
            "hf_name": source.hf_name, "hf_config": source.hf_config}


def location(source: SourceConfig) -> str:
    return f"Hub dataset {source.hf_name}"


def read(source: SourceConfig, cfg: DataConfig):
    import datasets

    where = f"source {source.name!r} (Hub dataset {source.hf_name}, config {source.hf_config}, split {source.split})"
    try:
        dataset = datasets.load_dataset(source.hf_name, source.hf_config, split=source.split,
                                        streaming=source.streaming, cache_dir=hf_cache_dir(cfg))
    except Exception as error:
        raise DataError(f"{where}: cannot load: {type(error).__name__}: {error}") from error
    return check_documents(dataset, source, where)


KIND = SourceKind(name="hf", validate=validate, describe=describe, location=location, read=read)
