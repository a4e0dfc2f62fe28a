"""Start a run from a Hugging Face NemotronH checkpoint (checkpoint.init_from_hf=DIR).

Continued pretraining: the directory's weights, a fresh optimizer, schedule and data order.

- Architecture: config.json decides it (`models.hf.read_hf_model_config`), after its
  `model_type` is checked to be NemotronH's (a Llama or Mixtral directory is named as such,
  not read as a NemotronH with default fields); the composed
  `model` config keeps only its kernel choices (`ssd_backend`, `gated_norm_backend`,
  `conv_backend`). Fields that change are printed, so a config that meant another model is
  visible. `time_step_clamp_min` becomes transformers' `time_step_min`, as in `import_hf`: the
  model computes what transformers computes from this directory.
- Weights: loaded after the model is parallelized, through torch's distributed state-dict API
  (`set_model_state_dict` with a full state dict): works for a plain module and for FSDP2
  shards alike. The names are compared first: a weight the model has and the directory lacks
  (it would keep its random init) or one the directory has and the model lacks stops the run,
  naming them (`set_model_state_dict` does not report missing names for a full state dict), and
  so does a weight whose shape differs from the model's, naming it with both shapes. Each is a
  `ConfigError` of checkpoint.init_from_hf: one line and exit status 2 on the command line.
  Under several ranks only rank 0 reads the files and broadcasts.
- A resumed checkpoint wins: the HF weights are only the starting point of a fresh run.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from trainer.validate import ConfigError

KEPT_FIELDS = ("ssd_backend", "gated_norm_backend", "conv_backend")
"""ModelConfig fields the run's own config keeps (they choose kernels, not the architecture)."""


NEMOTRON_H_MODEL_TYPE = "nemotron_h"


def check_model_type(path: Path) -> None:
    """ValueError naming the architecture when config.json is not a NemotronH's (read as JSON, nothing run)."""
    import json

    file = path / "config.json"
    if not file.is_file():
        return  # read_hf_model_config names the missing file
    try:
        config = json.loads(file.read_text())
    except (ValueError, UnicodeDecodeError) as error:
        raise ConfigError(f"checkpoint.init_from_hf: cannot parse {file}: {error}") from error
    model_type = config.get("model_type") if isinstance(config, dict) else None
    if model_type != NEMOTRON_H_MODEL_TYPE:
        raise ConfigError(
            f"checkpoint.init_from_hf={path}: {file} describes a {model_type!r} model (architectures "
            f"{config.get('architectures') if isinstance(config, dict) else None}), not NemotronH (model_type "
            f"{NEMOTRON_H_MODEL_TYPE!r}, NemotronHForCausalLM), the only architecture this trainer builds")


def adopt_hf_architecture(model_cfg, path: str):
    """(the ModelConfig to build for checkpoint.init_from_hf=path, {field: (was, now)} that changed)."""
    from models.hf import read_hf_model_config

    check_model_type(Path(path).expanduser())
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
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict

    from models.hf import read_hf_state_dict
    from trainer.distributed import broadcast_object

    path = Path(path).expanduser()
    broadcast = env.distributed
    # Extra state (Transformer Engine's) is not a weight; names as the state-dict API sees them (no wrappers),
    # shapes global (a DTensor's shape is the unsharded one). Compared with the files' headers before any
    # tensor is read (the Mamba re-layout of a wrongly shaped tensor would fail with an IndexError).
    wanted = {name: tuple(value.shape) for name, value in get_model_state_dict(model).items()
              if not name.endswith("_extra_state")}
    problem = None
    if env.is_main:
        stored = stored_weight_shapes(path)
        problem = (weight_name_differences(path, list(wanted), list(stored))
                   or weight_shape_differences(path, wanted, stored))
    problem = broadcast_object(problem) if broadcast else problem
    if problem:
        raise ConfigError(problem)
    state = read_hf_state_dict(path) if (env.is_main or not broadcast) else {}
    count = len(state)
    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True, strict=True,
                                                                broadcast_from_rank0=broadcast))
    return count


def stored_weight_shapes(path: Path) -> dict:
    """{our name: shape} of the weights in a directory's safetensors, from their headers (no tensor read);
    multi-token-prediction weights (mtp.*) are left out as read_hf_state_dict leaves them; a name of no
    NemotronH is kept as it is (then named as unexpected)."""
    import json

    from safetensors import safe_open

    from models.hf import from_hf_key

    index = path / "model.safetensors.index.json"
    files = (sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists()
             else ["model.safetensors"])
    shapes = {}
    for file in files:
        if not (path / file).is_file():
            raise FileNotFoundError(f"checkpoint.init_from_hf={path}: {path / file} is missing")
        with safe_open(str(path / file), framework="pt") as handle:
            for name in handle.keys():
                if name.startswith("mtp."):
                    continue
                try:
                    ours = from_hf_key(name)
                except KeyError:
                    ours = name
                shapes[ours] = tuple(handle.get_slice(name).get_shape())
    return shapes


def weight_shape_differences(path: Path, wanted: dict, found: dict, shown: int = 4) -> str | None:
    """A message naming each weight whose shape in the directory is not the model's (both shapes); None if all match."""
    differing = [(name, found[name], shape) for name, shape in wanted.items() if name in found and found[name] != shape]
    if not differing:
        return None
    listed = "; ".join(f"{name}: {list(on_disk)} in the directory, {list(model)} in the model"
                       for name, on_disk, model in differing[:shown])
    return (f"checkpoint.init_from_hf={path}: {len(differing)} weight(s) have another shape than the model built from "
            f"its config.json: {listed}{' ...' if len(differing) > shown else ''} (our names). The safetensors do not "
            "belong to that config.json; nothing was loaded")


def weight_name_differences(path: Path, wanted: list, found: list, shown: int = 8) -> str | None:
    """A message naming the weights the model has and the directory lacks, and the reverse; None if equal."""
    missing, unexpected = sorted(set(wanted) - set(found)), sorted(set(found) - set(wanted))
    if not missing and not unexpected:
        return None
    parts = []
    for names, what in ((missing, "missing from the directory (they would keep their random init)"),
                        (unexpected, "in the directory but not in the model")):
        if names:
            parts.append(f"{len(names)} {what}: {', '.join(names[:shown])}{', ...' if len(names) > shown else ''}")
    return (f"checkpoint.init_from_hf={path}: its weights do not match the model built from its config.json: "
            f"{'; '.join(parts)} (our names; on disk they carry the prefix 'backbone.' or 'model.'). Nothing was "
            "loaded")
