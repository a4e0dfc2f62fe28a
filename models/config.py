"""Model configuration: the Nemotron-H hybrid family as one dataclass.

The layout is a pattern string, one symbol per block (Megatron's alphabet):
``M`` Mamba-2 mixer, ``*`` grouped-query attention, ``-`` squared-ReLU MLP.
Every block is pre-norm residual: ``x + mixer(rmsnorm(x))``.

Field names follow Hugging Face's ``NemotronHConfig`` where one exists, so that
``models.hf`` maps them one to one. ``ModelConfig.validate()`` checks a config
(``build_model`` calls it) and raises ``ValueError`` naming the offending field.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, fields
from pathlib import Path

PATTERN_SYMBOLS = {"M": "mamba", "*": "attention", "-": "mlp"}
KERNEL_BACKENDS = ("auto", "triton", "torch")
CONV_BACKENDS = ("auto", "compiled", "conv1d")


@dataclass
class ModelConfig:
    """Dimensions and initialization of a hybrid Mamba-Transformer language model."""

    name: str = "quickstart"
    """Label of this model config, used in run names and reports (equals the yaml file's name)."""
    pattern: str = "M-M*M-"
    """One symbol per block: 'M' Mamba-2, '*' attention, '-' squared-ReLU MLP."""
    vocab_size: int = 4096
    """Rows of the embedding and the LM head; must cover the tokenizer's vocabulary."""
    hidden_size: int = 256
    """Residual stream width (d_model)."""
    ffn_hidden_size: int = 1024
    """Inner width of the squared-ReLU MLP blocks."""
    num_attention_heads: int = 4
    """Query heads of each attention block."""
    num_key_value_heads: int = 2
    """Key/value heads of each attention block (GQA); divides num_attention_heads."""
    attention_head_dim: int = 64
    """Width of one attention head."""
    mamba_num_heads: int = 16
    """SSM heads of each Mamba-2 mixer; mamba_num_heads * mamba_head_dim is the inner width."""
    mamba_head_dim: int = 32
    """Channels per SSM head."""
    ssm_state_size: int = 32
    """State dimension N of the SSM (B and C have this width per group)."""
    mamba_num_groups: int = 2
    """Groups sharing B and C (like GQA for the SSM); divides mamba_num_heads. Also the groups of the gated RMSNorm."""
    conv_kernel: int = 4
    """Width of the causal depthwise conv1d over [x, B, C]."""
    chunk_size: int = 64
    """Chunk length of the SSD scan. Any sequence length works (the torch path pads the tail of the last chunk, which causality makes exact)."""
    norm_eps: float = 1e-5
    """Epsilon of every RMSNorm (block norms, final norm, the Mamba gated norm)."""
    init_std: float = 0.02
    """Standard deviation of the normal init of linear and embedding weights."""
    scale_residual_init: bool = True
    """Divide the init std of residual output projections (o_proj, out_proj, down_proj) by sqrt(2 * num_blocks)."""
    time_step_min: float = 0.001
    """Lower end of the log-uniform dt used to initialize dt_bias."""
    time_step_max: float = 0.1
    """Upper end of the log-uniform dt used to initialize dt_bias."""
    time_step_floor: float = 1e-4
    """Floor applied to the sampled dt before inverting softplus."""
    time_step_clamp_min: float = 0.0
    """Lower clamp of dt = softplus(dt_raw + dt_bias) in the forward. 0 = no clamp, as Megatron and mamba_ssm train; Hugging Face's NemotronH clamps at its time_step_min (import_hf sets this field to it)."""
    A_init_min: float = 1.0
    """Lower end of the uniform range A is drawn from (A_log = log(A))."""
    A_init_max: float = 16.0
    """Upper end of the uniform range A is drawn from."""
    ssd_backend: str = "auto"
    """SSD scan implementation: 'auto' (Triton from mamba_ssm on CUDA when importable, else torch), 'triton', or 'torch' (models/ssd.py)."""
    gated_norm_backend: str = "auto"
    """Mamba gated RMSNorm: 'auto' (mamba_ssm's Triton kernel on CUDA when importable, else torch), 'triton', or 'torch'."""
    conv_backend: str = "auto"
    """Causal depthwise conv1d + SiLU: 'auto' ('compiled' on CUDA, 'conv1d' elsewhere), 'compiled' (torch.compile of a fused shift-and-add form), or 'conv1d' (eager F.conv1d)."""

    @property
    def num_blocks(self) -> int:
        """Number of blocks (pattern symbols)."""
        return len(self.pattern)

    @property
    def mamba_inner_size(self) -> int:
        """Inner width of a Mamba-2 mixer: mamba_num_heads * mamba_head_dim."""
        return self.mamba_num_heads * self.mamba_head_dim

    def validate(self) -> ModelConfig:
        """Raise ValueError naming the first invalid field; return self when the config is sound."""
        if not isinstance(self.pattern, str) or not self.pattern:
            raise ValueError(f"ModelConfig.pattern must be a non-empty string of {sorted(PATTERN_SYMBOLS)}, got {self.pattern!r}")
        for position, symbol in enumerate(self.pattern):
            if symbol not in PATTERN_SYMBOLS:
                raise ValueError(
                    f"ModelConfig.pattern has unknown symbol {symbol!r} at position {position} "
                    f"(valid: 'M' Mamba-2, '*' attention, '-' MLP): {self.pattern!r}"
                )
        positive_ints = (
            "vocab_size", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_key_value_heads",
            "attention_head_dim", "mamba_num_heads", "mamba_head_dim", "ssm_state_size", "mamba_num_groups",
            "conv_kernel", "chunk_size",
        )
        for field_name in positive_ints:
            value = getattr(self, field_name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"ModelConfig.{field_name} must be a positive integer, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads != 0:
            raise ValueError(
                f"ModelConfig.num_key_value_heads ({self.num_key_value_heads}) must divide "
                f"num_attention_heads ({self.num_attention_heads})"
            )
        if self.mamba_num_heads % self.mamba_num_groups != 0:
            raise ValueError(
                f"ModelConfig.mamba_num_groups ({self.mamba_num_groups}) must divide "
                f"mamba_num_heads ({self.mamba_num_heads})"
            )
        positive_floats = ("norm_eps", "init_std", "time_step_min", "time_step_max", "A_init_min", "A_init_max")
        for field_name in positive_floats:
            value = getattr(self, field_name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"ModelConfig.{field_name} must be a positive finite number, got {value!r}")
        for field_name in ("time_step_floor", "time_step_clamp_min"):
            value = getattr(self, field_name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"ModelConfig.{field_name} must be a finite number >= 0, got {value!r}")
        if self.time_step_max < self.time_step_min:
            raise ValueError(
                f"ModelConfig.time_step_max ({self.time_step_max}) must be >= time_step_min ({self.time_step_min})"
            )
        if self.A_init_max < self.A_init_min:
            raise ValueError(f"ModelConfig.A_init_max ({self.A_init_max}) must be >= A_init_min ({self.A_init_min})")
        for field_name in ("ssd_backend", "gated_norm_backend"):
            value = getattr(self, field_name)
            if value not in KERNEL_BACKENDS:
                raise ValueError(f"ModelConfig.{field_name} must be one of {KERNEL_BACKENDS}, got {value!r}")
        if self.conv_backend not in CONV_BACKENDS:
            raise ValueError(f"ModelConfig.conv_backend must be one of {CONV_BACKENDS}, got {self.conv_backend!r}")
        return self


MODEL_CONFIG_FIELDS = tuple(f.name for f in fields(ModelConfig))

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs" / "model"
"""Where the named model configs live: configs/model/<name>.yaml."""


def load_model_config(name_or_path: str | os.PathLike, **overrides) -> ModelConfig:
    """ModelConfig from configs/model/<name>.yaml (or a yaml path), with field overrides; validated.

    Goes through OmegaConf's structured schema, as Hydra does, so an unknown key or a wrongly
    typed value fails here naming it.
    """
    from omegaconf import OmegaConf

    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml"):
        path = CONFIG_DIR / f"{name_or_path}.yaml"
    if not path.exists():
        available = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))
        raise FileNotFoundError(f"model config {str(name_or_path)!r} not found (available: {available})")
    merged = OmegaConf.merge(OmegaConf.structured(ModelConfig), OmegaConf.load(path), overrides)
    return OmegaConf.to_object(merged).validate()
