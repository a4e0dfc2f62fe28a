"""Hugging Face exports of trained models: from a checkpoint, or at the end of a run.

`export_checkpoint(checkpoint, out_dir)` (what `python -m trainer.export_hf` runs) loads a Distributed
Checkpoint saved by any number of ranks into one unsharded model on the CPU, built from the
model config recorded in its trainer_state.json, and writes with `models.hf.export_hf`:
safetensors weights, config.json, generation_config.json and the tokenizer the checkpoint
records (tokenizer.json, tokenizer_config.json; `trainer/hf/tokenizer.py`), whose special-token ids
are the ones in config.json. The weights are the FP32 master weights cast to `dtype`: the
quantization of the training GEMMs is not part of the exported model.

`export_at_end(model, cfg, tokenizer, env)` (checkpoint.export_hf_at_end) gathers the trained
model from every rank instead of reading a checkpoint. It replaces the run's own `<run dir>/hf`;
an explicit `checkpoint.export_hf_dir` that holds files is refused at start-up
(`check_export_directory_at_start`) unless `checkpoint.export_hf_overwrite=true`.

The tokenizer is checked, never guessed: the one used is the recorded path (or the one given)
and its sha256 must equal the recorded one.

The checkpoint is verified before anything of it is read, as a resume verifies it
(trainer/checkpoint/integrity.py): every file's size and sha256 against its integrity.json. A
damaged checkpoint (a flipped byte in a tensor, a truncated shard, a missing integrity.json) is
refused with `CorruptCheckpoint` naming the file; `verify=False` (`--no-verify`) checks the
sizes only and accepts a checkpoint saved without checksums, knowingly.

Exported files get the permissions of any file this process creates (0666 less the umask:
0644 by default): the safetensors writer makes its file through a private temporary (0600),
which would leave the weights unreadable to the rest of a team.

`export_checkpoint` writes into an empty (or new) directory only: files an earlier export left
there (added_tokens.json, special_tokens_map.json, chat_template.jinja, other shards) would be
read by transformers together with the new ones. `overwrite=True` (`--overwrite`) empties the
directory first, and only a directory of plain files, as an export is (never a run directory).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Optional

import torch

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def verify_checkpoint(checkpoint: Path, verify: bool = True) -> None:
    """Raise CorruptCheckpoint naming the damaged files unless `checkpoint` matches its integrity.json
    (sizes and sha256; with verify=False the sizes, and a checkpoint without integrity.json passes)."""
    from trainer.checkpoint.errors import CorruptCheckpoint
    from trainer.checkpoint.integrity import verify_directory

    problems = verify_directory(Path(checkpoint), hash_files=verify)
    if problems:
        shown = "; ".join(problems[:4]) + (f" (and {len(problems) - 4} more)" if len(problems) > 4 else "")
        raise CorruptCheckpoint(f"checkpoint {checkpoint} is corrupt or incomplete: {shown}; not exporting it "
                                "(choose another checkpoint of the run)")


def make_readable(out_dir: Path) -> None:
    """Give every file of `out_dir` the mode a new file of this process gets (0666 less the umask)."""
    mask = os.umask(0)
    os.umask(mask)
    for path in Path(out_dir).iterdir():
        if path.is_file() and not path.is_symlink():
            path.chmod(0o666 & ~mask)


def read_trainer_state(checkpoint: Path) -> dict:
    """trainer_state.json of a complete checkpoint; errors name the directory."""
    from trainer.checkpoint.layout import STATE_FILE, is_complete  # the trainer's own test of a finished checkpoint

    checkpoint = Path(checkpoint)
    state_file = checkpoint / STATE_FILE
    if not is_complete(checkpoint):
        raise FileNotFoundError(f"{checkpoint} is not a complete checkpoint (needs .metadata and trainer_state.json)")
    trainer_state = json.loads(state_file.read_text())
    if "model_config" not in trainer_state:
        raise KeyError(f"{state_file} records no model_config (saved by an older trainer)")
    return trainer_state


def load_checkpoint_model(checkpoint: Path) -> torch.nn.Module:
    """The model of a trainer checkpoint, unsharded, in fp32 on the CPU."""
    import torch.distributed.checkpoint as dcp

    from models import build_model
    from models.config import ModelConfig

    trainer_state = read_trainer_state(checkpoint)
    config = ModelConfig(**trainer_state["model_config"])
    with torch.device("meta"):
        model = build_model(config)
    model.to_empty(device="cpu")
    state = {"model": model.state_dict()}
    from trainer.checkpoint.checkpointer import single_process_quiet

    with single_process_quiet():
        dcp.load(state, checkpoint_id=str(checkpoint))  # reshards whatever the saving world size was
    model.load_state_dict(state["model"])
    return model.eval()


def checkpoint_tokenizer(trainer_state: dict, path: Optional[str | Path] = None, where: str = "the checkpoint"):
    """The data.Tokenizer the checkpoint was trained with: from `path` if given, else from the
    recorded path; its sha256 must match the recorded one (when one is recorded)."""
    from data import DataConfig, build_tokenizer

    recorded = trainer_state.get("tokenizer")
    if path is None:
        if not recorded or not recorded.get("path"):
            raise ValueError(f"{where} records no tokenizer (saved by an older trainer): pass the tokenizer it was "
                             "trained with (--tokenizer PATH, a tokenizer.json or a tokenizer directory)")
        path = recorded["path"]
        if not Path(path).exists():
            raise FileNotFoundError(f"{where} was trained with the tokenizer at {path}, which no longer exists: "
                                    "pass a copy of it (--tokenizer PATH)")
    tokenizer = build_tokenizer(DataConfig(tokenizer=str(path), eos_token=(recorded or {}).get("eos_token")))
    if recorded and recorded.get("sha256") and tokenizer.sha256 != recorded["sha256"]:
        raise ValueError(f"the tokenizer at {path} (sha256 {tokenizer.sha256[:16]}...) is not the one {where} was "
                         f"trained with ({recorded.get('path')}, sha256 {recorded['sha256'][:16]}...)")
    return tokenizer


class ExportDirectoryNotEmpty(ValueError):
    """The export's target directory holds files (of an earlier export?) and overwrite was not asked for."""


