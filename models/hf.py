"""Interchange with Hugging Face transformers' NemotronH (``NemotronHForCausalLM``).

``export_hf(model, out_dir)`` writes ``config.json`` (a ``NemotronHConfig``) and safetensors
weights that ``transformers.AutoModelForCausalLM.from_pretrained(out_dir)`` loads;
``import_hf(path)`` builds a ``HybridLM`` from such a directory (config and weights).

Weight names: ours are HF's without the prefix of the backbone. In memory transformers calls
it ``model.`` (``model.layers.{i}.mixer.in_proj.weight``); on disk NemotronH checkpoints —
NVIDIA's released ones, and what transformers' ``save_pretrained`` writes back — call it
``backbone.`` (transformers renames on load and save). We write ``backbone.*`` and read both.
``lm_head.weight`` has no prefix. Shapes are identical (conv1d weight (C, 1, K) included).

Mamba-2 in_proj rows and conv1d channels: HF (and Megatron) store the canonical order, in_proj [z, x,
B, C, dt] and conv [x, B, C]; ours is group-major (models.mamba2: per group [z_g, x_g, B_g, C_g,
dt_g] and [x_g, B_g, C_g]). ``to_hf_state_dict`` (so ``export_hf``) permutes ours into HF's,
``read_hf_state_dict`` (so ``import_hf`` and the trainer's ``checkpoint.init_from_hf``) HF's into
ours (``mamba_to_group_major`` / ``mamba_to_canonical``); with one group nothing moves.

Config fields: ours map one to one (table in ``hf_config_kwargs``). One semantic difference:
transformers' NemotronH clamps dt = softplus(dt_raw + dt_bias) from below at its
``time_step_min`` in the forward, while Megatron and mamba_ssm (which train these models) do
not clamp. Our ``time_step_clamp_min`` chooses; ``import_hf`` sets it to HF's ``time_step_min``
so an imported model computes what transformers computes, and ``export_hf`` warns when the
exported model's clamp differs from what transformers will apply.

transformers and safetensors are imported inside the functions (the model package stays light).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import torch

from models.config import ModelConfig
from models.hybrid import HybridLM, build_model
from models.mamba2 import conv_group_major_index, in_proj_group_major_index, inverse_index

logger = logging.getLogger(__name__)

_LAYER_TYPES = {"M": "linear_attention", "*": "full_attention", "-": "mlp"}
_PATTERN_OF_LAYER_TYPE = {v: k for k, v in _LAYER_TYPES.items()}


_BACKBONE_PREFIXES = ("model.", "backbone.")


def to_hf_key(name: str, prefix: str = "model.") -> str:
    """Our parameter name -> NemotronHForCausalLM's (``prefix`` 'model.' in memory, 'backbone.' on disk)."""
    return name if name.startswith("lm_head.") else f"{prefix}{name}"


def from_hf_key(name: str) -> str:
    """A NemotronH parameter name (in memory 'model.*' or on disk 'backbone.*', or 'lm_head.*') -> ours."""
    if name.startswith("lm_head."):
        return name
    for prefix in _BACKBONE_PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix) :]
    raise KeyError(f"unexpected NemotronH weight name {name!r} (expected 'backbone.*', 'model.*' or 'lm_head.*')")


