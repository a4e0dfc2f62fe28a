"""One trainer per run directory: an exclusive OS lock held for the whole run.

Two trainers on one run directory would write every metrics line twice, delete each other's
saves in progress (the stale `.tmp_` cleanup) and overwrite each other's checkpoints. So a run
holds `<run dir>/trainer.lock` (and `<checkpoint.dir>/trainer.lock` when checkpoints live
elsewhere) with `fcntl.flock(LOCK_EX | LOCK_NB)` from before it writes anything until it exits.
The file records the holder (host, pid, start time, command line); a second trainer refuses with
`RunDirectoryInUse` naming it.

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
from pathlib import Path
from typing import Iterator, List, Optional

LOCK_FILE = "trainer.lock"
DEFAULT_RUN_DIR = "outputs/run"
"""The run directory when run_dir is not set (train() without Hydra)."""
_UNSUPPORTED = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


class RunDirectoryInUse(RuntimeError):
    """Another trainer holds the run directory; the message names it (host, pid)."""


class RunLock:
    """An exclusive, non-blocking flock on `<directory>/trainer.lock` recording its holder."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self.path = self.directory / LOCK_FILE
        self.unsupported: Optional[str] = None  # why the filesystem could not lock, when it could not
        self._handle = None

    def acquire(self) -> None:
        """Take the lock or raise RunDirectoryInUse naming its holder."""
        self.directory.mkdir(parents=True, exist_ok=True)
        handle = open(self.path, "a+")  # never truncated before the lock is ours: it names the holder
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


def _describe_holder(text: str) -> str:
    try:
        holder = json.loads(text)
        return (f"host {holder['host']}, pid {holder['pid']}, started {holder.get('started', '?')}: "
                f"{' '.join(holder.get('command', []))[:200]}")
    except (ValueError, KeyError, TypeError):
        return "holder not recorded yet"


def lock_directories(run_dir, checkpoint_dir) -> List[Path]:
    """The directories a run writes into: its run directory, and checkpoint.dir when outside it."""
    directories = [Path(run_dir).resolve()]
    if checkpoint_dir:
        checkpoints = Path(checkpoint_dir).resolve()
        if checkpoints != directories[0] and directories[0] not in checkpoints.parents:
            directories.append(checkpoints)
    return directories


@contextlib.contextmanager
def hold_run_directory(run_dir, checkpoint_dir, env) -> Iterator[List[str]]:
    """Hold the run's directories for the block (collective: rank 0 locks, every rank learns the outcome).

    Yields the warnings of directories the filesystem could not lock (empty when all are held);
    raises RunDirectoryInUse on every rank when another trainer holds one. `env`: anything with
    `is_main` (trainer.distributed.DistEnv); the process group, if any, is the default one.
    """
    import torch.distributed as dist

    locks, outcome = [], {"error": None, "unsupported": []}
    if env.is_main:
        try:
            for directory in lock_directories(run_dir, checkpoint_dir):
                lock = RunLock(directory)
                lock.acquire()
                locks.append(lock)
                if lock.unsupported:
                    outcome["unsupported"].append(
                        f"cannot lock {lock.path} ({lock.unsupported}): this filesystem does not support flock, "
                        "so a second trainer on this directory would not be stopped")
        except RunDirectoryInUse as error:
            outcome["error"] = str(error)
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        shared = [outcome]
        dist.broadcast_object_list(shared, src=0)  # rank 0's outcome is every rank's
        outcome = shared[0]
    try:
        if outcome["error"]:
            raise RunDirectoryInUse(outcome["error"])
        for warning in outcome["unsupported"] if env.is_main else []:
            print(f"warning: {warning}", file=sys.stderr, flush=True)
        yield outcome["unsupported"]
    finally:
        for lock in locks:
            lock.release()
