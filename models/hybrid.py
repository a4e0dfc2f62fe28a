"""The hybrid language model: a pattern string of Mamba-2 / attention / MLP blocks.

    h_0    = embeddings(input_ids)
    h_i+1  = h_i + mixer_i(rmsnorm_i(h_i))        mixer by pattern symbol: M Mamba-2, * attention, - MLP
    logits = lm_head(norm_f(h_n))                 untied from the embeddings

Module and parameter names are Hugging Face NemotronH's (``embeddings``, ``layers.{i}.norm``,
``layers.{i}.mixer.*``, ``norm_f``, ``lm_head``), so models.hf maps state dicts by prefix only.

Building follows the meta-device pattern: ``build_model(cfg)`` on the current default device
(the trainer uses ``torch.device("meta")``), then ``model.to_empty(device=...)``,
``torch.manual_seed(s)``, ``model.init_weights()``. ``init_weights`` writes every parameter
(the model has no buffers), so nothing depends on constructor-time init, and the result is a
function of the seed. Init (Megatron): linears and embeddings ~ N(0, init_std); residual output
projections (o_proj, out_proj, down_proj) ~ N(0, init_std / sqrt(2 * num_blocks)) when
scale_residual_init; norms = 1; Mamba parameters as models.mamba2 says.

Weight decay: A_log, D and dt_bias carry ``param._no_weight_decay = True``. ``to_empty`` (and
FSDP2's ``fully_shard``) replace Parameter objects and drop such attributes, so
``init_weights`` sets them again, ``mark_no_weight_decay()`` re-applies them at any time, and
``no_weight_decay_names()`` gives the same set by fully qualified name (robust to re-wrapping).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from models.attention import Attention
from models.config import PATTERN_SYMBOLS, ModelConfig
from models.kernels import resolve_backend, resolve_conv_backend
from models.mamba2 import NO_WEIGHT_DECAY_PARAMS, Mamba2Mixer
from models.mlp import MLP
from models.norms import RMSNorm

_MIXERS = {"M": Mamba2Mixer, "*": Attention, "-": MLP}


class HybridBlock(nn.Module):
    """Pre-norm residual block: x + mixer(norm(x)); ``symbol`` says which mixer (M, *, -)."""

    def __init__(self, cfg: ModelConfig, symbol: str, index: int):
        super().__init__()
        if symbol not in _MIXERS:
            raise ValueError(f"ModelConfig.pattern: unknown symbol {symbol!r} at block {index}")
        self.symbol = symbol
        self.index = index
        self.norm = RMSNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.mixer = _MIXERS[symbol](cfg)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return hidden_states + self.mixer(self.norm(hidden_states))

    def extra_repr(self) -> str:
        return f"symbol={self.symbol!r} ({PATTERN_SYMBOLS[self.symbol]})"


class HybridLM(nn.Module):
    """Causal LM over a hybrid block stack: LongTensor[B, T] -> logits Tensor[B, T, vocab]."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(HybridBlock(cfg, symbol, i) for i, symbol in enumerate(cfg.pattern))
        self.norm_f = RMSNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    @property
    def residual_init_std(self) -> float:
        """Init std of residual output projections (o_proj, out_proj, down_proj)."""
        cfg = self.config
        return cfg.init_std / math.sqrt(2 * cfg.num_blocks) if cfg.scale_residual_init else cfg.init_std

    @torch.no_grad()
    def init_weights(self) -> None:
        """(Re)initialize every parameter in place, drawing from torch's global RNG on the params' device."""
        cfg = self.config
        nn.init.normal_(self.embeddings.weight, mean=0.0, std=cfg.init_std)
        for block in self.layers:
            block.norm.init_weights()
            block.mixer.init_weights(self.residual_init_std)
        self.norm_f.init_weights()
        nn.init.normal_(self.lm_head.weight, mean=0.0, std=cfg.init_std)
        self.mark_no_weight_decay()
        self._resolve_kernels(self.embeddings.weight.device)

    def _resolve_kernels(self, device: torch.device) -> None:
        # Decide the kernel backends once, eagerly, so torch.compile later reads cached answers.
        if device.type == "meta":
            return
        cfg = self.config
        if "M" in cfg.pattern:
            resolve_backend(cfg.ssd_backend, device, "ssd_backend")
            resolve_backend(cfg.gated_norm_backend, device, "gated_norm_backend")
            resolve_conv_backend(cfg.conv_backend, device)

    def mark_no_weight_decay(self) -> None:
        """Set ``param._no_weight_decay = True`` on every A_log, D, dt_bias."""
        for block in self.layers:
            if isinstance(block.mixer, Mamba2Mixer):
                block.mixer.mark_no_weight_decay()

    def no_weight_decay_names(self) -> set[str]:
        """Fully qualified names of the parameters that take no weight decay (A_log, D, dt_bias)."""
        return {
            f"layers.{i}.mixer.{name}"
            for i, block in enumerate(self.layers)
            if block.symbol == "M"
            for name in NO_WEIGHT_DECAY_PARAMS
        }

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if input_ids.dim() != 2:
            raise ValueError(f"HybridLM expects input_ids of shape [batch, seq], got {tuple(input_ids.shape)}")
        hidden_states = self.embeddings(input_ids)
        for block in self.layers:
            hidden_states = block(hidden_states)
        return self.lm_head(self.norm_f(hidden_states))


def build_model(cfg: ModelConfig) -> HybridLM:
    """Validate ``cfg`` (ValueError naming the field) and build the model on the current default device.

    On a real device (CPU, CUDA) the model is ready to run: ``init_weights()`` has been called,
    drawing from torch's global RNG (seed it first for a reproducible model). Some parameters
    (A_log, D, dt_bias, norm weights) are allocated uninitialized by the constructors, so
    without it the logits would be garbage or NaN. On the meta device nothing is initialized:
    the trainer's path is ``to_empty(device=...)``, seed, then ``init_weights()``.
    """
    cfg.validate()
    model = HybridLM(cfg)
    if model.embeddings.weight.device.type != "meta":
        model.init_weights()
    return model