def hf_config_kwargs(cfg: ModelConfig) -> dict:
    """The ``NemotronHConfig`` keyword arguments describing ``cfg``."""
    kwargs = dict(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        layers_block_type=[_LAYER_TYPES[s] for s in cfg.pattern],
        tie_word_embeddings=False,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        head_dim=cfg.attention_head_dim,
        attention_bias=False,
        attention_dropout=0.0,
        intermediate_size=cfg.ffn_hidden_size,
        mlp_hidden_act="relu2",
        mlp_bias=False,
        ssm_state_size=cfg.ssm_state_size,
        mamba_num_heads=cfg.mamba_num_heads,
        mamba_head_dim=cfg.mamba_head_dim,
        mamba_hidden_act="silu",
        n_groups=cfg.mamba_num_groups,
        conv_kernel=cfg.conv_kernel,
        use_conv_bias=True,
        mamba_proj_bias=False,
        use_bias=False,
        chunk_size=cfg.chunk_size,
        time_step_min=cfg.time_step_min,
        time_step_max=cfg.time_step_max,
        time_step_floor=cfg.time_step_floor,
        time_step_limit=(cfg.time_step_clamp_min, float("inf")),
        layer_norm_epsilon=cfg.norm_eps,
        initializer_range=cfg.init_std,
        rescale_prenorm_residual=cfg.scale_residual_init,
        residual_in_fp32=False,
        hidden_dropout=0.0,
    )
    if cfg.mamba_inner_size % cfg.hidden_size == 0:
        kwargs["expand"] = cfg.mamba_inner_size // cfg.hidden_size  # informational; HF uses heads * head_dim
    return kwargs


_MAMBA_PERMUTED = {"in_proj.weight": in_proj_group_major_index, "conv1d.weight": conv_group_major_index,
                   "conv1d.bias": conv_group_major_index}
"""Mamba-2 tensors whose dim 0 is stored group-major here and canonically in HF: name suffix -> index."""


def _permute_mamba(state_dict: dict[str, torch.Tensor], cfg: ModelConfig, to_hf: bool) -> dict[str, torch.Tensor]:
    """``state_dict`` (our names) with every Mamba-2 in_proj / conv1d permuted along dim 0 (a new dict)."""
    if cfg.mamba_num_groups == 1:
        return dict(state_dict)  # one group: the orders coincide
    out = dict(state_dict)
    for i, symbol in enumerate(cfg.pattern):
        if symbol != "M":
            continue
        for suffix, index_of in _MAMBA_PERMUTED.items():
            name = f"layers.{i}.mixer.{suffix}"
            if name in out:
                index = index_of(cfg)
                if to_hf:
                    index = inverse_index(index)
                out[name] = out[name][index.to(out[name].device)]
    return out


