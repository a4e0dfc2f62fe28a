"""One trainer per run directory: an exclusive OS lock held for the whole run.

Two trainers on one run directory would write every metrics line twice, delete each other's
saves in progress (the stale `.tmp_` cleanup) and overwrite each other's checkpoints. So a run
holds `<run dir>/trainer.lock` and `<checkpoint directory>/trainer.lock` with
`fcntl.flock(LOCK_EX | LOCK_NB)` from before it writes anything until it exits. The checkpoint
directory is always locked on its own, wherever it lies (the default `<run dir>/checkpoints`
included) and with symlinks resolved: a second run whose `checkpoint.dir` names a running run's
checkpoints (or a link to them) is refused although its run directory is another. The file
records the holder (host, pid, start time, command line); a second trainer refuses with
`RunDirectoryInUse` naming it.

- Auto-named run directories (`outputs/<date>/<time>`, a multirun job's folder) are new by
  definition: `hold_run_directory(..., auto_named=True)` never takes one that holds an earlier
  run's files (a clock set back, two starts in one second), but the next free name
  (`<time>-1`, `<time>-2`, ...), claimed by `mkdir` and the lock, so two starts never share one.
  Only an explicit run directory (or checkpoint directory) is resumed.
- A run directory this run created and that holds nothing but lock files when the run ends (a
  start refused after the lock: data, checkpoint or model errors) is removed again.

- Once per run: rank 0 takes the locks; the other ranks learn the outcome by a broadcast and
  raise the same error (they write only checkpoint shards, inside a save rank 0 coordinates).
- Released on exit: closing the file (or the process ending, however it ends) releases a flock,
  so a holder killed with SIGKILL leaves no stale lock; the file stays, with the last holder's
  record, and is taken over by the next trainer.
- Filesystems: flock is honoured by local filesystems, NFSv4 (Linux maps it to byte-range locks
  the server arbitrates) and Lustre mounted with `-o flock`. Where the filesystem refuses it
  (ENOLCK, EOPNOTSUPP, ENOSYS: Lustre with `-o noflock`, some FUSE filesystems) the run goes on
  unguarded, with a warning naming the lock file; Lustre's `-o localflock` locks per node only.
  There keeping one trainer per run directory is the user's (the scheduler's) job.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, List, Optional, Tuple

from fileio.oserrors import explain_write_failure

LOCK_FILE = "trainer.lock"
DEFAULT_RUN_DIR = "outputs/run"
"""The run directory when run_dir is not set (train() without Hydra)."""
_UNSUPPORTED = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


class RunDirectoryInUse(RuntimeError):
    """Another trainer holds the run directory; the message names it (host, pid)."""


class RunDirectoryUnusable(ValueError):
    """A run or checkpoint directory that cannot be one: an existing file, or not creatable (the reason
    in words). A user's error: the message names the setting and the path."""


class RunLock:
    """An exclusive, non-blocking flock on `<directory>/trainer.lock` recording its holder.

    `label` names the setting the directory comes from in messages (run_dir, checkpoint.dir)."""

    def __init__(self, directory: Path, label: str = "the directory"):
        self.directory = Path(directory)
        self.label = label
        self.path = self.directory / LOCK_FILE
        self.unsupported: Optional[str] = None  # why the filesystem could not lock, when it could not
        self.created = False  # whether acquire() created the directory
        self._handle = None

    def acquire(self) -> None:
        """Take the lock or raise RunDirectoryInUse naming its holder (RunDirectoryUnusable when the
        directory is a file or cannot be created)."""
        self.created = make_directory(self.directory, self.label)
        try:
            handle = open(self.path, "a+")  # never truncated before the lock is ours: it names the holder
        except OSError as error:
            raise RunDirectoryUnusable(f"{_named(self.label, self.directory)}: cannot create its lock file: "
                                       f"{explain_write_failure(error, self.path)}") from None
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                handle.seek(0)
                holder = _describe_holder(handle.read())
                handle.close()
                raise RunDirectoryInUse(
                    f"{self.directory} is in use by another trainer ({holder}; lock file {self.path}). Two "
                    "trainers on one run directory would overwrite each other's checkpoints and logs: stop that "
                    "one, or give this run another run_dir (and checkpoint.dir)") from None
            if error.errno in _UNSUPPORTED:
                handle.close()
                self.unsupported = f"{type(error).__name__} [Errno {error.errno}] {error.strerror}"
                return
            handle.close()
            raise
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                                 "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                                 "command": [sys.executable, *sys.argv]}) + "\n")
        handle.flush()
        self._handle = handle

    def release(self) -> None:
        if self._handle is not None:
            self._handle.close()  # closing the last descriptor releases the flock
            self._handle = None


