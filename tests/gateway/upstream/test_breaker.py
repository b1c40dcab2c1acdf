from __future__ import annotations

from gateway.upstream.breaker import BreakerState, CircuitBreaker


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_opens_after_threshold_and_recovers_through_one_trial():
    clock = Clock()
    b = CircuitBreaker(failure_threshold=3, reset_after_s=10, clock=clock)
    for _ in range(2):
        b.record_failure()
    assert b.state is BreakerState.CLOSED and b.available()
    b.record_failure()
    assert b.state is BreakerState.OPEN and not b.available()
    clock.now = 9.9
    assert not b.available()
    clock.now = 10
    assert b.available()
    b.acquire()
    assert b.state is BreakerState.HALF_OPEN
    assert not b.available()  # only one trial at a time
    b.record_success()
    assert b.state is BreakerState.CLOSED and b.available()


def test_failed_trial_reopens_for_a_full_period():
    clock = Clock()
    b = CircuitBreaker(failure_threshold=1, reset_after_s=5, clock=clock)
    b.record_failure()
    clock.now = 5
    b.acquire()
    b.record_failure()
    assert b.state is BreakerState.OPEN
    clock.now = 9
    assert not b.available()
    clock.now = 10
    assert b.available()


def test_success_resets_the_failure_count():
    b = CircuitBreaker(failure_threshold=2, reset_after_s=5)
    b.record_failure()
    b.record_success()
    b.record_failure()
    assert b.state is BreakerState.CLOSED


def test_release_returns_an_unused_trial():
    clock = Clock()
    b = CircuitBreaker(failure_threshold=1, reset_after_s=1, clock=clock)
    b.record_failure()
    clock.now = 1
    b.acquire()
    b.release()
    assert b.available()
