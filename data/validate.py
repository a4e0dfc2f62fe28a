"""`validate_data_config`: a DataConfig's fields checked before any work starts, each source by its kind.

The checks of the fields every source has live here; what a kind needs (a path, roots, a Hub
name) its module's `validate` checks (data/sources/). Errors are ValueErrors naming the field,
as `data.sources[1] ('code').path must be set for kind='files'`.
"""

from __future__ import annotations

from data.config import FILE_FORMATS, TEXT_SAMPLE_BY, DataConfig
from data.sources import SOURCE_KINDS


def validate_data_config(cfg: DataConfig) -> None:
    """Raise a ValueError naming the first bad field of `cfg` (checked before any work starts)."""
    if cfg.seq_len < 1:
        raise ValueError(f"data.seq_len must be >= 1, got {cfg.seq_len}")
    if not cfg.sources:
        raise ValueError("data.sources is empty: list at least one source")
    if not 0.0 <= cfg.validation_fraction < 1.0:
        raise ValueError(f"data.validation_fraction must be in [0, 1), got {cfg.validation_fraction}")
    if cfg.validation_batches < 0:
        raise ValueError(f"data.validation_batches must be >= 0, got {cfg.validation_batches}")
    if cfg.documents_per_shard < 1:
        raise ValueError(f"data.documents_per_shard must be >= 1, got {cfg.documents_per_shard}")
    if cfg.num_proc < 0:
        raise ValueError(f"data.num_proc must be >= 0 (0 = one per core), got {cfg.num_proc}")
    if cfg.builtin_vocab_size < 257:
        raise ValueError(f"data.builtin_vocab_size must be >= 257 (256 bytes + EOS), got {cfg.builtin_vocab_size}")
    if cfg.max_document_chars < 1:
        raise ValueError(f"data.max_document_chars must be >= 1, got {cfg.max_document_chars}")
    if cfg.builtin_corpus_mb <= 0:
        raise ValueError(f"data.builtin_corpus_mb must be > 0, got {cfg.builtin_corpus_mb}")
    names = [source.name for source in cfg.sources]
    for index, source in enumerate(cfg.sources):
        where = f"data.sources[{index}] ({source.name!r})"
        if not source.name or "/" in source.name or source.name.startswith("."):
            raise ValueError(f"{where}.name must be a non-empty file-name-safe label, got {source.name!r}")
        if source.name in names[:index]:
            raise ValueError(f"{where}.name is not unique: sources are {names}")
        if source.kind not in SOURCE_KINDS:
            raise ValueError(f"{where}.kind must be one of the registered kinds {tuple(SOURCE_KINDS)}, "
                             f"got {source.kind!r}")
        SOURCE_KINDS[source.kind].validate(source, where)
        if source.file_format not in FILE_FORMATS:
            raise ValueError(f"{where}.file_format must be one of {FILE_FORMATS}, got {source.file_format!r}")
        if source.text_sample_by not in TEXT_SAMPLE_BY:
            raise ValueError(f"{where}.text_sample_by must be one of {TEXT_SAMPLE_BY}, got {source.text_sample_by!r}")
        if not source.weight > 0:
            raise ValueError(f"{where}.weight must be > 0, got {source.weight}")
