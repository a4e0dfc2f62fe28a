"""Data: sources -> tokenizer -> token shards -> packed, resumable, mixed batches.

    from data import build_tokenizer, build_train_loader, build_validation_batches
    tok = build_tokenizer(cfg.data)
    loader = build_train_loader(cfg.data, micro_batch_size=B, dp_rank=r, dp_world_size=w, seed=s)
    batch = next(loader)        # {"inputs": LongTensor[B, T], "labels": LongTensor[B, T]}

See docs/data.md for the formats, the sampler and the resume rule.
"""

from __future__ import annotations

from data.config import DataConfig, SourceConfig
from data.errors import DataError
from data.loader import PackedLoader, build_train_loader, build_validation_batches
from data.prepare import ensure_prepared, prepare_source, prepared_directory
from data.tokenizer import Tokenizer, build_tokenizer
from data.validate import validate_data_config

__all__ = [
    "DataConfig",
    "DataError",
    "PackedLoader",
    "SourceConfig",
    "Tokenizer",
    "build_tokenizer",
    "build_train_loader",
    "build_validation_batches",
    "ensure_prepared",
    "prepare_source",
    "prepared_directory",
    "validate_data_config",
]
