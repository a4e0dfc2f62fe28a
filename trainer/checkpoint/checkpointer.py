"""Checkpoints with PyTorch Distributed Checkpoint (DCP): save, verify, find, resume, keep the last K.

On disk, one directory per checkpoint:

  <dir>/step_00000100/          a complete checkpoint (visible only once everything is written)
      .metadata, __*_*.distcp   DCP: model and optimizer state, sharded as the run was
      trainer_state.json        step, tokens, data-loader position, guard counters, world size,
                                optimizer step count, model config, precision backend, parameter
                                layout, tokenizer, corpus and resolved config (resume_changes.py)
      rng_rank{r}.json          each rank's RNG states (python, numpy, torch CPU and CUDA) as JSON
                                (rng.py)
      integrity.json            size and sha256 of every file above (integrity.py)
  <dir>/.tmp_step_00000200/     a save in progress (ignored by resume, removed by the next save)
  <dir>/corrupt_step_00000300/  a checkpoint that failed verification, set aside (never deleted)
  <dir>/superseded_step_00000400/  a checkpoint newer than the one a run resumed from, or of the same
                                step as a new save from another history, set aside (never deleted)

(names, listing and trainer_state.json: layout.py; the exceptions: errors.py)

Atomicity: every rank writes into the `.tmp_` directory; after a barrier rank 0 writes
trainer_state.json, the ranks hash the files (each its share), rank 0 writes integrity.json
and renames the directory to its final name (rename is atomic on POSIX filesystems). A run
killed mid-save leaves only a `.tmp_` directory, so the next start resumes from the previous
complete checkpoint. A step is saved once (a stop in a step just saved does not save it again),
and a committed checkpoint is never deleted to make room for a new one: one of the same step is
set aside first. A save that fails (disk full, permission denied) stops the run with the reason
and the path (fileio/oserrors.py), after removing its `.tmp_` directory; the previous
checkpoints are untouched.

Resume (`select_resume`, then `load`): the newest checkpoint is verified against its
integrity.json before anything of it is read (DCP's `.metadata` is a pickle, so this comes
first); a corrupt or incomplete one is reported by path and, with checkpoint.on_corrupt=fallback,
set aside as corrupt_step_N while the run resumes from the newest intact one. Then the recorded
model is compared with the run's (compatibility.py): a mismatch stops before anything is loaded
or pruned, unless checkpoint.allow_model_change; so do another tokenizer or corpus
(resume_changes.py) unless allowed. After loading, the optimizer's update count must be
the recorded one (files of two saves are refused). Nothing here is unpickled: trainer state and
RNG states are JSON. DCP checkpoints are trusted input all the same (docs/reliability.md).

Pruning keeps the newest `keep` checkpoints of this run's model, and also, whatever its age,
the newest one saved while training was healthy (no non-finite step in a row at that moment),
so that a NaN halt followed by any number of restarts never deletes the last good checkpoint.
Checkpoints of another model (allow_model_change) are never pruned.

When to save is decided here too: the loop hands over what a checkpoint holds once
(`track(model, optimizer, trainer_state)`) and calls `maybe_save(step, last=...)` after every step
(checkpoint.every, and checkpoint.every_minutes: rank 0's clock, shared by an all-reduce every
step, so every rank saves at the same step), `save_now(step)` at a stop (preemption, NaN halt) and `save_final(step, ...)`
at the end (checkpoint.save_at_end). `on_shards_written` is a no-op extension point between the
shards and the commit (tests replace it to kill a save half done).

Async saves (checkpoint.async_save): DCP stages the state to CPU memory and writes it from a
background thread on a dedicated gloo group; the checkpoint becomes visible (renamed) at the
first step boundary where every rank has finished writing, or at the next save / the end.

Resharding: DCP stores each tensor's global shape and its shards, so a checkpoint saved by N
ranks loads on M ranks (or one process without FSDP). RNG states are per rank: they are
restored when the world size matches and re-seeded from (seed, step, rank) otherwise.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import sys
import time
import warnings
from pathlib import Path
from typing import List, Optional, Tuple

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from fileio.oserrors import explain_write_failure
from trainer.checkpoint import compatibility, integrity, resume_changes
from trainer.checkpoint.errors import CheckpointSaveError, CorruptCheckpoint, IncompatibleCheckpoint
from trainer.checkpoint.layout import (
    CORRUPT_PREFIX,
    STATE_FILE,
    SUPERSEDED_PREFIX,
    TMP_PREFIX,
    checkpoint_name,
    fsync_directory,
    list_checkpoints,
    move_aside,
    read_trainer_state,
    step_directories,
    step_of,
    write_json,
)
from trainer.checkpoint.rng import read_rng_state, rng_state, seed_all, set_rng_state
from trainer.config import CheckpointConfig
from trainer.distributed import DistEnv, all_gather_object, barrier, broadcast_object, process_group_timeout_s

def _warn(message: str) -> None:
    print(f"checkpoint: {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def single_process_quiet():
    """DCP in one process warns "torch.distributed is disabled ... assuming the intent is to save in a single
    process" at every save and load, which is the intent here: that warning (only) is not shown."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        yield


