"""Server-sent events: splitting a byte stream into events, and the error event."""

from __future__ import annotations

import orjson

from gateway.errors import GatewayError

DONE = b"data: [DONE]\n\n"


def split_events(buf: bytes) -> tuple[list[bytes], bytes]:
    """Complete events (each with its trailing blank line) and the incomplete remainder."""
    events: list[bytes] = []
    start = 0
    while (end := buf.find(b"\n\n", start)) >= 0:
        events.append(buf[start : end + 2])
        start = end + 2
    return events, buf[start:]


def error_event(exc: GatewayError) -> bytes:
    """The OpenAI-style error event that ends a stream which already started, then [DONE]."""
    return b"data: " + orjson.dumps(exc.body()) + b"\n\n" + DONE