def make_directory(directory: Path, label: str) -> bool:
    """Create `directory` (and its parents) if needed; True if it was created here. An existing file at
    that path, or a directory that cannot be created, raises RunDirectoryUnusable naming `label`."""
    directory = Path(directory)
    if directory.is_dir():
        return False
    if directory.exists() or directory.is_symlink():
        what = "a link to nothing" if directory.is_symlink() and not directory.exists() else "an existing file"
        raise RunDirectoryUnusable(f"{_named(label, directory)} names {what}, not a directory: choose a directory "
                                   "(new or one of an earlier run)")
    try:
        directory.mkdir(parents=True)
    except FileExistsError:
        if not directory.is_dir():  # a file made in between, or a parent that is a file
            raise RunDirectoryUnusable(f"{_named(label, directory)} names an existing file, not a directory") from None
        return False  # another process made it in between
    except OSError as error:
        raise RunDirectoryUnusable(f"{_named(label, directory)} cannot be created: "
                                   f"{explain_write_failure(error, directory)}") from None
    return True


def _named(label: str, path: Path) -> str:
    """'run_dir=/x' for a setting, 'the run's checkpoint directory /x/checkpoints' for a description."""
    return f"{label} {path}" if " " in label else f"{label}={path}"


def holds_a_run(directory: Path) -> bool:
    """Whether `directory` holds anything but (empty folders and) lock files: an earlier run's files."""
    for _, _, files in os.walk(directory):
        if any(name != LOCK_FILE for name in files):
            return True
    return False


def remove_if_unused(directory: Path) -> None:
    """Remove a directory that holds nothing but lock files and empty folders (a refused start's)."""
    directory = Path(directory)
    if not directory.is_dir() or holds_a_run(directory):
        return
    for root, folders, files in os.walk(directory, topdown=False):
        for name in files:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(root, name))
        with contextlib.suppress(OSError):
            os.rmdir(root)


def claim_new_directory(base: Path, label: str = "run_dir", attempts: int = 1000) -> Tuple[Path, RunLock]:
    """The first of base, base-1, base-2, ... that holds no earlier run, locked (an auto-named run directory).

    A name is claimed by creating it, or, when it exists empty (Hydra makes a multirun job's folder), by
    its lock; two processes never claim one name, and an earlier run's directory is never taken."""
    base = Path(base)
    for index in range(attempts):
        candidate = base if index == 0 else base.with_name(f"{base.name}-{index}")
        if (candidate.exists() or candidate.is_symlink()) and (not candidate.is_dir() or holds_a_run(candidate)):
            continue
        lock = RunLock(candidate, label)
        try:
            lock.acquire()
        except RunDirectoryInUse:
            continue  # another start claimed it first
        if holds_a_run(candidate):  # written by another start between the check and the lock
            lock.release()
            continue
        return candidate, lock
    raise RunDirectoryUnusable(f"{label}: no free name next to {base} (tried {attempts})")


def _describe_holder(text: str) -> str:
    try:
        holder = json.loads(text)
        return (f"host {holder['host']}, pid {holder['pid']}, started {holder.get('started', '?')}: "
                f"{' '.join(holder.get('command', []))[:200]}")
    except (ValueError, KeyError, TypeError):
        return "holder not recorded yet"


