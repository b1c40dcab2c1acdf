"""What a response's model step sends, caught on its way out of the completion pipeline.

The pipeline serves a chat request and writes chat bytes to an ASGI ``send``; a response
replaces that ``send`` with one of these:

    Collected   a non-streamed step: the whole chat answer, held back to be translated
                into output items (or, for a refused first step, replayed as it is)
    StreamOut   a streamed step: each chat chunk told at once as Responses events; the
                stream's start is sent with the first step's, its end by ``serving``
"""

from __future__ import annotations

from dataclasses import dataclass, field

import orjson
from starlette.types import Message, Send

from gateway.pipeline.handler import STREAM_HEADERS
from gateway.pipeline.responses.stream import StreamTranslator
from gateway.pipeline.responses.wall import WallClock
from gateway.upstream.sse import split_events

JSON_HEADERS = [(b"content-type", b"application/json")]
REPLACED = {b"content-length", b"content-type", b"cache-control"}


def kept(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The pipeline's headers (request id, tier, route reason, step id) for our own body."""
    return [(k, v) for k, v in headers if k.lower() not in REPLACED]


@dataclass(slots=True)
class Collected:
    """A non-streamed pipeline answer, held back to be translated."""

    status: int = 0
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    raw_headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    body: bytes = b""

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            self.raw_headers = list(message.get("headers", []))
            self.headers = kept(self.raw_headers) + JSON_HEADERS
        elif message["type"] == "http.response.body":
            self.body += message.get("body", b"")

    def copy_to(self, other: Collected) -> None:
        other.status, other.headers, other.raw_headers = self.status, self.headers, self.raw_headers
        other.body = self.body

    async def replay(self, send: Send) -> None:
        await send(
            {"type": "http.response.start", "status": self.status, "headers": self.raw_headers}
        )
        await send({"type": "http.response.body", "body": self.body})


@dataclass(slots=True)
class StreamOut:
    """The pipeline's chat stream of each step, told as Responses events as it arrives;
    the end is sent by ``serving`` once the response is stored. ``hold``: a refused first
    step is not passed on (calls have run before it: the response must be stored), it
    fails the stream this starts; nor is the end of a step stopped at the response's
    wall-clock deadline (``wall.hit``): the response ends ``incomplete``."""

    downstream: Send
    translator: StreamTranslator
    hold: bool = False
    wall: WallClock | None = None
    started: bool = False  # the client has the stream's start
    passthrough: bool = False  # the first step answered with an error, not a stream
    refused: bytes | None = None  # a step's error answer, not passed on
    refused_status: int = 0
    buffer: bytes = b""

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            ctype = dict(message.get("headers", [])).get(b"content-type", b"")
            sse = message["status"] == 200 and ctype.startswith(b"text/event-stream")
            held = self.hold or (self.wall is not None and self.wall.hit)
            if not sse and (self.started or held):  # not the client's to see
                self.refused, self.refused_status = b"", message["status"]
                await self.begin(list(message.get("headers", [])))
                return
            if self.started:  # a later step: its start is not the client's
                return
            if not sse:
                self.passthrough = True
                await self.downstream(message)
                return
            await self.begin(list(message.get("headers", [])))
            return
        if self.passthrough:
            await self.downstream(message)
            return
        if self.refused is not None:
            self.refused += message.get("body", b"")
            return
        events, self.buffer = split_events(self.buffer + message.get("body", b""))
        await self.body(b"".join(self.translator.feed(e) for e in events))

    async def begin(self, headers: list[tuple[bytes, bytes]]) -> None:
        """The stream's start, once: the HTTP head and ``response.created`` (with the
        output items already there)."""
        if self.started:
            return
        self.started = True
        await self.downstream(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": kept(headers) + STREAM_HEADERS,
            }
        )
        await self.body(self.translator.start())

    async def body(self, events: bytes) -> None:
        if events:
            await self.downstream({"type": "http.response.body", "body": events, "more_body": True})


def error_message(body: bytes) -> str:
    """The message of an error answer (the OpenAI shape), for a response that failed."""
    try:
        error = orjson.loads(body)["error"]
        return str(error["message"]) if isinstance(error, dict) else str(error)
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return body.decode(errors="replace")[:500] or "the tier failed"
