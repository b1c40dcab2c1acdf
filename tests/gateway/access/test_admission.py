"""What a request reserves, and the windows limits count in."""

from __future__ import annotations

import calendar

from gateway.access import windows
from gateway.access.admission import estimate


def test_estimate_is_prompt_bytes_over_four_plus_what_may_be_generated():
    assert estimate({"max_tokens": 100}, 401, 4096) == 101 + 100
    assert estimate({"max_completion_tokens": 50, "max_tokens": 9, "n": 3}, 8, 4096) == 2 + 150
    assert estimate({}, 0, 4096) == 4096
    assert estimate({"max_tokens": "lots", "n": -1}, 4, 7) == 1 + 7


def test_windows_and_their_ends():
    now = calendar.timegm((2026, 12, 31, 23, 59, 30))
    assert windows.current(now) == ["2026-12-31T23:59", "2026-12-31", "2026-12"]
    assert windows.seconds_left("2026-12-31T23:59", now) == 30
    assert windows.seconds_left("2026-12-31", now) == 30
    assert windows.seconds_left("2026-12", now) == 30  # the year turns too
    assert windows.seconds_left("2026-02", calendar.timegm((2026, 2, 1, 0, 0, 0))) == 28 * 86400
    assert windows.seconds_left("2026-12-31T23:58", now) == 1  # never 0 in a Retry-After
    assert [windows.period_of(w) for w in windows.current(now)] == ["minute", "day", "month"]
