"""One trainer per run directory: a second one refuses naming the holder, a killed holder leaves no
stale lock, and a multi-rank run takes the lock once (rank 0), every rank learning the outcome."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest

from trainer.loop import train
from trainer.run_lock import LOCK_FILE, RunDirectoryInUse, RunLock, lock_directories
from trainer_testing import ROOT, compose_train_config, free_port, tiny_overrides

HOLD = textwrap.dedent("""
    import sys, time
    from trainer.run_lock import RunLock
    lock = RunLock(sys.argv[1])  # kept: the lock lives as long as its open file
    lock.acquire()
    print("held", flush=True)
    time.sleep(600)
""")


def _holder(directory):
    """Another process holding `directory`'s lock, as a second trainer would."""
    process = subprocess.Popen([sys.executable, "-c", HOLD, str(directory)], cwd=ROOT, stdout=subprocess.PIPE,
                               text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert process.stdout.readline().strip() == "held"
    return process


def test_a_second_trainer_refuses_naming_the_holder_and_a_killed_holder_leaves_no_stale_lock(tmp_path, data_cache):
    run_dir = tmp_path / "run"
    holder = _holder(run_dir)
    try:
        cfg = compose_train_config(tiny_overrides(data_cache, steps=1), run_dir)
        with pytest.raises(RunDirectoryInUse) as refused:
            train(cfg)  # refused before any data, model or file of the run
        message = str(refused.value)
        assert f"host {socket.gethostname()}, pid {holder.pid}" in message, message
        assert f"lock file {run_dir / LOCK_FILE}" in message
        assert sorted(path.name for path in run_dir.iterdir()) == [LOCK_FILE]
    finally:
        holder.send_signal(signal.SIGKILL)  # no cleanup: the kernel releases the flock with the process
        holder.wait()
    lock = RunLock(run_dir)
    lock.acquire()
    lock.release()


def test_checkpoints_outside_the_run_directory_are_locked_too(tmp_path):
    run_dir, elsewhere = tmp_path / "run", tmp_path / "shared" / "checkpoints"
    assert lock_directories(run_dir, None) == [run_dir.resolve()]
    assert lock_directories(run_dir, run_dir / "checkpoints") == [run_dir.resolve()]
    assert lock_directories(run_dir, elsewhere) == [run_dir.resolve(), elsewhere.resolve()]
    holder = _holder(elsewhere)
    try:
        with pytest.raises(RunDirectoryInUse, match=f"{elsewhere} is in use by another trainer"):
            RunLock(elsewhere).acquire()
    finally:
        holder.kill()
        holder.wait()


RANKS = textwrap.dedent("""
    import sys, types
    import torch.distributed as dist
    from trainer.run_lock import RunDirectoryInUse, hold_run_directory
    rank = int(sys.argv[3])
    dist.init_process_group("gloo", rank=rank, world_size=2, init_method="tcp://127.0.0.1:" + sys.argv[4])
    for run_dir in sys.argv[1:3]:
        try:
            with hold_run_directory(run_dir, None, types.SimpleNamespace(is_main=rank == 0)):
                dist.barrier()  # both ranks inside: only one of them holds the flock
                print("rank", rank, "holds", run_dir, flush=True)
        except RunDirectoryInUse as error:
            print("rank", rank, "refused:", error, flush=True)
    dist.destroy_process_group()
""")


@pytest.mark.distributed
def test_a_two_rank_run_takes_the_lock_once_and_every_rank_learns_of_a_holder(tmp_path):
    free, held = tmp_path / "free", tmp_path / "held"
    holder = _holder(held)
    port = str(free_port())
    try:
        ranks = [subprocess.Popen([sys.executable, "-c", RANKS, str(free), str(held), str(rank), port], cwd=ROOT,
                                  text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  env=dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1"))
                 for rank in (0, 1)]
        outputs = [process.communicate(timeout=180)[0] for process in ranks]
    finally:
        holder.kill()
        holder.wait()
    assert [process.returncode for process in ranks] == [0, 0], outputs
    for rank, output in enumerate(outputs):
        assert f"rank {rank} holds {free}" in output, output  # a lock per rank would refuse rank 1
        assert f"rank {rank} refused: {held} is in use by another trainer (host {socket.gethostname()}, pid " \
               f"{holder.pid}" in output, output
