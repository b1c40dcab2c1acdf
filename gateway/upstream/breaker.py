"""A per-replica circuit breaker (closed → open → half-open → closed).

Closed: requests flow; ``failure_threshold`` consecutive failures open it.
Open: no requests until ``reset_after_s`` has passed; then one trial request
is let through (half-open). Its success closes the circuit, its failure opens
it again for another ``reset_after_s``. The clock is injected for tests.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from enum import StrEnum


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class CircuitBreaker:
    __slots__ = (
        "_clock",
        "_failures",
        "_opened_at",
        "_reset_after_s",
        "_threshold",
        "_trial",
        "state",
    )

    def __init__(
        self,
        failure_threshold: int,
        reset_after_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._threshold = failure_threshold
        self._reset_after_s = reset_after_s
        self._clock = clock
        self._failures = 0
        self._opened_at = 0.0
        self._trial = False
        self.state = BreakerState.CLOSED

    def available(self) -> bool:
        """Would a request be let through now? (No side effects.)"""
        if self.state is BreakerState.CLOSED:
            return True
        if self.state is BreakerState.OPEN:
            return self._clock() - self._opened_at >= self._reset_after_s
        return not self._trial

    def acquire(self) -> None:
        """Take the slot ``available()`` promised; the trial slot when not closed."""
        if self.state is BreakerState.OPEN:
            self.state = BreakerState.HALF_OPEN
        if self.state is BreakerState.HALF_OPEN:
            self._trial = True

    def record_success(self) -> None:
        self._failures = 0
        self._trial = False
        self.state = BreakerState.CLOSED

    def record_failure(self) -> None:
        self._failures += 1
        if self.state is BreakerState.HALF_OPEN or self._failures >= self._threshold:
            self.state = BreakerState.OPEN
            self._opened_at = self._clock()
            self._trial = False

    def release(self) -> None:
        """A request that neither succeeded nor failed (client went away) gives back the trial."""
        self._trial = False
