"""A checkpoint directory on disk: names, completeness, listing, trainer_state.json, setting aside.

    <dir>/step_00000100/             complete: DCP's .metadata and trainer_state.json are present
    <dir>/.tmp_step_00000200/        a save in progress
    <dir>/corrupt_step_00000300/     set aside after failing verification
    <dir>/superseded_step_00000400/  set aside as another history's

What each directory holds and how it is committed: trainer/checkpoint/checkpointer.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from trainer.checkpoint.errors import CorruptCheckpoint

PREFIX = "step_"
TMP_PREFIX = ".tmp_step_"
CORRUPT_PREFIX = "corrupt_"
SUPERSEDED_PREFIX = "superseded_"
STATE_FILE = "trainer_state.json"


def checkpoint_name(step: int) -> str:
    return f"{PREFIX}{step:08d}"


def step_of(path: Path) -> int:
    return int(path.name[len(PREFIX):])


def is_complete(path: Path) -> bool:
    return path.is_dir() and (path / ".metadata").exists() and (path / STATE_FILE).exists()


def step_directories(directory: Path) -> list:
    """Every step_N directory, complete or not, oldest first."""
    if not directory.is_dir():
        return []
    found = [p for p in directory.iterdir()
             if p.is_dir() and p.name.startswith(PREFIX) and p.name[len(PREFIX):].isdigit()]
    return sorted(found, key=step_of)


def list_checkpoints(directory: Path) -> list:
    """Complete checkpoints, oldest first."""
    return [p for p in step_directories(directory) if is_complete(p)]


def read_trainer_state(path: Path) -> dict:
    """trainer_state.json of a checkpoint, as JSON (never unpickled); errors name the file."""
    file = Path(path) / STATE_FILE
    try:
        state = json.loads(file.read_text())
        if not isinstance(state, dict) or not isinstance(state.get("step"), int):
            raise ValueError("not a JSON object with an integer 'step'")
        return state
    except (OSError, ValueError, UnicodeDecodeError) as error:
        raise CorruptCheckpoint(f"cannot read {file}: {type(error).__name__}: {error}") from error


def move_aside(path: Path, prefix: str) -> Path:
    """Rename a checkpoint out of the way (never delete it): <prefix><name>, -2, -3... if taken."""
    target = path.with_name(prefix + path.name)
    number = 2
    while target.exists():
        target = path.with_name(f"{prefix}{path.name}-{number}")
        number += 1
    os.rename(path, target)
    return target


def write_json(path: Path, value: dict) -> None:
    """Write and fsync (inside a `.tmp_` directory, which the commit renames)."""
    with open(path, "w") as handle:
        json.dump(value, handle, indent=1)
        handle.flush()
        os.fsync(handle.fileno())


def fsync_directory(directory: Path) -> None:
    """Persist a rename or a new entry in `directory` (POSIX: fsync the directory itself)."""
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
