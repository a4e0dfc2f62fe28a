"""Tokenize a data config's sources into token shards (resumable), or verify prepared ones.

    python scripts/prepare_data.py                                   # the built-in corpus (configs/data/builtin.yaml)
    python scripts/prepare_data.py --config local_jsonl sources.0.path=/data/corpus/ num_proc=16
    python scripts/prepare_data.py --config configs/data/my.yaml prepared_dir=/fast/shards --verify

--config is a name under configs/data/ or a yaml path; the rest are `key=value` overrides of
DataConfig fields (dotted, list indices as numbers, values parsed as YAML). Interrupt at any
time and run the same command again: finished shards are kept. Prints, per source, the
directory, tokens and documents per split, and the rate.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parent.parent
if str(REPOSITORY) not in sys.path:  # run as a file from a checkout without `pip install -e .`
    sys.path.insert(0, str(REPOSITORY))

import yaml  # noqa: E402  (PyYAML comes with omegaconf)
from omegaconf import OmegaConf  # noqa: E402
from omegaconf.errors import OmegaConfBaseException  # noqa: E402

from data import DataConfig, build_tokenizer, prepare_source, prepared_directory, validate_data_config  # noqa: E402
from data.shards import open_split  # noqa: E402


def load_data_config(config: str, overrides: list[str]) -> DataConfig:
    """DataConfig from a configs/data name or yaml path plus key=value overrides (unknown keys fail, naming them)."""
    path = Path(config)
    if not path.suffix:
        path = REPOSITORY / "configs" / "data" / f"{config}.yaml"
    if not path.is_file():
        available = sorted(p.stem for p in (REPOSITORY / "configs" / "data").glob("*.yaml"))
        raise SystemExit(f"data config {config!r} not found (looked for {path}); available: {available}")
    merged = OmegaConf.merge(OmegaConf.structured(DataConfig), OmegaConf.load(path))
    for override in overrides:
        key, separator, value = override.partition("=")
        if not separator:
            raise SystemExit(f"override {override!r} is not key=value")
        OmegaConf.update(merged, key.removeprefix("data."), yaml.safe_load(value), merge=True)
    missing = sorted(OmegaConf.missing_keys(merged))
    if missing:
        raise SystemExit(f"{path}: set {missing} (e.g. {missing[0]}=...)")
    cfg = OmegaConf.to_object(merged)
    validate_data_config(cfg)
    return cfg


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="builtin", help="name under configs/data/ or a yaml file (default: builtin)")
    parser.add_argument("--verify", action="store_true", help="only verify prepared shards (sizes, checksums, tokenizer)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument("overrides", nargs="*", help="DataConfig overrides, key=value")
    arguments = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        cfg = load_data_config(arguments.config, arguments.overrides)
    except (ValueError, OmegaConfBaseException) as error:  # a bad key or value: say which, no traceback
        raise SystemExit(f"bad data config: {error}") from None
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
