"""Relay an upstream event stream to the client, as a raw ASGI response.

Why not Starlette's StreamingResponse: the relay must (1) notice a client that
went away while the upstream is between tokens and cancel the upstream request
at once, so vLLM stops generating, (2) end a stream that fails after its first
byte with an OpenAI-style error event and ``[DONE]``, and (3) account for the
time spent waiting on the replica so that overhead figures stay honest.
Events that arrive together (speculative decoding sends several tokens per
chunk) are forwarded in one write.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from gateway.config import TimeoutSettings
from gateway.context import RequestContext
from gateway.dispatch import OpenStream
from gateway.errors import GatewayError, UpstreamTimeout, UpstreamUnreachable
from gateway.recording.capture import StreamCapture
from gateway.sse import DONE, error_event, split_events
from gateway.upstream import translated

log = logging.getLogger(__name__)

USAGE_MARK = b'"usage":{'
EMPTY_CHOICES = b'"choices":[]'


class StreamRelay(Response):
    """A Response subclass so FastAPI hands it to the server untouched."""

    def __init__(
        self,
        ctx: RequestContext,
        stream: OpenStream,
        headers: list[tuple[bytes, bytes]],
        timeouts: TimeoutSettings,
        strip_usage: bool,
        on_finish: Callable[[RequestContext, str | None, bool], Awaitable[None]],
        capture: StreamCapture | None = None,
    ) -> None:
        self.status_code = 200
        self.background = None
        self.raw_headers = headers
        self._ctx = ctx
        self._stream = stream
        self._timeouts = timeouts
        self._strip_usage = strip_usage
        self._on_finish = on_finish
        self._capture = capture
        self._saw_done = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        error_kind: str | None = None
        client_gone = False
        relay = asyncio.ensure_future(self._relay(send))
        watch = asyncio.ensure_future(wait_disconnect(receive))
        try:
            await asyncio.wait({relay, watch}, return_when=asyncio.FIRST_COMPLETED)
            if not relay.done():
                client_gone = True
                relay.cancel()
            watch.cancel()
            try:
                error_kind = await relay
            except asyncio.CancelledError:
                if not client_gone:
                    raise
            except OSError:  # the client's socket broke mid-write
                client_gone = True
        finally:
            watch.cancel()
            if not relay.done():  # we were cancelled ourselves (server shutdown)
                relay.cancel()
            self._close_upstream()
            await self._on_finish(self._ctx, error_kind, client_gone)

    def _close_upstream(self) -> None:
        s = self._stream
        s.replica.in_flight -= 1
        if self._saw_done:
            s.response.release()
        else:
            s.response.close()  # aborts the request on the replica: vLLM stops generating

    def _filter(self, events: list[bytes]) -> bytes:
        out: list[bytes] = []
        for ev in events:
            if ev == DONE:
                self._saw_done = True
                out.append(ev)
                continue
            if USAGE_MARK in ev:
                self._note_usage(ev)
                if self._strip_usage and EMPTY_CHOICES in ev:
                    continue  # the usage chunk the gateway asked for, not the client
            out.append(ev if self._capture is None else self._capture.on_event(ev))
        return b"".join(out)

    def _note_usage(self, event: bytes) -> None:
        with contextlib.suppress(orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
            usage = orjson.loads(event[5:])["usage"]
            self._ctx.prompt_tokens = usage.get("prompt_tokens")
            self._ctx.completion_tokens = usage.get("completion_tokens")

    async def _relay(self, send: Send) -> str | None:
        """Forward events; returns an error kind when the stream ended badly."""
        ctx, s = self._ctx, self._stream
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        await send(
            {"type": "http.response.body", "body": self._filter(s.first_events), "more_body": True}
        )
        ctx.first_byte_at = time.perf_counter()
        buf = s.rest
        chunks = s.response.content.iter_any()
        error: GatewayError | None = None
        try:
            while not self._saw_done:
                chunk = await self._read(chunks)
                if chunk is None:
                    break
                events, buf = split_events(buf + chunk)
                if events:
                    await send(
                        {
                            "type": "http.response.body",
                            "body": self._filter(events),
                            "more_body": True,
                        }
                    )
            if not self._saw_done:
                error = UpstreamUnreachable(
                    f"replica {s.replica.url} ended the stream before [DONE]"
                )
        except UpstreamTimeout:
            error = UpstreamTimeout(
                f"replica {s.replica.url} sent nothing for {self._timeouts.between_chunks_s:g}s mid-stream"
            )
        except UpstreamUnreachable as exc:
            error = UpstreamUnreachable(
                f"replica {s.replica.url} dropped the stream before [DONE]: {exc.__cause__!r}"
            )
        except GatewayError as exc:
            error = exc
        if error is not None:
            log.warning("stream %s failed after its first byte: %s", ctx.request_id, error.message)
            ctx.error = error.message
            await send(
                {"type": "http.response.body", "body": error_event(error), "more_body": False}
            )
            return error.code or error.type
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return None

    async def _read(self, chunks: AsyncIterator[bytes]) -> bytes | None:
        """The next upstream chunk, None at its end; only upstream failures are translated here."""
        started = time.perf_counter()
        try:
            with translated(self._stream.replica.url):
                async with asyncio.timeout(self._timeouts.between_chunks_s):
                    return await anext(chunks)
        except StopAsyncIteration:
            return None
        finally:
            self._ctx.upstream_s += time.perf_counter() - started


async def wait_disconnect(receive: Receive) -> None:
    """Return when the client disconnects (the request body must already be read)."""
    while True:
        message: Any = await receive()
        if message["type"] == "http.disconnect":
            return
