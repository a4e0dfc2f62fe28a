"""A stopped (SIGSTOP) or killed rank of a 2-process gloo run: the other stops within
parallel.collective_timeout_s, with a message naming the rank or the collective it waited in."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from trainer_testing import ROOT, tiny_overrides

TIMEOUT_S = 8


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _start_ranks(tmp_path, data_cache):
    """Two ranks as a launcher like srun starts them: environment only, no torchrun agent to tear them down."""
    args = tiny_overrides(data_cache, steps=100_000) + [f"parallel.collective_timeout_s={TIMEOUT_S}",
                                                        "checkpoint.save_at_end=false", f"run_dir={tmp_path / 'run'}"]
    port = _free_port()
    ranks = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        log = open(tmp_path / f"rank{rank}.log", "w")
        ranks.append((subprocess.Popen([sys.executable, "-m", "trainer", *args], cwd=ROOT, env=env, stdout=log,
                                       stderr=subprocess.STDOUT), log))
    return ranks


@pytest.mark.distributed
@pytest.mark.parametrize("fault", [signal.SIGSTOP, signal.SIGKILL], ids=["SIGSTOP", "SIGKILL"])
def test_the_other_rank_stops_within_the_timeout_naming_the_culprit(tmp_path, data_cache, fault):
    ranks = _start_ranks(tmp_path, data_cache)
    (rank0, log0), (rank1, log1) = ranks
    try:
        metrics = tmp_path / "run" / "metrics.jsonl"
        deadline = time.time() + 240
        while not metrics.exists() or len(metrics.read_text().splitlines()) < 3:
            assert time.time() < deadline and rank0.poll() is None and rank1.poll() is None, \
                (tmp_path / "rank0.log").read_text()[-3000:]
            time.sleep(0.2)
        os.kill(rank1.pid, fault)
        stopped_at = time.time()
        rank0.wait(timeout=TIMEOUT_S + 60)
        elapsed = time.time() - stopped_at
    finally:
        for process, log in ranks:
            if process.poll() is None:
                process.kill()  # the stopped rank: SIGKILL ends a stopped process too
            process.wait()
            log.close()
    output = (tmp_path / "rank0.log").read_text()
    assert rank0.returncode != 0, output[-3000:]
    # Within the timeout (and the heartbeat's check interval), plus slack for a loaded CI machine.
    assert elapsed < TIMEOUT_S + 20, (elapsed, output[-3000:])
    # The heartbeat names the rank; a collective that fails first names itself (and the step).
    heartbeat = "rank 1 (" in output and "sent no heartbeat" in output
    collective = re.search(r"CollectiveTimeout: rank 0: .*step \d+.* (did not complete within "
                           r"parallel.collective_timeout_s=8 s|failed: a peer rank closed its connection)", output)
    assert heartbeat or collective, output[-3000:]