def mamba_to_group_major(state_dict: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """A state dict under our names with HF's canonical Mamba-2 layout -> ours (group-major); a new dict."""
    return _permute_mamba(state_dict, cfg, to_hf=False)


def mamba_to_canonical(state_dict: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """A state dict under our names in our group-major Mamba-2 layout -> HF's canonical one; a new dict."""
    return _permute_mamba(state_dict, cfg, to_hf=True)


def to_hf_state_dict(
    model: HybridLM, dtype: torch.dtype | None = None, prefix: str = "model."
) -> dict[str, torch.Tensor]:
    """Our state dict under NemotronH names (``prefix`` as in ``to_hf_key``) and in HF's Mamba-2
    layout (in_proj and conv1d permuted from group-major), detached, contiguous, optionally cast to
    ``dtype``."""
    out = {}
    for name, tensor in mamba_to_canonical(model.state_dict(), model.config).items():
        tensor = tensor.detach()
        if dtype is not None:
            tensor = tensor.to(dtype)
        out[to_hf_key(name, prefix)] = tensor.contiguous()
    return out


def _check_against_hf_layout(hf_config, state_dict: dict[str, torch.Tensor]) -> None:
    """Raise if names or shapes differ from what NemotronHForCausalLM(hf_config) holds."""
    from transformers import NemotronHForCausalLM

    with torch.device("meta"):
        reference = NemotronHForCausalLM(hf_config)
    expected = {name: tuple(t.shape) for name, t in reference.state_dict().items()}
    missing = sorted(set(expected) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(expected))
    if missing or unexpected:
        raise ValueError(f"export_hf: weight names do not match NemotronH: missing {missing[:8]}, unexpected {unexpected[:8]}")
    for name, shape in expected.items():
        if tuple(state_dict[name].shape) != shape:
            raise ValueError(f"export_hf: {name} has shape {tuple(state_dict[name].shape)}, NemotronH expects {shape}")


def special_token_ids(tokenizer) -> dict:
    """``bos_token_id``, ``eos_token_id``, ``pad_token_id`` of a transformers tokenizer (None where it has none)."""
    return {f"{kind}_token_id": getattr(tokenizer, f"{kind}_token_id", None) for kind in ("bos", "eos", "pad")}


def export_hf(
    model: HybridLM,
    out_dir: str | os.PathLike,
    dtype: torch.dtype | None = None,
    max_shard_size: str | int = "5GB",
    tokenizer=None,
    **config_overrides,
) -> Path:
    """Write ``model`` as a Hugging Face NemotronH directory (config.json + safetensors); return its path.

    ``dtype`` casts the weights (default: as they are). ``tokenizer`` (a transformers tokenizer,
    e.g. ``trainer.hf.tokenizer.to_transformers(...)``) is saved beside them (tokenizer.json,
    tokenizer_config.json) and its special-token ids go into config.json and
    generation_config.json, so ``generate()`` stops on its EOS. Without one the ids are left
    unset (null) rather than NemotronHConfig's defaults, which name arbitrary tokens of another
    vocabulary. ``config_overrides`` go to ``NemotronHConfig`` last.
    The model must be unsharded (a plain module, e.g. after gathering a checkpoint).
    """
    from huggingface_hub import save_torch_state_dict
    from transformers import GenerationConfig, NemotronHConfig

    cfg = model.config
    cfg.validate()
    kwargs = hf_config_kwargs(cfg)
    kwargs.update(special_token_ids(tokenizer))
    kwargs.update(config_overrides)
    hf_config = NemotronHConfig(**kwargs)
    state_dict = to_hf_state_dict(model, dtype)  # in-memory names, checked against transformers' model
    _check_against_hf_layout(hf_config, state_dict)
    state_dict = {to_hf_key(from_hf_key(name), "backbone."): t.cpu() for name, t in state_dict.items()}
    weight_dtype = next(iter(state_dict.values())).dtype
    hf_config.dtype = weight_dtype
    hf_config.architectures = ["NemotronHForCausalLM"]
    if "M" in cfg.pattern and cfg.time_step_clamp_min != hf_config.time_step_min:
        logger.warning(
            "export_hf: transformers' NemotronH clamps dt at time_step_min=%g in its forward; this model "
            "uses time_step_clamp_min=%g, so its outputs in transformers differ slightly where "
            "softplus(dt + dt_bias) < %g.",
            hf_config.time_step_min, cfg.time_step_clamp_min, hf_config.time_step_min,
        )
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    hf_config.save_pretrained(out_dir)
    save_torch_state_dict(state_dict, out_dir, max_shard_size=max_shard_size, metadata={"format": "pt"})
    if hf_config.eos_token_id is not None:
        GenerationConfig(bos_token_id=hf_config.bos_token_id, eos_token_id=hf_config.eos_token_id,
                         pad_token_id=hf_config.pad_token_id).save_pretrained(out_dir)
    if tokenizer is not None:
        tokenizer.save_pretrained(out_dir)
    return out_dir


def model_config_from_hf(hf_config, name: str = "hf_import") -> ModelConfig:
    """ModelConfig for a Hugging Face NemotronHConfig; unsupported features raise ValueError."""
    layer_types = list(hf_config.layers_block_type)
    unknown = sorted({t for t in layer_types if t not in _PATTERN_OF_LAYER_TYPE})
    if unknown:
        raise ValueError(f"import_hf: layer types {unknown} are not supported (only Mamba-2, attention, MLP)")
    unsupported = {
        "tie_word_embeddings": (hf_config.tie_word_embeddings, False),
        "attention_bias": (hf_config.attention_bias, False),
        "mlp_bias": (hf_config.mlp_bias, False),
        "use_bias": (hf_config.use_bias, False),
        "mamba_proj_bias": (getattr(hf_config, "mamba_proj_bias", False), False),
        "use_conv_bias": (hf_config.use_conv_bias, True),
        "mlp_hidden_act": (hf_config.mlp_hidden_act, "relu2"),
        "mamba_hidden_act": (hf_config.mamba_hidden_act, "silu"),
    }
    for field, (value, wanted) in unsupported.items():
        if value != wanted:
            raise ValueError(f"import_hf: NemotronHConfig.{field}={value!r} is not supported (need {wanted!r})")
    time_step_limit = tuple(hf_config.time_step_limit)
    return ModelConfig(
        name=name,
        pattern="".join(_PATTERN_OF_LAYER_TYPE[t] for t in layer_types),
        vocab_size=hf_config.vocab_size,
        hidden_size=hf_config.hidden_size,
        ffn_hidden_size=hf_config.intermediate_size,
        num_attention_heads=hf_config.num_attention_heads,
        num_key_value_heads=hf_config.num_key_value_heads,
        attention_head_dim=hf_config.head_dim,
        mamba_num_heads=hf_config.mamba_num_heads,
        mamba_head_dim=hf_config.mamba_head_dim,
        ssm_state_size=hf_config.ssm_state_size,
        mamba_num_groups=hf_config.n_groups,
        conv_kernel=hf_config.conv_kernel,
        chunk_size=hf_config.chunk_size,
        norm_eps=hf_config.layer_norm_epsilon,
        init_std=hf_config.initializer_range,
        scale_residual_init=hf_config.rescale_prenorm_residual,
        time_step_min=hf_config.time_step_min,
        time_step_max=hf_config.time_step_max,
        time_step_floor=hf_config.time_step_floor,
        # transformers' forward clamps dt at time_step_min (its time_step_limit is not read);
        # reproduce what transformers computes from this directory.
        time_step_clamp_min=max(float(hf_config.time_step_min), float(time_step_limit[0])),
    ).validate()


def _load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    index = path / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (path / "model.safetensors").exists():
        files = ["model.safetensors"]
    else:
        raise FileNotFoundError(f"import_hf: no model.safetensors or model.safetensors.index.json in {path}")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        tensors.update(load_file(str(path / file)))
    return tensors


def read_hf_model_config(path: str | os.PathLike) -> ModelConfig:
    """The ModelConfig of a Hugging Face NemotronH directory's config.json (named after the directory)."""
    from transformers import NemotronHConfig

    path = Path(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} is not a Hugging Face model directory (no config.json)")
    return model_config_from_hf(NemotronHConfig.from_pretrained(path), name=path.name or "hf_import")


def read_hf_state_dict(
    path: str | os.PathLike, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
    cfg: ModelConfig | None = None,
) -> dict[str, torch.Tensor]:
    """The weights of a Hugging Face NemotronH directory under our names and in our layout (Mamba-2
    in_proj and conv1d permuted to group-major, by ``cfg`` or else the directory's config.json), cast
    to ``dtype``; multi-token-prediction weights (``mtp.*``), which transformers also ignores, are skipped."""
    path = Path(path)
    state_dict = {
        from_hf_key(name): tensor.to(device=device, dtype=dtype)
        for name, tensor in _load_safetensors(path).items()
        if not name.startswith("mtp.")
    }
    return mamba_to_group_major(state_dict, cfg if cfg is not None else read_hf_model_config(path))


def import_hf(
    path: str | os.PathLike,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    **config_overrides,
) -> HybridLM:
    """Build a HybridLM from a Hugging Face NemotronH directory (config.json + safetensors).

    Weights are cast to ``dtype`` on ``device``. ``config_overrides`` replace ModelConfig
    fields that do not change the architecture (e.g. ``ssd_backend``, ``name``).
    Multi-token-prediction weights (``mtp.*``), which transformers also ignores, are skipped.
    """
    path = Path(path)
    cfg = read_hf_model_config(path)
    if config_overrides:
        cfg = ModelConfig(**{**cfg.__dict__, **config_overrides}).validate()
    state_dict = read_hf_state_dict(path, dtype=dtype, device=device, cfg=cfg)
    with torch.device("meta"):
        model = build_model(cfg)
    # assign=True adopts the loaded tensors as parameters; strict=True names any missing or
    # unexpected weight, and shapes are checked.
    model.load_state_dict(state_dict, strict=True, assign=True)
    model.mark_no_weight_decay()
    return model
