"""Checksums of a checkpoint's files: recorded when it is committed, verified before it is read.

A committed checkpoint directory holds `integrity.json`:

    {"algorithm": "sha256", "files": {"<name>": {"bytes": <size>, "sha256": "<hex>"}, ...}}

listing every other file of the directory (DCP's `.metadata` and `.distcp` shards,
trainer_state.json, rng_rank{r}.json). It is written last, inside the `.tmp_` directory, before
the rename that makes the checkpoint visible; so a visible checkpoint without it, or whose files
differ from it, was damaged after it was committed (or saved by a trainer older than this file).

Verification compares sizes (a stat per file: catches truncated and missing files) and, unless
switched off, each file's sha256. Nothing is unpickled before it passes: `.metadata` is a
pickle that DCP loads, so it is checked here first. The hashing is split over ranks
(rank r hashes files r, r + w, ... of the sorted list) and over threads (hashlib releases the
GIL while it hashes), as data/shards.py does for token shards. Measured throughput: see
docs/reliability.md.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List

from fileio.hashing import file_sha256

MANIFEST_NAME = "integrity.json"
ALGORITHM = "sha256"


def describe_file(path: Path) -> dict:
    """{"bytes": size, "sha256": hex digest} of one file."""
    return {"bytes": path.stat().st_size, ALGORITHM: file_sha256(path)}


def describe_files(directory: Path, names: List[str]) -> Dict[str, dict]:
    """describe_file for each name (relative to `directory`), hashed on a few threads."""
    workers = max(1, min(8, len(names), os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        described = list(pool.map(lambda name: describe_file(directory / name), names))
    return dict(zip(names, described))


def write_manifest(directory: Path, files: Dict[str, dict]) -> None:
    """Write integrity.json and fsync it (the caller renames the directory afterwards)."""
    path = directory / MANIFEST_NAME
    with open(path, "w") as handle:
        json.dump({"algorithm": ALGORITHM, "files": dict(sorted(files.items()))}, handle, indent=1)
        handle.flush()
        os.fsync(handle.fileno())


def read_manifest(directory: Path) -> Dict[str, dict]:
    """The recorded files of a checkpoint; raises ValueError (naming the file) when absent or unreadable."""
    path = directory / MANIFEST_NAME
    if not path.is_file():
        raise ValueError(f"{path} is missing (the checkpoint was damaged, or saved by a trainer without checksums)")
    try:
        manifest = json.loads(path.read_text())
        files = manifest["files"]
        if manifest.get("algorithm") != ALGORITHM or not isinstance(files, dict):
            raise ValueError(f"algorithm {manifest.get('algorithm')!r}, expected {ALGORITHM!r}")
        for name, entry in files.items():
            if "/" in name or name.startswith(".."):  # names are plain file names inside the directory
                raise ValueError(f"file name {name!r} points outside the checkpoint")
            int(entry["bytes"]), str(entry[ALGORITHM])
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is unreadable: {type(error).__name__}: {error}") from error
    return files


def check_files(directory: Path, files: Dict[str, dict], *, hash_files: bool, rank: int = 0,
                world_size: int = 1) -> List[str]:
    """Problems found in `directory` against the recorded `files` (empty when intact).

    Every rank checks every size (cheap); rank r hashes the files r, r + w, ... of the sorted names,
    so the ranks together hash each file once. Files present but not recorded are not read by the
    trainer and are not problems.
    """
    problems = []
    names = sorted(files)
    for name in names:
        path = directory / name
        if not path.is_file():
            problems.append(f"{path} is missing")
        elif path.stat().st_size != files[name]["bytes"]:
            problems.append(f"{path} has {path.stat().st_size} bytes, {files[name]['bytes']} were written "
                            "(truncated or overwritten)")
    if problems or not hash_files:
        return problems
    mine = names[rank::world_size]
    for name, found in describe_files(directory, mine).items():
        if found[ALGORITHM] != files[name][ALGORITHM]:
            problems.append(f"{directory / name} has {ALGORITHM} {found[ALGORITHM][:16]}..., "
                            f"{files[name][ALGORITHM][:16]}... was recorded (its content changed)")
    return problems


def verify_directory(directory: Path, *, hash_files: bool, rank: int = 0, world_size: int = 1) -> List[str]:
    """This rank's share of the problems of a checkpoint directory (see check_files).

    With hash_files=False (checkpoint.verify=false, a knowing choice) a directory without a manifest,
    as trainers before this file saved them, is accepted: there is nothing to check it against.
    """
    if not hash_files and not (directory / MANIFEST_NAME).exists():
        return []
    try:
        files = read_manifest(directory)
    except ValueError as error:
        return [str(error)]
    return check_files(directory, files, hash_files=hash_files, rank=rank, world_size=world_size)
