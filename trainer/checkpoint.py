"""Checkpoints with PyTorch Distributed Checkpoint (DCP): save, find, resume, keep the last K.

On disk, one directory per checkpoint:

  <dir>/step_00000100/          a complete checkpoint (visible only once everything is written)
      .metadata, __*_*.distcp   DCP: model and optimizer state, sharded as the run was
      trainer_state.json        step, tokens, data-loader position, guard counters, world size
      rng_rank{r}.pt            each rank's RNG states (python, numpy, torch CPU and CUDA)
  <dir>/.tmp_step_00000200/     a save in progress (ignored by resume, removed by the next save)

Atomicity: every rank writes into the `.tmp_` directory; after a barrier rank 0 writes
trainer_state.json last and renames the directory to its final name (rename is atomic on
POSIX filesystems). A run killed mid-save leaves only a `.tmp_` directory, so the next start
resumes from the previous complete checkpoint.

Async saves (checkpoint.async_save): DCP stages the state to CPU memory and writes it from a
background thread on a dedicated gloo group; the checkpoint becomes visible (renamed) at the
first step boundary where every rank has finished writing, or at the next save / the end.

Resharding: DCP stores each tensor's global shape and its shards, so a checkpoint saved by N
ranks loads on M ranks (or one process without FSDP). RNG states are per rank: they are
restored when the world size matches and re-seeded from (seed, step, rank) otherwise.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from trainer import faults
from trainer.config import CheckpointConfig
from trainer.distributed import DistEnv, barrier, broadcast_object

_PREFIX = "step_"
_TMP_PREFIX = ".tmp_step_"


def checkpoint_name(step: int) -> str:
    return f"{_PREFIX}{step:08d}"


def is_complete(path: Path) -> bool:
    return path.is_dir() and (path / ".metadata").exists() and (path / "trainer_state.json").exists()


def list_checkpoints(directory: Path) -> list:
    """Complete checkpoints, oldest first."""
    if not directory.is_dir():
        return []
    found = [p for p in directory.iterdir() if p.name.startswith(_PREFIX) and is_complete(p)]
    return sorted(found, key=lambda p: int(p.name[len(_PREFIX):]))


class Checkpointer:
    def __init__(self, cfg: CheckpointConfig, run_dir: Path, env: DistEnv):
        self.cfg = cfg
        self.env = env
        self.dir = Path(cfg.dir) if cfg.dir else Path(run_dir) / "checkpoints"
        self._pending = None  # (future, tmp_dir, final_dir, trainer_state) of an async save
        # An async save runs its collectives from a background thread: on the default group they
        # would interleave with the training step's FSDP collectives and deadlock. It gets its own
        # gloo group (created here, by every rank together).
        self._async_group = None
        if cfg.async_save and env.distributed:
            import torch.distributed as dist

            self._async_group = dist.new_group(backend="gloo")

    # ----------------------------------------------------------------------------- finding
    def resume_path(self) -> Optional[Path]:
        """The checkpoint to resume from, per checkpoint.resume (auto | none | path)."""
        if self.cfg.resume == "none":
            return None
        if self.cfg.resume != "auto":
            path = Path(self.cfg.resume)
            if not is_complete(path):
                raise FileNotFoundError(
                    f"checkpoint.resume={self.cfg.resume!r} is not a complete checkpoint "
                    "(needs .metadata and trainer_state.json)"
                )
            return path
        found = list_checkpoints(self.dir)
        return found[-1] if found else None

    # ----------------------------------------------------------------------------- saving
    def save(self, step: int, model, optimizer, trainer_state: dict) -> Path:
        """Save synchronously (or start an async save); returns the final directory name."""
        self.wait()  # finish a pending async save first: checkpoints become visible in order
        final = self.dir / checkpoint_name(step)
        tmp = self.dir / f"{_TMP_PREFIX}{step:08d}"
        if self.env.is_main:
            self.dir.mkdir(parents=True, exist_ok=True)
            for stale in self.dir.glob(f"{_TMP_PREFIX}*"):
                shutil.rmtree(stale, ignore_errors=True)  # left by a run killed mid-save
            tmp.mkdir()
        barrier()
        model_state, optim_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optim": optim_state}
        torch.save(_rng_state(), tmp / f"rng_rank{self.env.rank}.pt")
        trainer_state = dict(trainer_state, world_size=self.env.world_size)
        if self.cfg.async_save and self.env.distributed:
            future = dcp.async_save(state, checkpoint_id=str(tmp), process_group=self._async_group)
            self._pending = (future, tmp, final, trainer_state)
            return final
        dcp.save(state, checkpoint_id=str(tmp))
        self._finalize(tmp, final, trainer_state)
        return final

    def poll(self) -> None:
        """Make a finished async save visible; call every step (collective while a save is pending)."""
        if self._pending is None:
            return
        import torch.distributed as dist

        done = torch.tensor([1 if self._pending[0].done() else 0], device=self.env.device)
        dist.all_reduce(done, op=dist.ReduceOp.MIN)  # every rank's shards must be written
        if done.item():
            self.wait()

    def wait(self) -> None:
        if self._pending is None:
            return
        future, tmp, final, trainer_state = self._pending
        self._pending = None
        future.result()
        self._finalize(tmp, final, trainer_state)

    def _finalize(self, tmp: Path, final: Path, trainer_state: dict) -> None:
        barrier()  # every rank's shards are on disk
        faults.maybe_kill(faults.KILL_DURING_SAVE, trainer_state["step"])
        if self.env.is_main:
            with open(tmp / "trainer_state.json", "w") as handle:
                json.dump(trainer_state, handle, indent=1)
                handle.flush()
                os.fsync(handle.fileno())
            if final.exists():  # a checkpoint of the same step from an earlier attempt
                shutil.rmtree(final)
            os.rename(tmp, final)
            self._prune()
        barrier()

    def _prune(self) -> None:
        if self.cfg.keep <= 0:
            return
        for old in list_checkpoints(self.dir)[: -self.cfg.keep]:
            shutil.rmtree(old, ignore_errors=True)

    # ----------------------------------------------------------------------------- loading
    def load(self, path: Path, model, optimizer) -> dict:
        """Load model + optimizer (resharding as needed) and RNG; returns trainer_state."""
        model_state, optim_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optim": optim_state}
        dcp.load(state, checkpoint_id=str(path))
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        trainer_state = json.loads((path / "trainer_state.json").read_text())
        rng_file = path / f"rng_rank{self.env.rank}.pt"
        if trainer_state.get("world_size") == self.env.world_size and rng_file.exists():
            _set_rng_state(torch.load(rng_file, weights_only=False))
        else:
            seed = (trainer_state.get("seed", 0) * 1_000_003 + trainer_state["step"]) * 1009 + self.env.rank
            _seed_all(seed % (2**63))
        return trainer_state


def agree_on_path(path: Optional[Path]) -> Optional[Path]:
    """All ranks resume from rank 0's choice (their directory listings could race)."""
    return broadcast_object(path)


def _rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
