"""Helpers of the trainer tests: a tiny NVFP4 model on a small built-in corpus, CLI runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FAULT_ENTRY = "tests.trainer.fault_entry"  # `python -m trainer` with faults installed (fault_entry.py)


def tiny_overrides(cache_dir: Path, steps: int = 6) -> list:
    """A run small enough for seconds on a CPU: 6 blocks of width 64, 64-token windows."""
    return [
        "model=tiny", "model.vocab_size=512",
        "precision=nvfp4", "precision.bf16_layers_at_start=0", "precision.bf16_layers_at_end=1",
        "data.builtin_vocab_size=512", "data.builtin_corpus_mb=0.3", f"data.cache_dir={cache_dir}",
        "data.seq_len=64", "data.validation_batches=1", "data.validation_fraction=0.2",
        f"train.steps={steps}", "train.micro_batch_size=2", "train.global_batch_size=4",
        "optim.warmup_steps=2", "optim.lr=3e-3",
        "logging.log_every=1", "logging.progress_bar=false", "logging.wandb.mode=disabled",
    ]


def compose_train_config(overrides: list, run_dir: Path):
    from trainer.config import compose

    cfg = compose(overrides)
    cfg.run_dir = str(run_dir)
    cfg.name = "test"
    return cfg


def run_cli(args: list, run_dir: Path, nproc: int = 1, env: dict = None, timeout: int = 300,
            module: str = "trainer"):
    """`python -m trainer` (or torchrun with nproc > 1) in a subprocess; returns the CompletedProcess.
    module=FAULT_ENTRY runs the trainer with the faults its options (in `args`) ask for."""
    launcher = [sys.executable, "-m", module]
    if nproc > 1:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
                    "-m", module]
    full_env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **(env or {}))
    return subprocess.run(launcher + args + [f"run_dir={run_dir}"], cwd=ROOT, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def read_jsonl(path: Path) -> list:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def losses_by_step(run_dir: Path) -> dict:
    """step -> loss from metrics.jsonl (later lines win, as after a resume)."""
    return {line["step"]: line["loss"] for line in read_jsonl(Path(run_dir) / "metrics.jsonl")}


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launch_ranks(args: list, run_dir: Path, log_dir: Path, nproc: int = 2, preexec_fns: list = None) -> list:
    """Start `python -m trainer` once per rank with only the environment a launcher (srun) would set: no
    torchrun agent that would tear the others down, and per-rank process settings (preexec_fns[r]).
    Returns [(Popen, log path)]; each rank's output goes to log_dir/rank{r}.log."""
    port = free_port()
    ranks = []
    for rank in range(nproc):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc),
                   LOCAL_WORLD_SIZE=str(nproc), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        log_path = Path(log_dir) / f"rank{rank}.log"
        with open(log_path, "w") as log:
            process = subprocess.Popen([sys.executable, "-m", "trainer", *args, f"run_dir={run_dir}"], cwd=ROOT,
                                       env=env, stdout=log, stderr=subprocess.STDOUT,
                                       preexec_fn=(preexec_fns or [None] * nproc)[rank])
        ranks.append((process, log_path))
    return ranks
