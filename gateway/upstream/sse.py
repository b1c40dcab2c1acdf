"""Server-sent events: splitting a byte stream into events, and the error event."""

from __future__ import annotations

import orjson

from gateway.errors import GatewayError

DONE = b"data: [DONE]\n\n"


def split_events(buf: bytes) -> tuple[list[bytes], bytes]:
    """Complete events (each with its trailing blank line) and the incomplete remainder.

    It looks for single line breaks, each checked for a second one: a one-byte search is a
    ``memchr``, some 40 times faster than the two-byte search over a recorded stream's
    first event (a prompt's token ids, tens of kilobytes without a line break)."""
    events: list[bytes] = []
    start = 0
    end = buf.find(b"\n")
    while end >= 0:
        if buf[end + 1 : end + 2] == b"\n":
            events.append(buf[start : end + 2])
            start = end + 2
            end = buf.find(b"\n", start)
        else:
            end = buf.find(b"\n", end + 1)
    return events, buf[start:]


def error_event(exc: GatewayError) -> bytes:
    """The OpenAI-style error event that ends a stream which already started, then [DONE]."""
    return b"data: " + orjson.dumps(exc.body()) + b"\n\n" + DONE
