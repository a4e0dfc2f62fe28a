"""Shared test setup: GPU tests skip where CUDA is absent; everything is seeded per test."""

from __future__ import annotations

import os

import pytest
import torch

# Two CPU cores in CI: keep torch from oversubscribing them when pytest runs in parallel.
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (run `pytest -m gpu` on the GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(autouse=True)
def _fresh_seed(request):
    """Seed from the test's name: reproducible, yet different tensors in every test."""
    import zlib

    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))
    yield
