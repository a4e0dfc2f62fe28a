"""What the run directory says about the run, written by rank 0 at every start.

`<run dir>/config.yaml`     the resolved TrainConfig, as run (`name` and `run_dir` filled in, the
                            model config as built, e.g. adopted from checkpoint.init_from_hf);
                            `OmegaConf.merge(OmegaConf.structured(TrainConfig), OmegaConf.load(...))`
                            reads it back.
`<run dir>/run_info.json`   how it was started: command line, working directory, git commit of
                            the source tree (with a dirty flag), package versions, host, devices,
                            world size, tokenizer identity, and the run plan the preflight made
                            (trainer/preflight.py: memory per device by part, step time,
                            throughput; null with train.preflight=false). (Not run.json: the study
                            runner, scripts/run_study.py, keeps its own record of a run under that name.)

`<run dir>/.hydra/`         Hydra's record of the command line's composition (config.yaml,
                            hydra.yaml, overrides.yaml), written here with the others once the
                            trainer holds the run directory and every check has passed (Hydra
                            itself writes nothing: configs/train.yaml, trainer/__main__.py).

`precision_plan.txt` (loop.py) completes the picture. A restart with the same run_dir keeps
both files and writes its own beside them, config.resume-<step>.yaml and
run_info.resume-<step>.json (trainer/checkpoint/resume_changes.py: `start_record_names`); events.jsonl
records each resume and what changed.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Optional

PACKAGES = ("hybrid-nvfp4", "torch", "triton", "transformer-engine", "mamba-ssm", "transformers", "tokenizers",
            "datasets", "hydra-core", "omegaconf", "wandb", "numpy", "safetensors")
"""Distributions whose versions are recorded (those not installed are recorded as null)."""


def package_versions(names=PACKAGES) -> dict:
    """{distribution: version or None} from the installed metadata."""
    versions = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def git_state(source: Path) -> Optional[dict]:
    """{commit, dirty} of the git work tree holding `source`; None outside one (e.g. a wheel install)."""
    def git(*args: str) -> Optional[str]:
        try:
            result = subprocess.run(["git", "-C", str(source), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None  # no git on this machine
        return result.stdout.strip() if result.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return None
    changes = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": bool(changes), "root": git("rev-parse", "--show-toplevel")}


def describe_run(cfg, *, world_size: int, device, tokenizer: Optional[dict] = None, plan: Optional[dict] = None,
                 start: Optional[dict] = None) -> dict:
    """The contents of run_info.json (``start``: parallel=auto's choice and the batch run, trainer/startup.py)."""
    import torch

    source = Path(__file__).resolve().parents[1]
    devices = None
    if device.type == "cuda":
        devices = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return {
        "name": cfg.name,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": [sys.executable, *sys.argv],
        "interpreter_command": list(getattr(sys, "orig_argv", [])),
        "cwd": os.getcwd(),
        "source": str(source),
        "git": git_state(source),
        "python": platform.python_version(),
        "packages": package_versions(),
        "host": socket.gethostname(),
        "world_size": world_size,
        "device": device.type,
        "cuda_devices": devices,
        "cuda": torch.version.cuda,
        "tokenizer": tokenizer,
        "plan": plan,
        "start": start,
    }


def config_yaml(cfg) -> str:
    """The resolved config as YAML (the dataclasses through OmegaConf, so it reloads as TrainConfig)."""
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(OmegaConf.structured(cfg), resolve=True)


def write_run_description(cfg, run_dir: Path, *, world_size: int, device, tokenizer: Optional[dict] = None,
                          plan: Optional[dict] = None, names: tuple = ("config.yaml", "run_info.json"),
                          extra_files: Optional[dict] = None, start: Optional[dict] = None) -> None:
    """Write the config and the run description into `run_dir` under `names` (rank 0 only), and `extra_files`
    ({relative path: text}: the entry point's .hydra/config.yaml, hydra.yaml, overrides.yaml, the latest
    start's, as Hydra keeps them)."""
    run_dir = Path(run_dir)
    for relative, text in (extra_files or {}).items():
        (run_dir / relative).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / relative).write_text(text)
    (run_dir / names[0]).write_text(config_yaml(cfg))
    description = describe_run(cfg, world_size=world_size, device=device, tokenizer=tokenizer, plan=plan, start=start)
    (run_dir / names[1]).write_text(json.dumps(description, indent=1) + "\n")
