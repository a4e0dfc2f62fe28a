"""Optional fast paths of the model, each behind one import site with a torch fallback.

- ``has_mamba_ssm_triton()``: mamba_ssm's Triton SSD and gated RMSNorm are usable here
  (CUDA present, triton and mamba_ssm importable without the package's compiled extension;
  see ``mamba_ssm_triton``).
- ``resolve_backend(requested, device, field)``: turns a config's 'auto' | 'triton' | 'torch'
  into the backend to run on ``device``; asking for 'triton' where it cannot run is an error.
- ``causal_conv``: the causal depthwise conv1d + SiLU, eager reference and compiled form.

Nothing heavy is imported at package import: triton and mamba_ssm load on first use.
"""

from __future__ import annotations

import torch

from models.kernels import mamba_ssm_triton


def has_mamba_ssm_triton() -> bool:
    """True when mamba_ssm's Triton kernels can run here (a CUDA device and the imports work)."""
    return torch.cuda.is_available() and mamba_ssm_triton.importable()


# (requested, device type) -> resolved backend. A plain dict: once an eager call (or
# HybridLM.init_weights) has filled it, torch.compile reads it without tracing the checks.
_RESOLVED: dict[tuple[str, str], str] = {}


def resolve_backend(requested: str, device: torch.device, field: str) -> str:
    """'triton' or 'torch' for a kernel on ``device``, from the config value ``requested``."""
    key = (requested, device.type)
    if key not in _RESOLVED:
        _RESOLVED[key] = _resolve_backend(requested, device, field)
    return _RESOLVED[key]


def _resolve_backend(requested: str, device: torch.device, field: str) -> str:
    if requested == "torch":
        return "torch"
    on_cuda = device.type == "cuda"
    if requested == "auto":
        return "triton" if on_cuda and has_mamba_ssm_triton() else "torch"
    if requested == "triton":
        if not on_cuda:
            raise RuntimeError(f"ModelConfig.{field}='triton' needs CUDA tensors, got device {device}")
        if not has_mamba_ssm_triton():
            raise RuntimeError(f"ModelConfig.{field}='triton' but {mamba_ssm_triton.INSTALL_HINT}")
        return "triton"
    raise ValueError(f"ModelConfig.{field} must be 'auto', 'triton' or 'torch', got {requested!r}")


def resolve_conv_backend(requested: str, device: torch.device) -> str:
    """'compiled' or 'conv1d' for the causal conv on ``device``, from ModelConfig.conv_backend."""
    if requested == "auto":
        return "compiled" if device.type == "cuda" else "conv1d"
    if requested in ("compiled", "conv1d"):
        return requested
    raise ValueError(f"ModelConfig.conv_backend must be 'auto', 'compiled' or 'conv1d', got {requested!r}")


__all__ = ["has_mamba_ssm_triton", "resolve_backend", "resolve_conv_backend"]
