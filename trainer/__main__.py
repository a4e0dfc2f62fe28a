"""`python -m trainer [+experiment=NAME] [key=value ...]`: compose the config and train.

Hydra composes configs/train.yaml, the chosen group files and the command-line overrides
against the `TrainConfig` schema. Before Hydra runs, every `a.b.c=value` override is checked
against the schema, so a misspelt key fails at once with the valid keys listed (Hydra alone
would only say the key is not in the struct).

A user's error (`user_errors()`: a config value, the data, a checkpoint, a path that is not there, a
run that does not fit its devices) ends the process with its one message on stderr and exit status 2, without a traceback;
HYDRA_FULL_ERROR=1 shows the traceback instead (Hydra's own switch for the same). With several
ranks, rank 0 prints the message and the others its first line.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import typing
from typing import List, Optional

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from data.errors import DataError
from trainer.config import CONFIG_DIR, TrainConfig, register_configs
from trainer.validate import ConfigError

CONFIG_GROUPS = ("model", "precision", "data", "optim", "parallel", "logging", "experiment")


def unknown_key_message(override: str) -> Optional[str]:
    """A message if the override's key is not in the schema (None if fine or not ours to judge)."""
    if override.startswith("-") or "=" not in override:
        return None  # a Hydra flag (--cfg, --multirun, ...)
    key = override.split("=", 1)[0].lstrip("+~")
    if key.startswith("hydra.") or key == "hydra" or "@" in key:
        return None
    if key in CONFIG_GROUPS or key.startswith("experiment"):
        return None  # a group choice: Hydra lists the available options itself
    node = TrainConfig
    walked: List[str] = []
    for part in key.split("."):
        if not dataclasses.is_dataclass(node):
            return None  # inside a list or a dict: Hydra's own checks apply
        fields = {f.name: f for f in dataclasses.fields(node)}
        if part not in fields:
            where = ".".join(walked) or "the top level"
            return (
                f"Unknown config key '{key}': '{part}' is not a field of {node.__name__} ({where}).\n"
                f"Valid keys at {where}: {', '.join(sorted(fields))}"
            )
        walked.append(part)
        node = _field_type(node, part)
    return None


def _field_type(cls, name: str):
    hints = typing.get_type_hints(cls)
    hint = hints[name]
    # Optional[X] -> X
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) is typing.Union and len(args) == 1:
        hint = args[0]
    return hint


register_configs()


# An absolute path: the configs are found beside the installed package, whatever the working
# directory holds (a `configs/` folder there is not ours). `--config-dir DIR` adds one's own.
@hydra.main(version_base=None, config_path=str(CONFIG_DIR), config_name="train")
def main(dict_cfg: DictConfig) -> None:
    try:
        cfg: TrainConfig = OmegaConf.to_object(dict_cfg)
    except OmegaConfBaseException as error:  # a required value not given, a value of the wrong type
        print(f"Error in the config: {error}", file=sys.stderr)
        sys.exit(2)
    runtime = HydraConfig.get().runtime
    if cfg.run_dir is None:
        cfg.run_dir = runtime.output_dir
    if cfg.name is None:
        cfg.name = runtime.choices.get("experiment") or "default"
    from trainer.loop import train

    try:
        summary = train(cfg)
    except user_errors() as error:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        report_user_error(error)
        sys.exit(2)
    if summary["status"] == "preempted":
        print(f"preempted at step {summary['step']}: checkpoint saved in {summary['run_dir']}", flush=True)


def user_errors() -> tuple:
    """The exceptions that are the user's to fix: reported in one message, exit status 2."""
    from trainer.checkpoint.errors import CheckpointError
    from trainer.preflight import PreflightError

    # FileNotFoundError: a path the user gave (checkpoint.resume, init_from_hf, a tokenizer) that is not there.
    return (ConfigError, DataError, CheckpointError, PreflightError, FileNotFoundError)


def report_user_error(error: BaseException) -> None:
    """Rank 0: the whole message; other ranks: its first line, naming the rank."""
    rank = int(os.environ.get("RANK", "0"))
    message = f"{type(error).__name__}: {error}"
    if rank != 0:
        message = f"[rank {rank}] " + message.splitlines()[0]
    print(message, file=sys.stderr, flush=True)


def cli() -> None:
    for argument in sys.argv[1:]:
        message = unknown_key_message(argument)
        if message:
            print(f"Error in override '{argument}':\n{message}", file=sys.stderr)
            sys.exit(2)
    try:
        main()
    except KeyboardInterrupt:  # Ctrl-C outside the steps (during them, the loop saves and stops cleanly)
        print("\ninterrupted (SIGINT) outside the training steps: nothing to save; prepared data chunks and "
              "checkpoints are kept, and the next start goes on from there", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    cli()
