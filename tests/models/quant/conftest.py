"""Fixtures of the quantization tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def kernels():
    """The Triton kernels package, switched on (its families: kernels.nvfp4, kernels.nvfp4_amax,
    kernels.epilogue, ...): the GPU kernel tests compare it with the torch references."""
    pytest.importorskip("triton")
    from models.quant import kernels as package

    package.use_triton(True)
    assert package.enabled()
    return package
