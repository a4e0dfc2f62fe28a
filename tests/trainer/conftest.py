"""Fixtures of the trainer tests; `trainer_testing` importable from the subfolders too."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory):
    """One prepared tiny corpus and tokenizer for every trainer test of the session."""
    return tmp_path_factory.mktemp("trainer-data-cache")
