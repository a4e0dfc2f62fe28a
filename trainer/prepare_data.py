"""Tokenize a data config's sources into token shards (resumable), or verify prepared ones.

    python -m trainer.prepare_data                                   # the built-in corpus (configs/data/builtin.yaml)
    python -m trainer.prepare_data --source files --path /data/corpus --tokenizer /models/tok --out /fast/shards
    python -m trainer.prepare_data --config local_jsonl sources.0.path=/data/corpus/ num_proc=16
    python -m trainer.prepare_data +experiment=nvfp4_12b data.prepared_dir=/fast/shards --verify

One source from flags: --source files (--path: a file, a directory, a glob, or a directory
written by datasets' save_to_disk; --split picks a saved DatasetDict's split) or --source hf
(--path: a Hub dataset name), with --tokenizer, --out (the prepared_dir training reads with
data.prepared_dir=...) and --num-proc. Or a whole data config: --config is a name under configs/data/ or a yaml path.
The remaining arguments are overrides as `python -m trainer` takes them (composed with
trainer.config.compose): DataConfig keys with or without the `data.` prefix
(`num_proc=16`, `data.sources.0.path=...`), or `+experiment=NAME`, so the data of an
experiment is prepared exactly as its training run will read it. Flags apply last.

Interrupt at any time and run the same command again: finished shards are kept. Two commands
preparing into one --out take turns (a file lock per source directory): the second waits, then
verifies and reports the first one's work. Prints, per source, the directory, tokens and
documents per split, and the rate. An error in the data or its config is one line on stderr,
exit status 2.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path
from typing import NoReturn

from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from data import DataConfig, SourceConfig, build_tokenizer, prepare_source, prepared_directory, validate_data_config
from data.errors import DataError
from data.shards import open_split
from trainer.config import compose_data


def refuse(message: str) -> NoReturn:
    """A user's error: one line on stderr, exit status 2."""
    print(f"prepare_data: {message}", file=sys.stderr)
    raise SystemExit(2)


def load_data_config(config: str | None, overrides: list[str], flags: argparse.Namespace | None = None) -> DataConfig:
    """DataConfig from a configs/data name or a yaml path, overrides and flags (errors name the culprit)."""
    try:
        cfg = compose_data(config, overrides, validate=False)
    except FileNotFoundError as error:  # a --config that is not there: the available names
        refuse(str(error))
    except ValueError as error:
        if "is not key=value" in str(error):
            refuse(str(error))
        raise
    if flags is not None:
        apply_flags(cfg, flags)
    validate_data_config(cfg)
    return cfg


def apply_flags(cfg: DataConfig, flags: argparse.Namespace) -> None:
    """The one-source flags (--source/--path/...) and --tokenizer/--out/--num-proc, in place."""
    if flags.source is not None:
        if any(o.removeprefix("data.").startswith("sources") for o in flags.overrides):
            refuse("--source describes the one source: give its settings as flags (--path, --split, "
                             "--text-field, ...), not as sources.* overrides")
        if not flags.path and flags.source != "builtin":
            refuse(f"--source {flags.source} needs --path (a file, directory or glob; a Hub name for hf)")
        name = flags.name or ("builtin" if flags.source == "builtin" else Path(flags.path.rstrip("/*")).name or flags.source)
        source = SourceConfig(name=name, kind=flags.source, text_field=flags.text_field, streaming=flags.streaming,
                              split=flags.split)
        if flags.source == "files":
            source.path = flags.path
        elif flags.source == "hf":
            source.hf_name, source.hf_config = flags.path, flags.hf_config
        cfg.sources = [source]
    elif flags.path or flags.name:
        refuse("--path and --name describe a --source; give --source files|hf|builtin too")
    if flags.tokenizer is not None:
        cfg.tokenizer = flags.tokenizer
    if flags.out is not None:
        cfg.prepared_dir = flags.out
    if flags.num_proc is not None:
        cfg.num_proc = flags.num_proc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.prepare_data", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=None, help="name under configs/data/ or a yaml file (default: builtin)")
    parser.add_argument("--source", choices=("files", "hf", "builtin"), default=None,
                        help="prepare this one source instead of the config's sources")
    parser.add_argument("--path", default=None, help="--source files: file, directory, glob or save_to_disk "
                                                     "directory; --source hf: the Hub dataset name")
    parser.add_argument("--name", default=None, help="the source's name (its folder under --out); default from --path")
    parser.add_argument("--text-field", default="text", help="column holding each document's text (default: text)")
    parser.add_argument("--hf-config", default=None, help="--source hf: the dataset's configuration (subset)")
    parser.add_argument("--split", default="train", help="--source hf or a saved DatasetDict: the split to read")
    parser.add_argument("--streaming", action="store_true", help="read the source as a stream (larger than disk)")
    parser.add_argument("--tokenizer", default=None, help="'builtin', a tokenizer.json or a tokenizer directory")
    parser.add_argument("--out", default=None, help="directory of the prepared shards (data.prepared_dir)")
    parser.add_argument("--num-proc", type=int, default=None, help="tokenizing processes (0 = one per core)")
    parser.add_argument("--verify", action="store_true", help="only verify prepared shards (sizes, checksums, tokenizer)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument("overrides", nargs="*", help="config overrides, key=value (DataConfig keys, data.*, +experiment=)")
    arguments = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        cfg = load_data_config(arguments.config, arguments.overrides, arguments)
    except (ValueError, OmegaConfBaseException, HydraException) as error:  # a bad key or value: say which
        refuse(f"bad data config: {error}")
    try:
        return prepare_and_verify(cfg, arguments)
    except DataError as error:  # the data's or its config's: named in one line
        refuse(str(error))


def prepare_and_verify(cfg: DataConfig, arguments: argparse.Namespace) -> int:
    tokenizer = build_tokenizer(cfg)
    print(f"tokenizer: {tokenizer}")
    for source in cfg.sources:
        directory = prepared_directory(cfg, source, tokenizer)
        started = time.perf_counter()
        if not arguments.verify:
            prepare_source(cfg, source, tokenizer, directory, progress=not arguments.no_progress)
        splits = {
            split: open_split(
                directory, split, expected_tokenizer=tokenizer.identity,
                expected_validation_fraction=cfg.validation_fraction, verify_checksums=True,
            )
            for split in ("train", "validation")
        }
        seconds = time.perf_counter() - started
        total = sum(stream.num_tokens for stream in splits.values())
        print(f"{source.name}: {directory}")
        for split, stream in splits.items():
            print(f"  {split:10s} {stream.num_tokens:>15,d} tokens {stream.num_documents:>12,d} documents "
                  f"{len(stream.shards):>6d} shards")
        print(f"  {'verified' if arguments.verify else 'prepared and verified'} in {seconds:.1f} s ({total / max(seconds, 1e-9):,.0f} tokens/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
