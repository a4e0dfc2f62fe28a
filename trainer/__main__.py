"""`python -m trainer [+experiment=NAME] [key=value ...]`: compose the config and train.

Hydra composes configs/train.yaml, the chosen group files and the command-line overrides
against the `TrainConfig` schema. Before Hydra runs, every `a.b.c=value` override is checked
against the schema, so a misspelt key fails at once with the valid keys listed (Hydra alone
would only say the key is not in the struct).

A user's error (`user_errors()`: a config value, the data, a checkpoint, a path that is not there, a
run directory in use or unusable, a run that does not fit its devices) ends the process with its one
message on stderr and exit status 2, without a traceback; so does a config that cannot be composed
(a YAML file with a duplicated key, an interpolation that does not resolve: the file, line and key in
one line). HYDRA_FULL_ERROR=1 shows the traceback instead (Hydra's own switch for the same). With
several ranks, rank 0 prints the message and the others its first line.

The run directory is chosen here, not by Hydra (configs/train.yaml has Hydra write nothing):
run_dir when given, else $HYBRID_RUN_DIR, else a new outputs/<date>/<time> (under -m: Hydra's
multirun/<date>/<time>/<job number>). An auto-named directory is never an earlier run's
(`train(auto_named_run_dir=True)`: a name taken gets -1, -2, ...), so only an explicit run_dir
resumes. Under -m a run_dir that every job would share is refused: each job would resume the
previous one's checkpoints. Hydra's .hydra/ files are written into the run directory by the
trainer once it holds the directory and every check has passed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import typing
from typing import List, Optional

import hydra
import yaml
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from hydra.types import RunMode
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
    global _TASK_STARTED
    _TASK_STARTED = True  # errors from here on are the run's, not the composition's
    try:
        cfg: TrainConfig = OmegaConf.to_object(dict_cfg)
    except OmegaConfBaseException as error:  # a required value not given, a value of the wrong type
        print(f"Error in the config: {config_error_line(error)}", file=sys.stderr)
        sys.exit(2)
    hydra_cfg = HydraConfig.get()
    if cfg.name is None:
        cfg.name = hydra_cfg.runtime.choices.get("experiment") or "default"
    from trainer.loop import train

    try:
        cfg.run_dir, auto_named = choose_run_directory(cfg, dict_cfg, hydra_cfg)
        summary = train(cfg, auto_named_run_dir=auto_named, run_files=hydra_files(dict_cfg))
    except user_errors() as error:
        if _tracebacks_wanted():
            raise
        report_user_error(error)
        sys.exit(2)
    if summary["status"] == "preempted":
        print(f"preempted at step {summary['step']}: checkpoint saved in {summary['run_dir']}", flush=True)


_TASK_STARTED = False
_FULL_ERROR: Optional[bool] = None  # HYDRA_FULL_ERROR as the user set it (cli() sets it for Hydra)
_MULTIRUN_RUN_DIRS: set = set()  # run directories of this process's multirun jobs (the basic launcher's)


def _tracebacks_wanted() -> bool:
    return _FULL_ERROR if _FULL_ERROR is not None else os.environ.get("HYDRA_FULL_ERROR") == "1"


def choose_run_directory(cfg: TrainConfig, dict_cfg: DictConfig, hydra_cfg) -> tuple:
    """(run directory, whether it is auto-named). Raises ConfigError for a run_dir every job of a multirun shares."""
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    if cfg.run_dir:
        if multirun:
            with contextlib.suppress(OSError):
                os.rmdir(hydra_cfg.runtime.output_dir)  # the job folder Hydra made, empty and not the run's
            _refuse_shared_run_dir(cfg.run_dir, dict_cfg)
        return cfg.run_dir, False
    if multirun:
        return hydra_cfg.runtime.output_dir, True  # multirun/<date>/<time>/<job number>, made by Hydra
    if os.environ.get("HYBRID_RUN_DIR"):
        return os.environ["HYBRID_RUN_DIR"], False
    named = OmegaConf.create({"dir": "outputs/${now:%Y-%m-%d}/${now:%H-%M-%S}"}).dir  # by Hydra's clock
    return os.path.abspath(named), True


def _refuse_shared_run_dir(run_dir: str, dict_cfg: DictConfig) -> None:
    """Under -m, run_dir must differ per job: swept (run_dir=/r/a,/r/b) or an interpolation of the job's values."""
    raw = str(OmegaConf.to_container(dict_cfg, resolve=False).get("run_dir"))
    per_job = "${" in raw or _swept_on_the_command_line("run_dir")
    if per_job and run_dir not in _MULTIRUN_RUN_DIRS:
        _MULTIRUN_RUN_DIRS.add(run_dir)
        return
    raise ConfigError(
        f"run_dir={run_dir} is the same for several jobs of this multirun (-m): each job would resume the previous "
        "one's checkpoints and train nothing of its own. Leave run_dir unset (each job gets multirun/<date>/<time>/"
        "<job number>), sweep it (run_dir=/r/a,/r/b), or make it per job: 'run_dir=/r/m/${hydra:job.num}'")


