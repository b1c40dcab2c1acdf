"""A response's wall-clock cap (``responses.max_wall_s``): the deadline of its hosted loop.

    between steps   ``expired``: no model step starts after the deadline (checked once a
                    step's hosted calls have run; a call running at the deadline finishes
                    first, within its own timeout: the sandbox grant's ``wall_s``,
                    ``responses.mcp.timeout_s``; calls run one by one that would
                    start after it are not run, ``ResponsesService.run_calls``)
    in flight       ``bound(receive)``: the ASGI ``receive`` a model step is served with
                    says ``http.disconnect`` at the deadline, so the completion pipeline
                    stops the step exactly as when a client leaves (the tier's request is
                    aborted, the step recorded as cut); ``hit`` then tells the loop that it
                    was the deadline, not the client

So a response ends at most one hosted call's own timeout after its deadline, and a model
step never runs past it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from starlette.types import Message, Receive

DISCONNECT: Message = {"type": "http.disconnect"}


class WallClock:
    """The deadline of one response; no cap when ``limit_s`` is None."""

    def __init__(self, limit_s: float | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.deadline = None if limit_s is None else clock() + limit_s
        self.hit = False  # a model step was stopped at the deadline

    def left(self) -> float | None:
        return None if self.deadline is None else self.deadline - self.clock()

    @property
    def expired(self) -> bool:
        left = self.left()
        return left is not None and left <= 0

    def bound(self, receive: Receive) -> Receive:
        """``receive``, but an ``http.disconnect`` once the deadline has passed."""
        if self.deadline is None:
            return receive

        async def bounded() -> Message:
            left = self.left()
            if left is not None and left > 0:
                waiting = asyncio.ensure_future(receive())
                try:
                    await asyncio.wait({waiting}, timeout=left)
                    if waiting.done():
                        return waiting.result()  # the client's own message
                finally:
                    waiting.cancel()  # a no-op once done
            self.hit = True
            return DISCONNECT

        return bounded
