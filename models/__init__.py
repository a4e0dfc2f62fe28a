"""Hybrid Mamba-Transformer language models (Nemotron-H family) in plain PyTorch.

``build_model(cfg)`` -> ``HybridLM``; see docs/ARCHITECTURE.md for the interface. Imports stay
light: transformers, triton and mamba_ssm load only where used (models.hf, models.kernels).
"""

from __future__ import annotations

from models.config import ModelConfig
from models.hybrid import HybridBlock, HybridLM, build_model

__all__ = ["ModelConfig", "HybridBlock", "HybridLM", "build_model"]