def _swept_on_the_command_line(key: str) -> bool:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for argument in sys.argv[1:]:
        if argument.lstrip("+").split("=", 1)[0] == key:
            try:
                return parser.parse_override(argument).is_sweep_override()
            except HydraException:
                return False
    return False


def hydra_files(dict_cfg: DictConfig) -> dict:
    """Hydra's record of the composition ({.hydra/<name>: yaml}), for the trainer to write into the run directory."""
    hydra_node = HydraConfig.instance().cfg
    return {".hydra/config.yaml": OmegaConf.to_yaml(dict_cfg),
            ".hydra/hydra.yaml": OmegaConf.to_yaml(hydra_node),
            ".hydra/overrides.yaml": OmegaConf.to_yaml(hydra_node.hydra.overrides.task)}


def config_error_line(error: BaseException) -> str:
    """A composition error in one line: the YAML file, line and problem, or the message and the key."""
    seen, current = set(), error
    while current is not None and id(current) not in seen:  # Hydra may wrap the YAML error
        seen.add(id(current))
        if isinstance(current, yaml.MarkedYAMLError):
            mark, context = current.problem_mark, current.context_mark
            where = f"{mark.name} line {mark.line + 1}" if mark is not None else "a config file"
            earlier = f" ({current.context} at line {context.line + 1})" if context is not None and current.context else ""
            return f"{where}: {current.problem}{earlier}"
        current = current.__cause__ or current.__context__
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if isinstance(error, HydraException) and isinstance(error.__cause__, OmegaConfBaseException):
        lines += [line.strip() for line in str(error.__cause__).splitlines() if line.strip()]  # what was wrong
        error = error.__cause__
    key = getattr(error, "full_key", None)
    parts: List[str] = []
    for line in lines:
        if line.startswith("Config search path"):  # Hydra's search path: not the user's mistake
            break
        if line.startswith(("full_key:", "object_type=", "reference_type=")):
            continue
        if parts and parts[-1].endswith(":"):  # a heading and its list ("Available options in 'model':")
            parts[-1] += " " + line
        elif parts and ":" in parts[-1] and parts[-1].rstrip().split(":")[-1].strip() and " " not in line:
            parts[-1] += ", " + line  # the list goes on
        else:
            parts.append(line)
    text = "; ".join(parts)
    return f"{text} (key {key})" if key else text


def user_errors() -> tuple:
    """The exceptions that are the user's to fix: reported in one message, exit status 2."""
    from trainer.checkpoint.errors import CheckpointError
    from trainer.preflight import PreflightError

    from trainer.run_lock import RunDirectoryInUse, RunDirectoryUnusable

    # FileNotFoundError: a path the user gave (checkpoint.resume, init_from_hf, a tokenizer) that is not there.
    return (ConfigError, DataError, CheckpointError, PreflightError, FileNotFoundError, RunDirectoryInUse,
            RunDirectoryUnusable)


