"""Start a run from a Hugging Face NemotronH checkpoint (checkpoint.init_from_hf=DIR).

Continued pretraining: the directory's weights, a fresh optimizer, schedule and data order.

- Architecture: config.json decides it (`models.hf.read_hf_model_config`); the composed
  `model` config keeps only its kernel choices (`ssd_backend`, `gated_norm_backend`,
  `conv_backend`). Fields that change are printed, so a config that meant another model is
  visible. `time_step_clamp_min` becomes transformers' `time_step_min`, as in `import_hf`: the
  model computes what transformers computes from this directory.
- Weights: loaded after the model is parallelized, through torch's distributed state-dict API
  (`set_model_state_dict` with a full state dict): works for a plain module and for FSDP2
  shards alike, names checked strictly (precision conversion keeps nn.Linear's names). Under
  several ranks only rank 0 reads the files and broadcasts.
- A resumed checkpoint wins: the HF weights are only the starting point of a fresh run.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

KEPT_FIELDS = ("ssd_backend", "gated_norm_backend", "conv_backend")
"""ModelConfig fields the run's own config keeps (they choose kernels, not the architecture)."""


def adopt_hf_architecture(model_cfg, path: str):
    """(the ModelConfig to build for checkpoint.init_from_hf=path, {field: (was, now)} that changed)."""
    from models.hf import read_hf_model_config

    adopted = read_hf_model_config(Path(path).expanduser())
    adopted = dataclasses.replace(adopted, **{name: getattr(model_cfg, name) for name in KEPT_FIELDS})
    changed = {
        field.name: (getattr(model_cfg, field.name), getattr(adopted, field.name))
        for field in dataclasses.fields(adopted)
        if field.name != "name" and getattr(model_cfg, field.name) != getattr(adopted, field.name)
    }
    return adopted.validate(), changed


def load_hf_weights(model: torch.nn.Module, path: str, env) -> int:
    """Copy the directory's weights into `model` (plain or FSDP2-sharded); returns the tensor count."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    from models.hf import read_hf_state_dict

    path = Path(path).expanduser()
    broadcast = env.distributed
    state = read_hf_state_dict(path) if (env.is_main or not broadcast) else {}
    count = len(state)
    # strict: a weight the model lacks, or one it has that the directory lacks, is an error naming it
    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True, strict=True,
                                                                broadcast_from_rank0=broadcast))
    return count
