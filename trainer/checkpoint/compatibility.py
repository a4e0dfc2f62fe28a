"""Is a checkpoint's model the run's model? Compared before anything is loaded or pruned.

A checkpoint records (trainer_state.json) the model config it was saved with, the resolved
precision backend, and its parameter layout: every state-dict entry's name and global shape.
Resume compares all three with the run:

- model config: every ModelConfig field except those below, which cannot change what the
  parameters are or compute (a label, kernel choices for the same math, init-only settings
  that a loaded checkpoint overwrites). A new field is compared by default.
- precision backend: Transformer Engine layers carry an `_extra_state` entry the others lack;
  this is the one precision setting that changes the parameters (formats and recipes change
  how the GEMMs round, not what is stored: resuming NVFP4 weights in BF16 is the late switch).
- parameter layout: catches whatever else changes the state dict.
- the Mamba-2 row order of in_proj and conv1d (`mamba_layout`, models.mamba2.IN_PROJ_LAYOUT): the
  order is invisible in names and shapes, so a checkpoint recording none (saved before the group-major
  order) of a model with more than one group is refused; models.hf.mamba_to_group_major converts its
  tensors.

A mismatch stops the run naming the fields and both values, unless
checkpoint.allow_model_change is set (see Checkpointer.load).
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional

import torch

from models.mamba2 import IN_PROJ_LAYOUT as MAMBA_LAYOUT

IGNORED_MODEL_FIELDS = {
    "name": "a label",
    "ssd_backend": "kernel choice, same math",
    "gated_norm_backend": "kernel choice, same math",
    "conv_backend": "kernel choice, same math",
    "chunk_size": "tiling of the same SSD scan",
    "init_std": "used only by init_weights",
    "scale_residual_init": "used only by init_weights",
    "time_step_min": "used only by init_weights",
    "time_step_max": "used only by init_weights",
    "time_step_floor": "used only by init_weights",
    "A_init_min": "used only by init_weights",
    "A_init_max": "used only by init_weights",
}


def parameter_layout(model: torch.nn.Module) -> Dict[str, Optional[List[int]]]:
    """name -> global shape of every state-dict entry (None for extra state, whose size varies by content).

    Under FSDP2 the entries are DTensors whose .shape is the global (unsharded) shape, so the
    layout is the same for every world size.
    """
    return {name: (list(value.shape) if isinstance(value, torch.Tensor) and not name.endswith("_extra_state")
                   else None)
            for name, value in model.state_dict().items()}


def model_config_differences(saved: dict, current: dict) -> List[str]:
    """'model.<field>: checkpoint <a>, this run <b>' for every compared field that differs."""
    differences = []
    for name in sorted(set(saved) | set(current)):
        if name in IGNORED_MODEL_FIELDS:
            continue
        if saved.get(name, "<absent>") != current.get(name, "<absent>"):
            differences.append(f"model.{name}: checkpoint {saved.get(name, '<absent>')!r}, "
                               f"this run {current.get(name, '<absent>')!r}")
    return differences


def layout_differences(saved: Optional[dict], current: dict, limit: int = 6) -> List[str]:
    """Entries only in one of the layouts, or of another shape (at most `limit` of each kind named)."""
    if saved is None:  # recorded by every checkpoint this trainer writes; absent in older ones
        return []
    only_saved = sorted(set(saved) - set(current))
    only_current = sorted(set(current) - set(saved))
    reshaped = sorted(name for name in set(saved) & set(current) if saved[name] != current[name])
    out = []
    if only_saved:
        out.append(f"{len(only_saved)} entries only in the checkpoint ({', '.join(only_saved[:limit])}"
                   f"{', ...' if len(only_saved) > limit else ''})")
    if only_current:
        out.append(f"{len(only_current)} entries only in this run's model ({', '.join(only_current[:limit])}"
                   f"{', ...' if len(only_current) > limit else ''})")
    for name in reshaped[:limit]:
        out.append(f"{name}: checkpoint shape {saved[name]}, this run {current[name]}")
    return out


def incompatibilities(trainer_state: dict, model_config, precision_backend: str, layout: dict) -> List[str]:
    """Everything that makes the checkpoint (its trainer_state.json) another model than the run's; [] if none."""
    problems = []
    saved_config = trainer_state.get("model_config")
    if saved_config is None:
        problems.append("the checkpoint records no model_config (saved by an older trainer)")
    else:
        problems += model_config_differences(saved_config, dataclasses.asdict(model_config))
    saved_backend = trainer_state.get("precision_backend")
    if saved_backend is not None and (saved_backend == "te") != (precision_backend == "te"):
        problems.append(f"precision backend (resolved from precision.backend): checkpoint {saved_backend!r}, "
                        f"this run {precision_backend!r} (Transformer Engine layers store _extra_state)")
    problems += layout_differences(trainer_state.get("parameters"), layout)
    saved_layout = trainer_state.get("mamba_layout", "canonical")
    if "M" in model_config.pattern and model_config.mamba_num_groups > 1 and saved_layout != MAMBA_LAYOUT:
        problems.append(f"Mamba in_proj/conv1d row order: checkpoint {saved_layout!r}, this run {MAMBA_LAYOUT!r} "
                        f"(with {model_config.mamba_num_groups} groups the rows differ; "
                        f"models.hf.mamba_to_group_major converts the tensors)")
    return problems


def same_model(trainer_state: dict, model_config) -> bool:
    """Whether a checkpoint was saved by a model of this config (pruning only touches those)."""
    saved = trainer_state.get("model_config")
    return saved is not None and not model_config_differences(saved, dataclasses.asdict(model_config))
