"""Data configuration: where text comes from, how it is tokenized, and how the loader packs it.

One `DataConfig` per run (Hydra group ``data``); it lists one or more `SourceConfig`s that are
mixed by weight. The dataclass defaults are the quickstart's: the built-in corpus (the Python
standard library of the running interpreter) with a small byte-level BPE trained on it.
Only types OmegaConf supports are used (str, int, float, bool, Optional, List of dataclasses).
`validate_data_config` (data/validate.py) checks a config before any work starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

FILE_FORMATS = ("auto", "json", "parquet", "text")
TEXT_SAMPLE_BY = ("document", "paragraph", "line")


@dataclass
class SourceConfig:
    """One text source: prepared into its own token shards, then mixed with the others by weight."""

    name: str = "builtin"
    """Unique label: names the source's prepared directory, its entry in the loader state, and its logs."""
    kind: str = "builtin"
    """A kind registered in data/sources/: 'builtin' (stdlib sources of the running interpreter), 'files' (local jsonl/json/parquet/text), 'tree' (text files found by glob under directory trees, one document per file, deduplicated), or 'hf' (a Hub dataset by name)."""
    path: Optional[str] = None
    """kind='files': one file, a directory (searched recursively, sorted), or a glob pattern."""
    file_format: str = "auto"
    """kind='files': 'json' (json and jsonl, optionally .gz/.zst), 'parquet', 'text', or 'auto' (from the file extensions)."""
    text_sample_by: str = "document"
    """file_format='text': one document per 'document' (whole file), 'paragraph', or 'line'."""
    roots: List[str] = field(default_factory=list)
    """kind='tree': directories to search, in order; 'sysconfig:<name>' names a path of the running interpreter (sysconfig:stdlib, sysconfig:purelib)."""
    include: List[str] = field(default_factory=lambda: ["*.py", "*.md", "*.rst", "*.txt"])
    """kind='tree': file-name globs to read (fnmatch on the file name)."""
    exclude: List[str] = field(default_factory=list)
    """kind='tree': globs on the path relative to its root to leave out, e.g. '*/_vendor/*'."""
    max_document_bytes: int = 1000000
    """kind='tree': files larger than this are left out (generated tables, data blobs) and counted in the manifest."""
    skip_undecodable: bool = False
    """kind='tree': leave out files that are not valid UTF-8 (counted in the manifest) instead of stopping with an error naming the file."""
    hf_name: Optional[str] = None
    """kind='hf': the dataset's Hub name (e.g. 'HuggingFaceFW/fineweb-edu'); needs the network unless cached."""
    hf_config: Optional[str] = None
    """kind='hf': the dataset's configuration (subset) name, if it has several."""
    split: str = "train"
    """kind='hf' (or a saved DatasetDict directory): the split to read (local files form one split); validation is carved out by documents."""
    text_field: str = "text"
    """Column holding each document's text."""
    weight: float = 1.0
    """Mixing weight: the share of training samples drawn from this source is weight / sum(weights)."""
    streaming: bool = False
    """Read the source as a stream (datasets IterableDataset) while preparing: for corpora larger than disk or RAM."""


@dataclass
class DataConfig:
    """Sources, tokenizer, token-shard preparation, and the packed, resumable, mixed loader."""

    seq_len: int = 256
    """Window length T: each sample is T + 1 consecutive tokens, inputs = the first T, labels = the last T."""
    sources: List[SourceConfig] = field(default_factory=lambda: [SourceConfig()])
    """The sources to train on, mixed by their weights; names must be unique."""
    tokenizer: str = "builtin"
    """'builtin' (byte-level BPE trained on the built-in corpus), or a local path: a tokenizer.json file or a Hugging Face tokenizer directory."""
    eos_token: Optional[str] = None
    """End-of-document token appended after every document; None reads it from tokenizer_config.json or known names."""
    builtin_vocab_size: int = 4096
    """Vocabulary size of the builtin BPE tokenizer (including its one special token, the EOS)."""
    builtin_corpus_mb: float = 8.0
    """Cap on the built-in corpus in MB of source text (files taken in sorted path order until the cap)."""
    cache_dir: str = "~/.cache/hybrid-nvfp4/data"
    """Root for the builtin tokenizer, automatically prepared shards, and the datasets library's cache."""
    prepared_dir: Optional[str] = None
    """Directory of prepared shards, one subdirectory per source name; None uses <cache_dir>/prepared/<name>-<settings hash>."""
    auto_prepare: bool = True
    """Prepare a source that has no shards yet on first use (under a file lock); false makes that an error instead."""
    documents_per_shard: int = 200000
    """Documents per preparation chunk; each chunk writes one train and one validation shard and is the unit of resumption."""
    num_proc: int = 0
    """Processes that tokenize in parallel during preparation (datasets.map num_proc); 0 means one per CPU core."""
    validation_fraction: float = 0.02
    """Share of documents held out for validation, chosen by a hash of each document's index (deterministic)."""
    validation_batches: int = 4
    """Micro batches per data-parallel rank in the fixed validation set."""
    seed: int = 1234
    """Seed of the sampler (window order per epoch and the mixing choices) when the caller passes none."""
    document_ids: bool = False
    """Also return 'document_ids' [B, T]: per input position, the index of its document within the window (0, 1, ...)."""
    verify_checksums: bool = True
    """Verify each shard's sha256 once per process when opening it; set false only to skip that cost knowingly."""
    skip_undecodable_documents: bool = False
    """Drop documents of local json/text files that are not valid UTF-8, counted in the manifest's skipped_documents,
    instead of stopping preparation at the first one (whose file and line the error names)."""
    max_document_chars: int = 4_000_000
    """Longest document preparation tokenizes, in characters; a longer one stops preparation naming it. Tokenizing
    one document holds about 200 bytes of memory per character (0.8 GB at this limit, 10 GB for 50 M)."""
