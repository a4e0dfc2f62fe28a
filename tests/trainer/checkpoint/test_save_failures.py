"""A save that fails (disk full, permission denied, file-size limit) says why with the path, removes its
partial directory and leaves the earlier checkpoints intact; the run resumes from them afterwards."""

from __future__ import annotations

import errno
import os
import re
import resource
import signal
import subprocess
import sys

import pytest

from trainer.checkpoint.errors import CheckpointSaveError
from trainer.checkpoint.integrity import verify_directory
from trainer.loop import train
from trainer_testing import ROOT, compose_train_config, read_jsonl, tiny_overrides


def _checkpoint_names(run_dir):
    return sorted(p.name for p in (run_dir / "checkpoints").iterdir() if p.name != "trainer.lock")


@pytest.mark.parametrize("code, words, file_suffix", [
    (errno.ENOSPC, "no space left on device", ".distcp"),  # written by DCP
    (errno.EACCES, "permission denied", "rng_rank0.json"),  # by each rank before DCP
    (errno.EDQUOT, "disk quota exceeded", "trainer_state.json"),  # by rank 0 after DCP
])
def test_failed_save_says_why_removes_its_partial_directory_and_keeps_the_others(tmp_path, data_cache,
                                                                                 monkeypatch, code, words,
                                                                                 file_suffix):
    real_fsync = os.fsync
    failing = tmp_path / "checkpoints" / ".tmp_step_00000004"

    def fsync_failing_inside_the_second_save(descriptor):
        # Disks report a full device (or a lost permission on a network filesystem) at write,
        # fsync or close; DCP and our JSON writers all fsync every file they write.
        path = os.readlink(f"/proc/self/fd/{descriptor}")
        if path.startswith(str(failing)) and path.endswith(file_suffix):
            raise OSError(code, os.strerror(code))
        return real_fsync(descriptor)

    monkeypatch.setattr(os, "fsync", fsync_failing_inside_the_second_save)
    cfg = compose_train_config(tiny_overrides(data_cache, steps=6) + ["checkpoint.every=2"], tmp_path)
    with pytest.raises(CheckpointSaveError) as raised:
        train(cfg)
    message = str(raised.value)
    assert words in message and str(failing) in message, message
    assert "removed" in message and "step_00000002" in message
    assert _checkpoint_names(tmp_path) == ["step_00000002"]  # no partial directory left to fill the disk
    assert verify_directory(tmp_path / "checkpoints" / "step_00000002", hash_files=True) == []

    monkeypatch.setattr(os, "fsync", real_fsync)  # space freed: the run resumes from step 2
    summary = train(compose_train_config(tiny_overrides(data_cache, steps=6) + ["checkpoint.every=2"], tmp_path))
    assert summary["step"] == 6
    assert [e["step"] for e in read_jsonl(tmp_path / "events.jsonl") if e["event"] == "resumed"] == [2]


def _limit_file_size():
    # RLIMIT_FSIZE: the kernel refuses writes past this size (EFBIG) once SIGXFSZ is ignored.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (256 << 10, 256 << 10))


def test_a_real_write_failure_from_the_kernel_is_reported_with_the_path(tmp_path, data_cache):
    """No patching: the OS itself refuses the checkpoint's large shard (as a full disk would refuse it)."""
    from data import build_train_loader

    args = tiny_overrides(data_cache, steps=2)
    build_train_loader(compose_train_config(args, tmp_path).data, micro_batch_size=2)  # shards exist: only
    args += [f"run_dir={tmp_path}"]                                                    # the save writes much
    process = subprocess.run([sys.executable, "-m", "trainer", *args], cwd=ROOT, capture_output=True, text=True,
                             timeout=300, preexec_fn=_limit_file_size, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert process.returncode != 0
    assert re.search(r"CheckpointSaveError: saving checkpoint .*step_00000002 failed: .*file too large.*"
                     r"\.tmp_step_00000002", process.stderr), process.stderr[-3000:]
    assert _checkpoint_names(tmp_path) == []  # the partial directory is gone


def test_a_write_failure_without_errno_on_a_full_disk_is_called_a_full_disk(tmp_path, monkeypatch):
    """torch.save's zip writer turns a refused write into "unexpected pos 704 vs 598" (the issue's message)."""
    from torch.distributed.checkpoint.api import CheckpointException

    from fileio import oserrors

    buried = CheckpointException("save", {1: (RuntimeError("[enforce fail at inline_container.cc:672] . "
                                                           "unexpected pos 704 vs 598"), None)})
    monkeypatch.setattr(oserrors, "free_bytes", lambda path: 4096)
    assert oserrors.explain_write_failure(buried, tmp_path).startswith(
        f"no space left on device, most likely: the filesystem of {tmp_path} has 4096 bytes free")
    wrapped = CheckpointException("save", {0: (OSError(errno.ENOSPC, "No space left on device"), None)})
    assert oserrors.explain_write_failure(wrapped, tmp_path).startswith("no space left on device (OSError [Errno 28]")
