"""Helpers shared by the model tests (imported as `model_testing`; tests/models is on sys.path under pytest's default import mode)."""

from __future__ import annotations

import dataclasses

import torch

from models import HybridLM, ModelConfig, build_model
from models.config import load_model_config


def tiny_config(**overrides) -> ModelConfig:
    """configs/model/tiny.yaml with field overrides."""
    return dataclasses.replace(load_model_config("tiny"), **overrides)


def make_model(cfg: ModelConfig, seed: int = 0, device: str = "cpu", dtype: torch.dtype = torch.float32) -> HybridLM:
    """The trainer's sequence: build on meta, materialize, seed, init_weights."""
    with torch.device("meta"):
        model = build_model(cfg)
    model.to_empty(device=device)
    torch.manual_seed(seed)
    model.init_weights()
    return model.to(dtype)


@torch.no_grad()
def randomize_trivial_params(model: torch.nn.Module, scale: float = 0.1) -> None:
    """Perturb parameters that init sets to constants (norm weights = 1, D = 1), so tests never
    compare on trivial values."""
    for name, param in model.named_parameters():
        if param.dim() == 1 and not name.endswith(("dt_bias", "A_log", "conv1d.bias")):
            param.add_(scale * torch.randn_like(param))
