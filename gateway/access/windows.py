"""The windows limits count in: the UTC minute (requests and tokens per minute), day and
month (token budgets), each named by its start, and how long until it ends."""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime
from typing import Literal

Period = Literal["minute", "day", "month"]
FORMATS: dict[Period, str] = {"minute": "%Y-%m-%dT%H:%M", "day": "%Y-%m-%d", "month": "%Y-%m"}


def window(period: Period, now: float) -> str:
    second = int(now)
    name = _named.get((period, second))
    if name is None:
        if len(_named) > 1000:
            _named.clear()
        name = _named[(period, second)] = time.strftime(FORMATS[period], time.gmtime(second))
    return name


_named: dict[tuple[Period, int], str] = {}  # windows of recent seconds: strftime costs


def period_of(name: str) -> Period:
    """A window's period, from the length of its name."""
    return {16: "minute", 10: "day"}.get(len(name), "month")  # type: ignore[return-value]


def seconds_left(name: str, now: float) -> int:
    """Whole seconds until the window ``name`` ends (at least 1: a Retry-After)."""
    start = datetime.strptime(name, FORMATS[period_of(name)]).replace(tzinfo=UTC)
    period = period_of(name)
    if period == "minute":
        end = start.timestamp() + 60
    elif period == "day":
        end = start.timestamp() + 86400
    else:
        nxt = (
            start.replace(year=start.year + 1, month=1)
            if start.month == 12
            else start.replace(month=start.month + 1)
        )
        end = nxt.timestamp()
    return max(1, math.ceil(end - now))


def current(now: float) -> list[str]:
    return [window(p, now) for p in FORMATS]
