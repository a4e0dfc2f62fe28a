"""The one import site of mamba_ssm's Triton kernels.

mamba_ssm's package ``__init__`` imports its compiled CUDA extension
(``selective_scan_cuda``), which is not built on our machines
(``MAMBA_SKIP_CUDA_BUILD=TRUE``). Its Triton kernels need no extension, so we load them
without running that ``__init__``: register a bare package module ``mamba_ssm`` whose
``__path__`` is the installed package folder (found with ``importlib.util.find_spec``,
which does not execute the package), then import the submodules normally. Their own
``__init__.py`` files are empty.

Loaded here:
- ``mamba_ssm.ops.triton.ssd_combined.mamba_chunk_scan_combined`` (chunked SSD, fwd + bwd)
- ``mamba_ssm.ops.triton.layernorm_gated.rmsnorm_fn`` (gated grouped RMSNorm, fwd + bwd)

If ``mamba_ssm`` is already fully imported (an install with its extension), that package is
used as it is. A bare package left in ``sys.modules`` means a later plain ``import mamba_ssm``
returns it rather than the full package; the model never needs the full package.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
import types
from typing import Callable

import torch

INSTALL_HINT = (
    "mamba_ssm's Triton kernels need a CUDA GPU, triton and mamba-ssm installed without its CUDA "
    "extension: MAMBA_SKIP_CUDA_BUILD=TRUE MAMBA_FORCE_BUILD=TRUE "
    "pip install --no-build-isolation --no-deps mamba-ssm==2.3.2.post1"
)


def _register_bare_package() -> None:
    """Put a module for ``mamba_ssm`` in sys.modules without executing its ``__init__``."""
    if "mamba_ssm" in sys.modules:
        return
    spec = importlib.util.find_spec("mamba_ssm")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"mamba_ssm is not installed. {INSTALL_HINT}")
    package = types.ModuleType("mamba_ssm")
    package.__path__ = list(spec.submodule_search_locations)
    package.__spec__ = spec
    package.__file__ = spec.origin
    package.__package__ = "mamba_ssm"
    sys.modules["mamba_ssm"] = package


def import_mamba_ssm_submodule(name: str) -> types.ModuleType:
    """Import ``mamba_ssm.<name>`` (e.g. ``ops.triton.ssd_combined``) without the package init."""
    _register_bare_package()
    return importlib.import_module(f"mamba_ssm.{name}")


@functools.lru_cache(maxsize=None)
def _load() -> tuple[Callable, Callable]:
    ssd_combined = import_mamba_ssm_submodule("ops.triton.ssd_combined")
    layernorm_gated = import_mamba_ssm_submodule("ops.triton.layernorm_gated")
    return ssd_combined.mamba_chunk_scan_combined, layernorm_gated.rmsnorm_fn


@functools.lru_cache(maxsize=None)
def importable() -> bool:
    """True when triton and mamba_ssm's Triton modules import (no GPU check here)."""
    if importlib.util.find_spec("triton") is None or importlib.util.find_spec("mamba_ssm") is None:
        return False
    try:
        _load()
    except Exception:  # any import failure means "not available"; the caller falls back to torch
        return False
    return True


def mamba_chunk_scan_combined() -> Callable:
    """mamba_ssm's ``mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, D=..., dt_bias=..., ...)``."""
    return _load()[0]


def rmsnorm_fn() -> Callable:
    """mamba_ssm's ``rmsnorm_fn(x, weight, bias, z=None, eps=..., group_size=..., norm_before_gate=...)``."""
    return _load()[1]


# torch.compile must not trace into mamba_ssm's Python/Triton launch code: these wrappers make
# Dynamo break the graph cleanly around each call (autograd still records their backward).
@torch.compiler.disable
def chunk_scan(*args, **kwargs) -> torch.Tensor:
    """Call ``mamba_chunk_scan_combined`` outside any torch.compile graph."""
    return mamba_chunk_scan_combined()(*args, **kwargs)


@torch.compiler.disable
def gated_rmsnorm(*args, **kwargs) -> torch.Tensor:
    """Call ``rmsnorm_fn`` outside any torch.compile graph."""
    return rmsnorm_fn()(*args, **kwargs)
