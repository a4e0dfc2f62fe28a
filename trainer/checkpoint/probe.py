"""At the start of a run, before the first step: can the checkpoint directory take a checkpoint?

A checkpoint directory that cannot be written (read-only or immutable, permission denied, a full
or over-quota filesystem) would otherwise be found at the first save: after `checkpoint.every`
steps or `checkpoint.every_minutes`, or, with neither, after the whole run. So every rank writes
a small file into it, fsyncs and removes it (ranks on other nodes may see another mount), and
rank 0 compares the free space with the size of one checkpoint of this model: 12 bytes per
parameter (fp32 weights and AdamW's two moments; `expected_checkpoint_bytes`). Less room than
one checkpoint stops the run; less than `keep` + 1 (what the rotation holds at its fullest) is a
warning. The outcome is agreed by every rank, and a refusal names the directory and the reason
in words (fileio/oserrors.py).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Optional

from fileio.oserrors import explain_write_failure
from trainer.checkpoint.errors import CheckpointDirectoryUnusable

BYTES_PER_PARAMETER = 12
"""What a checkpoint stores per parameter: fp32 weight, AdamW exp_avg and exp_avg_sq (measured: the tiny
model's 171 k parameters save as 2.8 MB, the quickstart's 4.6 M as 56 MB, with metadata and RNG files)."""


def expected_checkpoint_bytes(model_config) -> int:
    from models.flops import count_parameters

    return count_parameters(model_config) * BYTES_PER_PARAMETER


def _gib(size: float) -> str:
    return f"{size / 2**30:.2f} GiB" if size >= 2**30 else f"{size / 2**20:.1f} MiB"


def probe_checkpoint_directory(directory: Path, env, expected_bytes: Optional[int] = None, keep: int = 0) -> None:
    """Collective: raise CheckpointDirectoryUnusable on every rank when any rank cannot write into `directory`
    or (rank 0) its filesystem has less room than `expected_bytes`; warn when it has less than keep + 1 times."""
    from trainer.distributed import all_gather_object

    directory = Path(directory)
    problem = None
    probe = directory / f".write_probe_rank{env.rank}_{os.getpid()}"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with open(probe, "wb") as handle:
            handle.write(b"probe\n")
            handle.flush()
            os.fsync(handle.fileno())
        probe.unlink()
    except OSError as error:
        problem = f"rank {env.rank}: {explain_write_failure(error, probe)}"
        try:
            probe.unlink()
        except OSError:
            pass
    warning = None
    if problem is None and env.is_main and expected_bytes:
        try:
            free = shutil.disk_usage(directory).free
        except OSError:
            free = None  # not known: the write above is the test
        if free is None:
            pass
        elif free < expected_bytes:
            problem = (f"its filesystem has {_gib(free)} free, and one checkpoint of this model takes about "
                       f"{_gib(expected_bytes)} ({BYTES_PER_PARAMETER} bytes per parameter: fp32 weights and two "
                       "AdamW moments)")
        elif keep and free < expected_bytes * (keep + 1):
            warning = (f"checkpoint directory {directory}: {_gib(free)} free holds fewer than checkpoint.keep + 1 = "
                       f"{keep + 1} checkpoints of about {_gib(expected_bytes)} each; a save may fail for want of "
                       "space later (the run then stops with the older checkpoints intact)")
    problems = [found for found in all_gather_object(problem) if found]
    if problems:
        raise CheckpointDirectoryUnusable(
            f"the checkpoint directory {directory} cannot take a checkpoint: {'; '.join(problems)}. Nothing was "
            "trained; make it writable (free space), or give another checkpoint.dir")
    if warning:
        print(f"warning: {warning}", file=sys.stderr, flush=True)
