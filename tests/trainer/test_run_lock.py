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
    # the checkpoint directory is always locked on its own, the default one inside the run directory included
    assert lock_directories(run_dir, None) == [run_dir.resolve(), (run_dir / "checkpoints").resolve()]
    assert lock_directories(run_dir, run_dir / "checkpoints") == [run_dir.resolve(), (run_dir / "checkpoints").resolve()]
    assert lock_directories(run_dir, run_dir) == [run_dir.resolve()]
    assert lock_directories(run_dir, elsewhere) == [run_dir.resolve(), elsewhere.resolve()]
    holder = _holder(elsewhere)
    try:
        with pytest.raises(RunDirectoryInUse, match=f"{elsewhere} is in use by another trainer"):
            RunLock(elsewhere).acquire()
    finally:
        holder.kill()
        holder.wait()


def _cli(args, cwd=ROOT, timeout=300):
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, "-m", "trainer", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def _one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr[-3000:]
    return lines[0]


@pytest.mark.parametrize("how", ["directly", "through_a_symlink"])
def test_a_run_naming_a_running_runs_checkpoints_is_refused_before_writing_anything(tmp_path, data_cache, how):
    """Run A holds its directories as a trainer does (its default checkpoint directory included); run B, with its
    own run_dir and checkpoint.dir naming A's checkpoints (or a link to them), is refused: exit 2, one line naming
    the lock file, and B leaves no directory behind."""
    import types

    from trainer.run_lock import hold_run_directory

    run_a, run_b = tmp_path / "A", tmp_path / "B"
    named = run_a / "checkpoints"
    if how == "through_a_symlink":
        named = tmp_path / "link"
        (run_a / "checkpoints").mkdir(parents=True)
        named.symlink_to(run_a / "checkpoints")
    with hold_run_directory(run_a, None, types.SimpleNamespace(is_main=True)):  # run A, running
        result = _cli([*tiny_overrides(data_cache, steps=2), f"run_dir={run_b}", f"checkpoint.dir={named}"])
        assert sorted(path.name for path in (run_a / "checkpoints").iterdir()) == [LOCK_FILE]  # nothing of B's
    assert result.returncode == 2, result.stderr[-3000:]
    line = _one_line(result.stderr)
    assert line.startswith("RunDirectoryInUse: ") and f"lock file {(run_a / 'checkpoints').resolve() / LOCK_FILE}" in line
    assert not run_b.exists()  # refused before anything was written: not even its directory is left


def test_a_refused_second_trainer_leaves_the_running_runs_files_alone(tmp_path, data_cache):
    """The lock comes before anything is written, Hydra's .hydra/ files included: a second trainer on a running
    run's directory (with another lr and steps) is refused in one line, exit 2, and every file of the run is as
    it was."""
    import types

    from trainer.run_lock import hold_run_directory

    run_dir = tmp_path / "run"
    first = _cli([*tiny_overrides(data_cache, steps=1), f"run_dir={run_dir}"])
    assert first.returncode == 0, first.stderr[-3000:]
    before = {path: path.read_bytes() for path in sorted(run_dir.rglob("*")) if path.is_file()}
    assert run_dir / ".hydra" / "config.yaml" in before
    with hold_run_directory(run_dir, None, types.SimpleNamespace(is_main=True)):  # the run, running again
        second = _cli([*tiny_overrides(data_cache, steps=3), "optim.lr=1e-2", f"run_dir={run_dir}"])
    assert second.returncode == 2, second.stderr[-3000:]
    assert _one_line(second.stderr).startswith(f"RunDirectoryInUse: {run_dir.resolve()} is in use by another trainer")
    after = {path: path.read_bytes() for path in sorted(run_dir.rglob("*")) if path.is_file()}
    assert after.keys() == before.keys()
    changed = [str(path) for path in before if before[path] != after[path] and path.name != LOCK_FILE]
    assert changed == []  # the running run's .hydra/*.yaml, config and logs untouched


@pytest.mark.parametrize("setting", ["run_dir", "checkpoint.dir", "run_dir below a file"])
def test_a_run_or_checkpoint_directory_that_is_a_file_is_one_line_exit_2(tmp_path, data_cache, setting):
    a_file = tmp_path / "notes.txt"
    a_file.write_text("not a directory\n")
    named = a_file / "run" if setting == "run_dir below a file" else a_file
    key = setting.split()[0]
    args = [*tiny_overrides(data_cache, steps=1), f"{key}={named}"]
    if key == "checkpoint.dir":
        args.append(f"run_dir={tmp_path / 'run'}")
    result = _cli(args)
    assert result.returncode == 2, result.stderr[-3000:]
    if named == a_file:
        assert _one_line(result.stderr) == (f"RunDirectoryUnusable: {key}={a_file.resolve()} names an existing file, "
                                            "not a directory: choose a directory (new or one of an earlier run)")
    else:
        assert _one_line(result.stderr).startswith(f"RunDirectoryUnusable: run_dir={named.resolve()} cannot be "
                                                    "created: ENOTDIR")
    assert a_file.read_text() == "not a directory\n" and not (tmp_path / "run").exists()


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
