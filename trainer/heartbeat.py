"""Stalled or dead ranks are named, and the others stop, within parallel.collective_timeout_s.

Two mechanisms, because either alone leaves a gap:

1. The process-group timeout (init_process_group(timeout=...), set in trainer/distributed.py).
   A collective waiting for a peer fails after it. NCCL's watchdog names the collective; gloo
   only says "Timed out waiting 600000ms for recv operation", so the loop re-raises it as a
   `CollectiveTimeout` naming the rank and what the step was doing (`raise_if_collective_timeout`).
2. A heartbeat thread per rank (`Heartbeat`). Every interval it increments its own counter in
   the rendezvous store (c10d TCPStore at MASTER_ADDR:MASTER_PORT: rank 0's or torchrun's
   agent's; a client connection of its own, so that a blocked call never holds up the process
   group's) and reads the counter of the rank it watches (the next one, in a ring: 3 store
   calls per rank per interval whatever the world size). A counter that has not moved for the
   timeout means that process is stopped (SIGSTOP, swapped out, a hung kernel call) or gone:
   the watcher writes "rank k stalled" under a key every rank reads, prints it, and ends its
   process (os._exit: the main thread may sit in a collective that cannot be interrupted).
   Every other rank reads the key within one interval and stops with the same message.
   The heartbeat measures liveness, not progress: a rank busy in a long step or save beats on.
   A rank whose main thread hangs while its heartbeat runs is caught by mechanism 1.

A store that stays unreachable for the timeout (its host is gone) ends the rank the same way.
"""

from __future__ import annotations

import datetime
import os
import socket
import sys
import threading
import time
from typing import Optional

STALLED_EXIT_CODE = 75
"""Exit status of a rank stopped by the heartbeat watchdog."""

# torchrun's agent store outlives a restart of the workers: keys are scoped to the attempt.
_KEY = (f"hybrid_nvfp4/{os.environ.get('TORCHELASTIC_RUN_ID', 'run')}/"
        f"{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/heartbeat")


class CollectiveTimeout(RuntimeError):
    """A collective did not complete within the process-group timeout; names the rank and the phase."""


_TIMED_OUT = ("Timed out", "timed out", "Timeout")
_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "Connection refused")


def raise_if_collective_timeout(error: BaseException, phase: str, rank: int, timeout_s: float) -> None:
    """Re-raise a process-group timeout, or a peer's lost connection, saying where it happened."""
    text = str(error)
    if not isinstance(error, RuntimeError):
        return
    if any(mark in text for mark in _TIMED_OUT):
        raise CollectiveTimeout(
            f"rank {rank}: {phase} did not complete within parallel.collective_timeout_s={timeout_s:g} s: another "
            f"rank is stalled or dead (the heartbeat message or that rank's log names it). "
            f"Backend: {text.strip()[:300]}"
        ) from error
    if any(mark in text for mark in _PEER_GONE):
        raise CollectiveTimeout(
            f"rank {rank}: {phase} failed: a peer rank closed its connection (it died or was killed; its log says "
            f"why). Backend: {text.strip()[:300]}"
        ) from error


def interval_for(timeout_s: float) -> float:
    """Seconds between heartbeats: a fifth of the timeout, at most 10 s."""
    return min(10.0, max(0.05, timeout_s / 5))


class Heartbeat:
    """Background liveness check of the rank `rank + 1 mod world_size`; see the module docstring."""

    def __init__(self, rank: int, world_size: int, timeout_s: float, host: str, port: int):
        self.rank = rank
        self.world_size = world_size
        self.timeout_s = timeout_s
        self.interval_s = interval_for(timeout_s)
        self.watched = (rank + 1) % world_size
        self._address = (host, port)
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._store = None

    @classmethod
    def from_environment(cls, rank: int, world_size: int, timeout_s: float) -> Optional["Heartbeat"]:
        """A heartbeat for a process group set up from MASTER_ADDR/MASTER_PORT (torchrun, srun); else None."""
        if world_size < 2 or "MASTER_ADDR" not in os.environ or "MASTER_PORT" not in os.environ:
            return None
        return cls(rank, world_size, timeout_s, os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))

    def start(self) -> None:
        import torch.distributed as dist

        host, port = self._address
        self._store = dist.TCPStore(host, port, is_master=False, wait_for_workers=False,
                                    timeout=datetime.timedelta(seconds=max(1.0, 2 * self.interval_s)))
        self._store.set(f"{_KEY}/host/{self.rank}", f"{socket.gethostname()} pid {os.getpid()}")
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-rank{self.rank}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the thread, and tell the watcher of this rank that its silence from now on is no stall."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * self.interval_s + 5)
        if self._store is not None:
            try:
                self._store.set(f"{_KEY}/done/{self.rank}", "1")
            except Exception:  # noqa: BLE001 - the store may be gone already (rank 0 exited first)
                pass

    def _run(self) -> None:
        last_value, last_change, last_contact = None, time.monotonic(), time.monotonic()
        while not self._stop.wait(self.interval_s):
            now = time.monotonic()
            try:
                self._store.add(f"{_KEY}/beat/{self.rank}", 1)
                if self._store.check([f"{_KEY}/stalled"]):
                    self._exit(self._store.get(f"{_KEY}/stalled").decode())
                value = self._store.add(f"{_KEY}/beat/{self.watched}", 0)  # read without blocking
                stalled = value == last_value and now - last_change > self.timeout_s
                if stalled and self._store.check([f"{_KEY}/done/{self.watched}"]):
                    return  # it finished its run normally and stopped beating
                last_contact = now
            except Exception as error:  # noqa: BLE001 - the store itself is unreachable
                if now - last_contact > self.timeout_s:
                    self._exit(f"rank {self.rank} cannot reach the rendezvous store at {self._address[0]}:"
                               f"{self._address[1]} for {now - last_contact:.0f} s (its host, rank 0 or the "
                               f"launcher, is stalled or dead): {type(error).__name__}: {error}")
                continue
            if value != last_value:
                last_value, last_change = value, now
            elif stalled:
                message = (f"rank {self.watched} ({self._host_of(self.watched)}) sent no heartbeat for "
                           f"{now - last_change:.0f} s (parallel.collective_timeout_s={self.timeout_s:g}): it is "
                           f"stalled (stopped, hung or swapping) or dead; stopping every rank (noticed by rank "
                           f"{self.rank})")
                try:
                    self._store.set(f"{_KEY}/stalled", message)
                except Exception:  # noqa: BLE001 - this rank stops with the message either way
                    pass
                self._exit(message)

    def _host_of(self, rank: int) -> str:
        try:
            return self._store.get(f"{_KEY}/host/{rank}").decode()
        except Exception:  # noqa: BLE001
            return "host unknown"

    def _exit(self, message: str) -> None:
        if self._stop.is_set():  # the run is ending normally: peers leave at slightly different times
            return
        print(f"heartbeat (rank {self.rank}): {message}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(STALLED_EXIT_CODE)