class Checkpointer:
    def __init__(self, cfg: CheckpointConfig, run_dir: Path, env: DistEnv, model_config=None,
                 precision_backend: Optional[str] = None):
        """model_config / precision_backend: the run's, recorded in each checkpoint and compared on resume."""
        self.cfg = cfg
        self.env = env
        self.model_config = model_config
        self.precision_backend = precision_backend
        self.dir = Path(cfg.dir) if cfg.dir else Path(run_dir) / "checkpoints"
        self.set_aside: List[Tuple[str, str]] = []  # (new path, reason) of checkpoints moved aside at resume
        self.last_saved_step = -1  # the step of the newest checkpoint this run saved or resumed from
        self._last_save_clock = time.monotonic()  # checkpoint.every_minutes counts from here
        self._tracked = None  # (model, optimizer, trainer state) that the loop's calls save
        self._pending = None  # (future, tmp_dir, final_dir, trainer_state) of an async save
        # An async save runs its collectives from a background thread: on the default group they
        # would interleave with the training step's FSDP collectives and deadlock. It gets its own
        # gloo group (created here, by every rank together).
        self._async_group = None
        if cfg.async_save and env.distributed:
            import datetime

            import torch.distributed as dist

            self._async_group = dist.new_group(backend="gloo", timeout=datetime.timedelta(
                seconds=process_group_timeout_s()))

    # ----------------------------------------------------------------------------- finding
    def verify(self, path: Path) -> List[str]:
        """Problems of a checkpoint directory, found by all ranks together (collective); [] when intact."""
        mine = integrity.verify_directory(Path(path), hash_files=self.cfg.verify, rank=self.env.rank,
                                          world_size=self.env.world_size)
        problems = []
        for found in all_gather_object(mine):
            problems += [problem for problem in found if problem not in problems]
        if not problems:
            try:
                read_trainer_state(Path(path))  # also parsed when checkpoint.verify=false skipped the hashes
            except CorruptCheckpoint as error:
                problems.append(str(error))
        return problems

    def select_resume(self) -> Optional[Path]:
        """The verified checkpoint to resume from, per checkpoint.resume (auto | none | path). Collective.

        resume=auto: the newest step_N directory that passes verification. A corrupt newer one stops
        the run (on_corrupt=stop) or is moved to corrupt_step_N (on_corrupt=fallback). No intact one
        while corrupt ones exist stops the run: starting afresh is never silent.
        """
        if self.cfg.resume == "none":
            return None
        if self.cfg.resume != "auto":
            path = Path(self.cfg.resume)
            if not path.is_dir():
                raise FileNotFoundError(f"checkpoint.resume={self.cfg.resume!r} is not a checkpoint directory")
            problems = self.verify(path)
            if problems:
                raise CorruptCheckpoint(_corrupt_message(path, problems) + "; not resuming from it")
            return path
        candidates = broadcast_object(step_directories(self.dir)[::-1] if self.env.is_main else None)
        rejected = []
        for path in candidates:
            problems = self.verify(path)
            if not problems:
                self._set_aside_corrupt(rejected)
                return path
            message = _corrupt_message(path, problems)
            if self.cfg.on_corrupt == "stop":
                raise CorruptCheckpoint(message + " (checkpoint.on_corrupt=stop; with =fallback the run would "
                                        "resume from the newest intact checkpoint)")
            if self.env.is_main:
                _warn(message + "; trying the previous one")
            rejected.append((path, message))
        earlier = broadcast_object(sorted(p.name for p in self.dir.glob(f"{CORRUPT_PREFIX}*"))
                                   if self.env.is_main and self.dir.is_dir() else [])
        if rejected or earlier:
            listed = "; ".join(message for _, message in rejected) or f"set aside before: {earlier}"
            raise CorruptCheckpoint(
                f"no intact checkpoint in {self.dir} to resume from ({listed}). Nothing was loaded; to start "
                "afresh on purpose set checkpoint.resume=none (or another checkpoint.dir)"
            )
        return None

    def _set_aside_corrupt(self, rejected: list) -> None:
        if self.env.is_main:
            for path, message in rejected:
                moved = move_aside(path, CORRUPT_PREFIX)
                _warn(f"moved {path} to {moved}")
                self.set_aside.append((str(moved), message))
        barrier()

    def _set_aside_newer(self, step: int) -> None:
        """Checkpoints of this directory beyond the resumed step belong to an abandoned history
        (a resume from an older checkpoint): move them aside so that resume=auto never returns to them."""
        if self.env.is_main:
            for path in step_directories(self.dir):
                if step_of(path) > step:
                    moved = move_aside(path, SUPERSEDED_PREFIX)
                    message = f"newer than the resumed step {step}: moved to {moved}"
                    _warn(f"{path} is {message}")
                    self.set_aside.append((str(moved), message))
        barrier()

    # ----------------------------------------------------------------------------- when to save
    def track(self, model, optimizer, trainer_state) -> None:
        """What the loop's calls below save: model, optimizer and an object whose state_dict() is
        trainer_state.json (trainer/components.py: CheckpointedState)."""
        self._tracked = (model, optimizer, trainer_state)

    def save_now(self, step: int) -> Path:
        """Save the tracked state (a stop: preemption, NaN halt)."""
        model, optimizer, trainer_state = self._tracked
        return self.save(step, model, optimizer, trainer_state.state_dict())

    def maybe_save(self, step: int, *, last: bool) -> bool:
        """After every step (collective): make a finished async save visible, then save if
        checkpoint.every or checkpoint.every_minutes says so. Never at the last step, which `save_final`
        covers. True if saved."""
        self.poll()
        due = bool(self.cfg.every) and step % self.cfg.every == 0
        if self._minutes_passed() and not due:
            due = True
        if due and not last:
            self.save_now(step)
            return True
        return False

    def _minutes_passed(self) -> bool:
        """Whether checkpoint.every_minutes have passed since the last save, by rank 0's clock (collective:
        ranks' clocks and step times differ, and all must save at the same step)."""
        if not self.cfg.every_minutes or self.cfg.every_minutes <= 0:
            return False
        passed = time.monotonic() - self._last_save_clock >= 60.0 * self.cfg.every_minutes
        if self.env.distributed:
            import torch.distributed as dist

            flag = torch.tensor([1 if passed and self.env.is_main else 0], device=self.env.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            passed = bool(flag.item())
        return passed

    def save_final(self, step: int, *, completed: bool) -> bool:
        """At the end: checkpoint.save_at_end on a completed run, unless this step is saved already;
        then wait for any async save. True if a save was made here."""
        saved = False
        if self.cfg.save_at_end and completed and self.last_saved_step != step:
            self.save_now(step)
            saved = True
        self.wait()
        return saved

    def on_shards_written(self, step: int, tmp: Path) -> None:
        """Called on every rank once every rank's shards of `step` are in `tmp`, before the checkpoint
        is committed (state file, manifest, rename). Does nothing; an extension point (the tests kill
        a process here to leave a save half done)."""

    # ----------------------------------------------------------------------------- saving
    def save(self, step: int, model, optimizer, trainer_state: dict) -> Path:
        """Save synchronously (or start an async save); returns the final directory name.

        A step is saved once: a second call for the step last saved (a stop signal in a step that
        checkpoint.every saved, or the step resumed from) returns at once, since its checkpoint is
        committed or being committed; saving it again could only put that one at risk.

        Raises CheckpointSaveError on every rank when any rank fails, after removing the partial directory.
        """
        final = self.dir / checkpoint_name(step)
        if step == self.last_saved_step:
            return final
        self.wait()  # finish a pending async save first: checkpoints become visible in order
        self.last_saved_step = step
        self._last_save_clock = time.monotonic()
        tmp = self.dir / f"{TMP_PREFIX}{step:08d}"
        error = None
        if self.env.is_main:
            try:
                self.dir.mkdir(parents=True, exist_ok=True)
                for stale in self.dir.glob(f"{TMP_PREFIX}*"):
                    shutil.rmtree(stale, ignore_errors=True)  # left by a run killed mid-save
                tmp.mkdir()
            except OSError as failure:
                error = explain_write_failure(failure, tmp)
        self._agree(error, tmp, final)
        model_state, optim_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optim": optim_state}
        rng_file = tmp / f"rng_rank{self.env.rank}.json"
        error = None
        try:
            write_json(rng_file, rng_state())
        except Exception as failure:  # noqa: BLE001 - reported, with the path, by every rank below
            error = f"rank {self.env.rank}: {explain_write_failure(failure, rng_file)}"
        self._agree(error, tmp, final)
        trainer_state = dict(trainer_state, world_size=self.env.world_size, optimizer_step=optimizer_step(optimizer))
        if self.model_config is not None:
            trainer_state.update(model_config=dataclasses.asdict(self.model_config),
                                 precision_backend=self.precision_backend,
                                 parameters=compatibility.parameter_layout(model),
                                 mamba_layout=compatibility.MAMBA_LAYOUT)
        if self.cfg.async_save and self.env.distributed:
            future = dcp.async_save(state, checkpoint_id=str(tmp), process_group=self._async_group)
            self._pending = (future, tmp, final, trainer_state)
            return final
        try:
            with single_process_quiet():
                dcp.save(state, checkpoint_id=str(tmp))  # a failure on any rank raises on every rank
        except (Exception, CheckpointException) as failure:  # noqa: BLE001 - CheckpointException is a BaseException
            self._agree(self._explain_own_failure(failure, tmp), tmp, final)
            self._fail(tmp, final, [f"{type(failure).__name__}: {failure}"], failure)  # if no rank said why
        self._finalize(tmp, final, trainer_state)
        return final

    def _explain_own_failure(self, failure: BaseException, tmp: Path) -> Optional[str]:
        """'rank r: why' if this rank's own write failed (DCP raises every rank's failures on every rank)."""
        if isinstance(failure, CheckpointException):
            if self.env.rank not in failure.failures:
                return None
            own = failure.failures[self.env.rank]
            failure = own[0] if isinstance(own, tuple) else own
        return f"rank {self.env.rank}: {explain_write_failure(failure, tmp)}"

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
        error = None
        try:
            future.result()
        except (Exception, CheckpointException) as failure:  # noqa: BLE001
            error = self._explain_own_failure(failure, tmp)
        self._agree(error, tmp, final)
        self._finalize(tmp, final, trainer_state)

    def _finalize(self, tmp: Path, final: Path, trainer_state: dict) -> None:
        barrier()  # every rank's shards are on disk
        self.on_shards_written(trainer_state["step"], tmp)
        error = None
        if self.env.is_main:
            try:
                write_json(tmp / STATE_FILE, trainer_state)
            except Exception as failure:  # noqa: BLE001
                error = explain_write_failure(failure, tmp / STATE_FILE)
        self._agree(error, tmp, final)
        # Every rank hashes its share of the files (rank 0's listing: one view of a shared directory).
        names = broadcast_object(sorted(p.name for p in tmp.iterdir()) if self.env.is_main else None)
        described, error = {}, None
        try:
            described = integrity.describe_files(tmp, names[self.env.rank::self.env.world_size])
        except OSError as failure:
            error = f"rank {self.env.rank}: cannot read back what was written: {explain_write_failure(failure, tmp)}"
        self._agree(error, tmp, final)
        files = {}
        for part in all_gather_object(described):
            files.update(part)
        error = None
        if self.env.is_main:
            try:
                integrity.write_manifest(tmp, files)
                fsync_directory(tmp)
                if final.exists():  # another history's checkpoint of this step (checkpoint.resume=none)
                    moved = move_aside(final, SUPERSEDED_PREFIX)  # moved, never deleted: no moment without it
                    _warn(f"{final} belongs to another history of this directory: moved to {moved}")
                os.rename(tmp, final)
                fsync_directory(self.dir)
            except Exception as failure:  # noqa: BLE001
                error = explain_write_failure(failure, tmp)
        self._agree(error, tmp, final)
        if self.env.is_main:
            self._prune()
        barrier()

    def _agree(self, error: Optional[str], tmp: Path, final: Path) -> None:
        """Collective: if any rank reports an error, every rank raises CheckpointSaveError (rank 0 cleans up)."""
        errors = [found for found in all_gather_object(error) if found]
        if errors:
            self._fail(tmp, final, errors, None)

    def _fail(self, tmp: Path, final: Path, errors: List[str], cause: Optional[BaseException]) -> None:
        removed = ""
        if self.env.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
            removed = (f"; no partial directory is left behind (removed {tmp})" if not tmp.exists()
                       else f"; the partial directory {tmp} could not be removed: delete it by hand")
        barrier()
        intact = [p.name for p in list_checkpoints(self.dir)]
        raise CheckpointSaveError(
            f"saving checkpoint {final} failed: {'; '.join(errors)}{removed}. "
            f"Earlier checkpoints are untouched: {intact or 'none'}"
        ) from cause

    def _prune(self) -> None:
        """Delete old checkpoints of this model beyond the newest `keep`, sparing the newest healthy one."""
        if self.cfg.keep <= 0:
            return
        ours, protected = [], None
        for path in list_checkpoints(self.dir):
            try:
                state = read_trainer_state(path)
            except CorruptCheckpoint:
                continue  # not ours to judge: resume reports it, pruning leaves it
            if self.model_config is not None and not compatibility.same_model(state, self.model_config):
                continue  # another model's checkpoint (allow_model_change): never pruned here
            ours.append(path)
            if state.get("guard", {}).get("skipped_in_a_row", 0) == 0:
                protected = path  # the newest saved before any run of non-finite steps
        for old in ours[: -self.cfg.keep]:
            if old != protected:
                shutil.rmtree(old, ignore_errors=True)

    # ----------------------------------------------------------------------------- loading
    def load(self, path: Path, model, optimizer) -> dict:
        """Check the model, tokenizer and corpus, then load model + optimizer (resharding as needed) and RNG,
        check the optimizer's step count; returns trainer_state.

        `path` must have passed `verify` (select_resume does that). With a model that differs from the
        checkpoint's, raises IncompatibleCheckpoint before reading any tensor, unless
        checkpoint.allow_model_change: then the parameters whose name and shape match are loaded, the
        others keep their init, the optimizer starts fresh, and trainer_state["model_changes"] lists why.
        A tokenizer or corpus other than the one recorded raises IncompatibleCheckpoint too, unless
        checkpoint.allow_tokenizer_change / allow_data_change (trainer_state["data_changes"] then says what).
        """
        path = Path(path)
        trainer_state = read_trainer_state(path)
        changes = []
        if self.model_config is not None:
            changes = compatibility.incompatibilities(trainer_state, self.model_config, self.precision_backend,
                                               compatibility.parameter_layout(model))
        if changes and not self.cfg.allow_model_change:
            raise IncompatibleCheckpoint(
                f"checkpoint {path} holds another model than this run's: {'; '.join(changes)}. Nothing was "
                "loaded or pruned. Resume with the checkpoint's settings, or load what matches into this model "
                "on purpose with checkpoint.allow_model_change=true (docs/reliability.md)"
            )
        refused, allowed = resume_changes.data_changes(trainer_state, self._tracked[2].records if self._tracked else {},
                                                       self.cfg)
        if refused:
            raise IncompatibleCheckpoint(
                f"checkpoint {path} was trained on other data than this run's: {'; '.join(refused)}. Nothing was "
                "loaded; resume with the checkpoint's tokenizer and data, or start a new run (docs/reliability.md)")
        if allowed:
            trainer_state["data_changes"] = allowed
        try:
            if changes:
                trainer_state["model_changes"] = changes
                trainer_state["model_load"] = self._load_matching_parameters(path, model)
            else:
                model_state, optim_state = get_state_dict(model, optimizer)
                state = {"model": model_state, "optim": optim_state}
                with single_process_quiet():
                    dcp.load(state, checkpoint_id=str(path))
                set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        except (Exception, CheckpointException) as error:  # noqa: BLE001 - verified files DCP still cannot read
            raise CorruptCheckpoint(f"cannot load {path} with DCP: {type(error).__name__}: {error}") from error
        if not changes:
            self._check_optimizer_step(path, trainer_state, optimizer)
        rng_file = path / f"rng_rank{self.env.rank}.json"
        if trainer_state.get("world_size") == self.env.world_size and rng_file.exists():
            try:
                set_rng_state(read_rng_state(rng_file))
            except ValueError as error:
                raise CorruptCheckpoint(str(error)) from error
        else:
            seed = (trainer_state.get("seed", 0) * 1_000_003 + trainer_state["step"]) * 1009 + self.env.rank
            seed_all(seed % (2**63))
        self._set_aside_newer(trainer_state["step"])
        self.last_saved_step = trainer_state["step"]
        return trainer_state

    def _check_optimizer_step(self, path: Path, trainer_state: dict, optimizer) -> None:
        """The loaded optimizer state must have taken the updates trainer_state.json records (collective).

        Files of two saves that each verify (a .distcp of another checkpoint, integrity.json edited to
        match) would otherwise resume one step's weights and Adam moments as another step."""
        recorded = trainer_state.get("optimizer_step")
        if recorded is None:  # saved before the count was recorded
            return
        found = optimizer_step(optimizer)
        disagreeing = [(rank, seen) for rank, seen in enumerate(all_gather_object(found)) if seen != recorded]
        if disagreeing:
            rank, seen = disagreeing[0]
            skipped = trainer_state.get("guard", {}).get("skipped_total", 0)
            raise CorruptCheckpoint(
                f"checkpoint {path}: its optimizer state has taken {seen} updates (as rank {rank} loaded it), but "
                f"{STATE_FILE} records {recorded} (step {trainer_state['step']}, {skipped} non-finite steps "
                "skipped): its files are not of one save (a .distcp of another checkpoint?). Not resuming from "
                "it; choose another with checkpoint.resume=<path>"
            )

    def _load_matching_parameters(self, path: Path, model) -> dict:
        """allow_model_change: load the parameters stored with the same name and shape; report the rest."""
        stored = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata  # verified before
        current = get_model_state_dict(model)
        loadable, fresh = {}, []
        for name, value in current.items():
            entry = stored.get(f"model.{name}")
            if entry is not None and tuple(getattr(entry, "size", ())) == tuple(value.shape):
                loadable[name] = value
            else:
                fresh.append(name)
        with single_process_quiet():
            dcp.load({"model": loadable}, checkpoint_id=str(path))
        set_model_state_dict(model, loadable, options=StateDictOptions(strict=False))
        dropped = sorted(key[len("model."):] for key in stored if key.startswith("model.")
                         and key[len("model."):] not in current)
        return {"loaded": len(loadable), "initialized": fresh, "dropped": dropped}


def optimizer_step(optimizer) -> int:
    """Updates the optimizer has applied: AdamW's per-parameter 'step' (the largest; 0 before the first)."""
    steps = [int(state["step"]) for state in optimizer.state.values() if "step" in state]
    return max(steps, default=0)


def _corrupt_message(path: Path, problems: List[str]) -> str:
    return f"checkpoint {path} is corrupt or incomplete: {'; '.join(problems[:4])}" + (
        f" (and {len(problems) - 4} more)" if len(problems) > 4 else "")
