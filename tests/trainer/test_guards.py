"""Non-finite step skipping, halting, and loss-spike detection."""

from __future__ import annotations

from trainer.guards import StepGuard


def test_non_finite_steps_are_counted_and_halt_after_limit():
    guard = StepGuard(max_consecutive_skips=3, spike_factor=3.0)
    assert guard.accept(2.0, 1.0)
    assert not guard.accept(float("nan"), 1.0)
    assert not guard.accept(2.0, float("inf"))
    assert not guard.must_halt()
    assert guard.accept(2.0, 1.0)  # a good step resets the run of skips
    for _ in range(3):
        guard.accept(float("nan"), float("nan"))
    assert guard.must_halt()
    assert guard.skipped_total == 5


def test_spike_detection_needs_history_and_ignores_spikes_in_mean():
    guard = StepGuard(max_consecutive_skips=3, spike_factor=2.0)
    assert not guard.is_spike(1.0)
    for _ in range(5):
        assert not guard.is_spike(9.0)  # not armed before 10 steps: early losses move fast
    for _ in range(200):
        assert not guard.is_spike(1.0)
    assert guard.is_spike(5.0)
    assert guard.is_spike(5.0)  # a spike does not raise the running mean
    assert not guard.is_spike(1.5)
    restored = StepGuard(3, 2.0)
    restored.load_state_dict(guard.state_dict())
    assert restored.is_spike(5.0) and not restored.is_spike(1.2)