def override_refusal(overrides) -> Optional[str]:
    """What a start prints for the first override whose key is not in the schema (None if every key is).
    `python -m trainer.plan_run` prints the same, so the planner and the trainer refuse alike."""
    for argument in overrides:
        message = unknown_key_message(argument)
        if message:
            return f"Error in override '{argument}':\n{message}"
    return None


def composition_refusal(error: BaseException) -> str:
    """What a start prints for a config that cannot be composed (a YAML error, an unknown group option...)."""
    return f"Error in the config: {config_error_line(error)}"


def user_error_message(error: BaseException) -> str:
    """What a start prints for a user's error (`user_errors()`), on rank 0."""
    return f"{type(error).__name__}: {error}"


def report_user_error(error: BaseException) -> None:
    """Rank 0: the whole message; other ranks: its first line, naming the rank."""
    rank = int(os.environ.get("RANK", "0"))
    message = user_error_message(error)
    if rank != 0:
        message = f"[rank {rank}] " + message.splitlines()[0]
    print(message, file=sys.stderr, flush=True)


HELP = """python -m trainer: pretrain a hybrid Mamba-Transformer (Nemotron-H style) in NVFP4, FP8 or BF16.

  python -m trainer +experiment=quickstart                  the quickstart (CPU or one GPU, minutes)
  python -m trainer +experiment=quickstart train.steps=50 run_dir=runs/q   any field: key=value
  torchrun --nproc-per-node=8 -m trainer +experiment=nvfp4_8b run_dir=runs/8b data.prepared_dir=...
  python -m trainer -m optim.lr=1e-3,3e-3                    a sweep: each job in its own run directory

Each run writes into its run directory (run_dir=..., else a new outputs/<date>/<time>): config.yaml,
run_info.json, metrics.jsonl, events.jsonl, checkpoints/. Started again with the same run_dir it
resumes from the newest intact checkpoint. Config groups: model, precision, data, optim, parallel,
logging, experiment (configs/); every field is documented in trainer/config.py and data/config.py.
--cfg job prints the composed config; --hydra-help shows Hydra's own options.

Tools (each answers --help):
  python -m trainer.prepare_data     tokenize a corpus into shards (data.prepared_dir)
  python -m trainer.plan_run         what fits on N GPUs of a kind: layout, memory, step time, cost
  python -m trainer.export_hf        a checkpoint as a Hugging Face directory
  python -m reports.compare_runs     loss curves of runs side by side
  python -m reports.gemm_report      every GEMM of a step and what each format buys
  sbatch --nodes=N "$(python -m trainer.slurm)" OVERRIDES   the SLURM launcher

Docs (in the source repository): README.md, docs/ARCHITECTURE.md, docs/data.md, docs/reliability.md,
docs/planning.md."""


def cli() -> None:
    global _FULL_ERROR
    refusal = override_refusal(sys.argv[1:])
    if refusal:
        print(refusal, file=sys.stderr)
        sys.exit(2)
    if any(argument in ("--help", "-h") for argument in sys.argv[1:]):
        print(HELP)
        return
    _FULL_ERROR = os.environ.get("HYDRA_FULL_ERROR") == "1"
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra re-raises what fails while composing: reported below in one line
    try:
        main()
    except KeyboardInterrupt:  # Ctrl-C outside the steps (during them, the loop saves and stops cleanly)
        print("\ninterrupted (SIGINT) outside the training steps: nothing to save; prepared data chunks and "
              "checkpoints are kept, and the next start goes on from there", file=sys.stderr)
        sys.exit(130)
    except (HydraException, OmegaConfBaseException, yaml.YAMLError) as error:  # the composition failed
        if _FULL_ERROR or _TASK_STARTED:
            raise
        print(composition_refusal(error), file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    cli()
