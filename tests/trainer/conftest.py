"""Fixtures of the trainer tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory):
    """One prepared tiny corpus and tokenizer for every trainer test of the session."""
    return tmp_path_factory.mktemp("trainer-data-cache")