def checkpoint_directory(run_dir, checkpoint_dir) -> Path:
    """Where the run's checkpoints go: checkpoint.dir, else <run dir>/checkpoints (as Checkpointer has it)."""
    return Path(checkpoint_dir) if checkpoint_dir else Path(run_dir) / "checkpoints"


def lock_directories(run_dir, checkpoint_dir) -> List[Path]:
    """The directories a run locks, symlinks resolved: its run directory and its checkpoint directory
    (always: another run may name it as its checkpoint.dir, directly or through a link)."""
    directories = [Path(run_dir).resolve()]
    checkpoints = checkpoint_directory(run_dir, checkpoint_dir).resolve()
    if checkpoints != directories[0]:
        directories.append(checkpoints)
    return directories


@dataclass
class HeldRunDirectory:
    """What `hold_run_directory` yields: the run directory (a new name when an auto-named one was taken),
    the checkpoint directory, and warnings of directories the filesystem could not lock."""

    run_dir: Path
    checkpoint_dir: Path
    unsupported: List[str] = field(default_factory=list)
    renamed_from: Optional[str] = None  # the auto-named directory that held an earlier run


@contextlib.contextmanager
def hold_run_directory(run_dir, checkpoint_dir, env, *, auto_named: bool = False) -> Iterator[HeldRunDirectory]:
    """Hold the run's directories for the block (collective: rank 0 locks, every rank learns the outcome).

    Yields a HeldRunDirectory (rank 0's run directory on every rank); raises RunDirectoryInUse on every
    rank when another trainer holds one, RunDirectoryUnusable when one is a file or cannot be created.
    `auto_named`: the entry point named the run directory, so it must be new (`claim_new_directory`).
    `env`: anything with `is_main` (trainer.distributed.DistEnv); the process group, if any, is the default one.
    """
    import torch.distributed as dist

    locks: List[RunLock] = []
    outcome = {"error": None, "kind": None, "unsupported": [], "run_dir": str(run_dir), "renamed_from": None}
    if env.is_main:
        try:
            if auto_named:
                claimed, lock = claim_new_directory(Path(run_dir))
                locks.append(lock)
                if claimed != Path(run_dir):
                    outcome.update(run_dir=str(claimed), renamed_from=str(run_dir))
            for directory in lock_directories(outcome["run_dir"], checkpoint_dir)[len(locks):]:
                label = "run_dir" if not locks else "checkpoint.dir" if checkpoint_dir else "the run's checkpoint directory"
                lock = RunLock(directory, label)
                lock.acquire()
                locks.append(lock)
            for lock in locks:
                if lock.unsupported:
                    outcome["unsupported"].append(
                        f"cannot lock {lock.path} ({lock.unsupported}): this filesystem does not support flock, "
                        "so a second trainer on this directory would not be stopped")
        except (RunDirectoryInUse, RunDirectoryUnusable) as error:
            outcome.update(error=str(error), kind=type(error).__name__)
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        shared = [outcome]
        dist.broadcast_object_list(shared, src=0)  # rank 0's outcome is every rank's
        outcome = shared[0]
    created = bool(locks) and (locks[0].created or auto_named)  # a directory of this start's own making
    try:
        if outcome["error"]:
            raise (RunDirectoryUnusable if outcome["kind"] == "RunDirectoryUnusable" else RunDirectoryInUse)(
                outcome["error"])
        for warning in outcome["unsupported"] if env.is_main else []:
            print(f"warning: {warning}", file=sys.stderr, flush=True)
        if outcome["renamed_from"] and env.is_main:
            print(f"run directory: {outcome['renamed_from']} holds an earlier run, which an auto-named directory never "
                  f"resumes; this run's is {outcome['run_dir']}", file=sys.stderr, flush=True)
        yield HeldRunDirectory(Path(outcome["run_dir"]), checkpoint_directory(outcome["run_dir"], checkpoint_dir),
                               outcome["unsupported"], outcome["renamed_from"])
    finally:
        if created:
            remove_if_unused(locks[0].directory)  # a start refused after the lock leaves nothing behind
        for lock in locks:
            lock.release()
