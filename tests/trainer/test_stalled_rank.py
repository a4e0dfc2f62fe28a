"""A stopped (SIGSTOP) or killed rank of a 2-process gloo run: the other stops within
parallel.collective_timeout_s, with a message naming the rank or the collective it waited in."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from trainer_testing import launch_ranks, tiny_overrides

TIMEOUT_S = 8


@pytest.mark.distributed
@pytest.mark.parametrize("fault", [signal.SIGSTOP, signal.SIGKILL], ids=["SIGSTOP", "SIGKILL"])
def test_the_other_rank_stops_within_the_timeout_naming_the_culprit(tmp_path, data_cache, fault):
    args = tiny_overrides(data_cache, steps=100_000) + [f"parallel.collective_timeout_s={TIMEOUT_S}",
                                                        "checkpoint.save_at_end=false"]
    ranks = launch_ranks(args, tmp_path / "run", tmp_path)  # as srun starts them: no torchrun agent
    (rank0, _), (rank1, _) = ranks
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
        for process, _ in ranks:
            if process.poll() is None:
                process.kill()  # the stopped rank: SIGKILL ends a stopped process too
            process.wait()
    output = (tmp_path / "rank0.log").read_text()
    assert rank0.returncode != 0, output[-3000:]
    # Within the timeout (and the heartbeat's check interval), plus slack for a loaded CI machine.
    assert elapsed < TIMEOUT_S + 20, (elapsed, output[-3000:])
    # The heartbeat names the rank; a collective that fails first names itself (and the step).
    heartbeat = "rank 1 (" in output and "sent no heartbeat" in output
    collective = re.search(r"CollectiveTimeout: rank 0: .*step \d+.* (did not complete within "
                           r"parallel.collective_timeout_s=8 s|failed: a peer rank closed its connection)", output)
    assert heartbeat or collective, output[-3000:]