def empty_export_directory(out_dir: Path, overwrite: bool, overwrite_option: str = "--overwrite") -> None:
    """Refuse a non-empty `out_dir`, or with `overwrite` empty it (plain files only: never a directory tree).
    `overwrite_option` is how the caller's user asks for `overwrite` (named in the refusal)."""
    out_dir = Path(out_dir)
    if not out_dir.exists():
        return
    if not out_dir.is_dir():
        raise ExportDirectoryNotEmpty(f"{out_dir} exists and is not a directory")
    entries = sorted(out_dir.iterdir())
    if not entries:
        return
    names = ", ".join(entry.name for entry in entries[:8]) + (", ..." if len(entries) > 8 else "")
    if not overwrite:
        raise ExportDirectoryNotEmpty(
            f"{out_dir} is not empty ({names}): files of an earlier export left there would be read with this one "
            "(transformers reads added_tokens.json, special_tokens_map.json, chat_template.jinja, ...). Choose a new "
            f"or empty directory, or pass {overwrite_option} to empty it first")
    folders = [entry.name for entry in entries if entry.is_dir() and not entry.is_symlink()]
    if folders:
        raise ExportDirectoryNotEmpty(
            f"not emptying {out_dir}: it holds directories ({', '.join(folders[:8])}), which no export writes "
            f"(a run directory?); {overwrite_option} empties only a directory of files. Choose another directory")
    for entry in entries:
        entry.unlink()


def export_checkpoint(checkpoint: Path, out_dir: Path, dtype: str = "bfloat16",
                      tokenizer: Optional[str | Path] = None, overwrite: bool = False, verify: bool = True) -> Path:
    """Write a checkpoint as a Hugging Face directory with its tokenizer; returns out_dir.

    The checkpoint is verified first (`verify_checkpoint`: CorruptCheckpoint names a damaged file).
    `out_dir` must be new or empty; `overwrite` empties it first (`empty_export_directory`)."""
    from trainer.hf.tokenizer import to_transformers
    from models.hf import export_hf

    checkpoint = Path(checkpoint)
    trainer_state = read_trainer_state(checkpoint)
    ours = checkpoint_tokenizer(trainer_state, tokenizer, where=f"checkpoint {checkpoint}")
    empty_export_directory(out_dir, overwrite)  # before the slow part: a refusal comes at once
    verify_checkpoint(checkpoint, verify)  # before DCP unpickles .metadata or reads a tensor
    model = load_checkpoint_model(checkpoint)
    exported = export_hf(model, out_dir, dtype=_dtype(dtype), tokenizer=to_transformers(ours))
    make_readable(exported)
    return exported


END_OF_RUN_OVERWRITE = "checkpoint.export_hf_overwrite=true"
"""How a training run asks export_at_end to empty a non-empty export_hf_dir."""


def check_export_directory_at_start(cfg) -> None:
    """Refuse, before any step, an explicit export_hf_dir that export_at_end would refuse at the end
    (a run should not train for hours to fail at its last line). The run's own <run dir>/hf is
    replaced at the end, as a later completion of the run should."""
    from trainer.validate import ConfigError

    if cfg.checkpoint.export_hf_at_end and cfg.checkpoint.export_hf_dir and not cfg.checkpoint.export_hf_overwrite:
        try:
            empty_export_directory(Path(cfg.checkpoint.export_hf_dir), False, END_OF_RUN_OVERWRITE)
        except ExportDirectoryNotEmpty as error:
            raise ConfigError(f"checkpoint.export_hf_dir: {error}") from None


def export_at_end(model: torch.nn.Module, cfg, tokenizer, env, out_dir: Path) -> Optional[Path]:
    """Gather the trained (possibly FSDP-sharded) model and write it as a Hugging Face directory
    from rank 0. Collective: every rank calls it. Returns out_dir on rank 0, None elsewhere.
    `out_dir` is emptied first when it is the run's own (no export_hf_dir) or export_hf_overwrite
    is set; otherwise a non-empty one is refused."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from trainer.hf.tokenizer import to_transformers
    from models import build_model
    from models.hf import export_hf

    dtype = _dtype(cfg.checkpoint.export_hf_dtype)
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=env.distributed))
    if not env.is_main:
        return None
    own = cfg.checkpoint.export_hf_dir is None
    empty_export_directory(out_dir, own or cfg.checkpoint.export_hf_overwrite, END_OF_RUN_OVERWRITE)
    with torch.device("meta"):
        plain = build_model(cfg.model)
    # Same names as HybridLM (QuantLinear keeps nn.Linear's); strict: any other name is an error.
    plain.load_state_dict({name: tensor.detach().to("cpu", torch.float32) for name, tensor in full.items()},
                          strict=True, assign=True)
    exported = export_hf(plain.eval(), out_dir, dtype=dtype, tokenizer=to_transformers(tokenizer))
    make_readable(exported)
    return exported


def _dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ValueError(f"export dtype must be one of {sorted(DTYPES)}, got {name!r}")
    return DTYPES[name]
