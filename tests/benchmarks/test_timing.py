"""benchmarks.timing, the one CUDA timer of the benchmarks, with CUDA events faked on the CPU: calls,
synchronization and the reduction are what the benchmarks rely on."""

from __future__ import annotations

import pytest
import torch

from benchmarks import timing


class FakeEvent:
    """Records a fake clock; elapsed_time is milliseconds, as torch.cuda.Event's."""

    clock = 0.0

    def __init__(self, enable_timing: bool = False):
        assert enable_timing
        self.at = None

    def record(self):
        self.at = FakeEvent.clock

    def elapsed_time(self, end: "FakeEvent") -> float:
        return end.at - self.at


@pytest.fixture
def fake_cuda(monkeypatch):
    synchronized = []
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: synchronized.append(FakeEvent.clock))
    FakeEvent.clock = 0.0
    return synchronized


def test_warmup_calls_are_not_timed_and_each_timed_call_is_bracketed(fake_cuda):
    calls = []

    def work():  # call n takes n ms of fake GPU time
        calls.append(len(calls) + 1)
        FakeEvent.clock += len(calls)

    times = timing.cuda_times_ms(work, warmup=2, iters=3)
    assert calls == [1, 2, 3, 4, 5] and times == [3.0, 4.0, 5.0]
    assert len(fake_cuda) == 2  # after the warm-up and once at the end


def test_synchronize_each_and_the_median(fake_cuda):
    durations = iter([9.0, 1.0, 5.0, 2.0])

    def work():
        FakeEvent.clock += next(durations)

    assert timing.cuda_times_ms(work, warmup=0, iters=4, synchronize_each=True) == [9.0, 1.0, 5.0, 2.0]
    assert len(fake_cuda) == 1 + 4 + 1
    durations = iter([9.0, 1.0, 5.0])
    assert timing.cuda_median_ms(work, warmup=0, iters=3) == 5.0
