"""Local inputs beyond plain files: datasets' `save_to_disk` directories, and the formats refused.

A `kind: files` source whose path is a directory written by `datasets.Dataset.save_to_disk`
(dataset_info.json + state.json + Arrow files) or `DatasetDict.save_to_disk`
(dataset_dict.json + one such directory per split) is read with `datasets.load_from_disk`;
for a DatasetDict, `split` picks the split. Its description (for manifests and cache keys)
lists every file with size and modification time, like plain files.

Megatron indexed datasets (`.bin` + `.idx`) hold token ids of some tokenizer, not text, so
they cannot be re-tokenized; they are refused with an error naming the file and the formats
that are supported, never skipped.
"""

from __future__ import annotations

from pathlib import Path

from data.errors import DataError

SUPPORTED_FORMATS = (
    "JSON lines / JSON (.jsonl, .json; also .gz, .zst, .bz2, .xz), Parquet (.parquet), text (.txt, .txt.gz), "
    "or a directory written by datasets' save_to_disk"
)
"""What a `kind: files` source reads, for error messages."""

MEGATRON_SUFFIXES = (".bin", ".idx")


def is_saved_dataset(path: Path) -> bool:
    """True for a directory written by Dataset.save_to_disk or DatasetDict.save_to_disk."""
    path = Path(path)
    return path.is_dir() and (
        (path / "dataset_dict.json").is_file()
        or ((path / "state.json").is_file() and (path / "dataset_info.json").is_file())
    )


def refuse_megatron(files, where: str) -> None:
    """Raise naming the first Megatron .bin/.idx file among `files`."""
    for path in files:
        if Path(path).suffix in MEGATRON_SUFFIXES:
            raise DataError(
                f"{where}: {path} looks like a Megatron indexed dataset (.bin/.idx: token ids, not text), which "
                f"cannot be read here; supported: {SUPPORTED_FORMATS}"
            )


def describe_saved_dataset(path: Path) -> dict:
    """Format and per-file size and mtime of a save_to_disk directory (stat only: cheap)."""
    files = sorted((p for p in Path(path).rglob("*") if p.is_file()), key=lambda p: p.as_posix())
    return {
        "format": "saved_dataset",
        "files": [{"path": str(p.resolve()), "bytes": p.stat().st_size, "mtime_ns": p.stat().st_mtime_ns}
                  for p in files],
    }


def load_saved_dataset(path: Path, split: str, streaming: bool, where: str):
    """The documents of a save_to_disk directory (for a DatasetDict: the `split` one)."""
    import datasets

    try:
        loaded = datasets.load_from_disk(str(path))
    except Exception as error:  # noqa: BLE001 - datasets raises many types on a damaged directory
        raise DataError(f"{where}: cannot load {path} with datasets.load_from_disk: {type(error).__name__}: {error}") from error
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise DataError(f"{where}: {path} has splits {sorted(loaded)}, not {split!r} (set the source's split)")
        loaded = loaded[split]
    return loaded.to_iterable_dataset() if streaming else loaded
