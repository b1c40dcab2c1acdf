"""The events of a streamed background response, kept while it runs (and a while after) so
that any number of readers follow it: the client that created it, and any that resume
with ``GET /v1/responses/{id}?stream=true&starting_after=N``.

The run writes through an ASGI ``send`` (``capture.StreamOut`` writes to it as to a
client); the log keeps each event whole, at the index of its ``sequence_number`` (every
event of the response passes here, numbered from 0), so resuming after N is reading from
N + 1. Readers never hold the run back: a reader that leaves just stops reading.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from starlette.types import Message

from gateway.upstream.sse import split_events


class EventLog:
    def __init__(self) -> None:
        self.events: list[bytes] = []
        self.done = False
        self._buffer = b""
        self._wake = asyncio.Event()

    async def send(self, message: Message) -> None:
        """The run's ASGI messages: bodies are events, the start is not kept."""
        if message["type"] == "http.response.body":
            self.write(message.get("body", b""))

    def write(self, data: bytes) -> None:
        events, self._buffer = split_events(self._buffer + data)
        if events:
            self.events.extend(events)
            self._changed()

    def close(self) -> None:
        self.done = True
        self._changed()

    def _changed(self) -> None:
        self._wake.set()
        self._wake = asyncio.Event()

    async def follow(self, starting_after: int = -1) -> AsyncIterator[bytes]:
        """The events after ``starting_after`` (a sequence number), then each as it comes,
        until the run ends."""
        i = max(starting_after + 1, 0)
        while True:
            wake = self._wake
            if i < len(self.events):
                chunk = b"".join(self.events[i:])
                i = len(self.events)
                yield chunk
                continue
            if self.done:
                return
            await wake.wait()
