"""sha256 of a file, as token shards and checkpoint files record it."""

from __future__ import annotations

import hashlib
from pathlib import Path


def file_sha256(path: Path) -> str:
    """sha256 of a file, read in 8 MB blocks (hashlib releases the GIL, so threads run in parallel)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(8 << 20):
            digest.update(block)
    return digest.hexdigest()
