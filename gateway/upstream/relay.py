"""Relay an upstream event stream to the client over raw ASGI, and say how it ended.

Why not Starlette's StreamingResponse: the relay must (1) notice a client that went away
while the upstream is between tokens and cancel the upstream request at once, so vLLM
stops generating, (2) end a stream that fails after its first byte with an OpenAI-style
error event and ``[DONE]``, and (3) account for the time spent waiting on the replica so
that overhead figures stay honest. Events that arrive together (speculative decoding sends
several tokens per chunk) are forwarded in one write.

``StreamRelay.run`` returns a ``StreamEnd``; it calls nothing back. Events pass through
``gateway.upstream.relay_filter`` (which takes out what the gateway added to the stream,
keeping the usage and the engine's KV-compaction record) and an optional ``rewrite``
(recording's capture, which may strip fields the client did not ask for) on their way out.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from starlette.types import Receive, Send

from gateway.config import TimeoutSettings
from gateway.errors import GatewayError, UpstreamTimeout, UpstreamUnreachable
from gateway.upstream.dispatch import Attempts, OpenStream
from gateway.upstream.relay_filter import EventFilter
from gateway.upstream.sse import error_event, split_events
from gateway.upstream.transport import translated

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StreamEnd:
    """How a relayed stream ended."""

    first_byte_at: float | None  # perf_counter() when the first events went out
    prompt_tokens: int | None
    completion_tokens: int | None
    error_kind: str | None = None  # set when it failed after its first byte
    error: str | None = None
    client_gone: bool = False
    # kvplugin's record: the engine compacted this request's KV cache
    kv_compaction: dict[str, Any] | None = None


class StreamRelay:
    def __init__(
        self,
        stream: OpenStream,
        headers: Sequence[tuple[bytes, bytes]],
        timeouts: TimeoutSettings,
        attempts: Attempts,
        *,
        strip_usage: bool,
        rewrite: Callable[[bytes], bytes] | None = None,
        request_id: str = "",
    ) -> None:
        self._stream = stream
        self._headers = list(headers)
        self._timeouts = timeouts
        self._attempts = attempts
        self._filter = EventFilter(strip_usage=strip_usage, rewrite=rewrite)
        self._request_id = request_id
        self._first_byte_at: float | None = None

    async def run(self, receive: Receive, send: Send) -> StreamEnd:
        """Relay until ``[DONE]``, an upstream failure or the client's departure."""
        failure: GatewayError | None = None
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
                failure = await relay
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
        return self.ended(failure, client_gone=client_gone)

    def ended(self, failure: GatewayError | None, *, client_gone: bool = False) -> StreamEnd:
        """How the stream ended; also what a caller cancelled mid-stream reports."""
        usage = self._filter.usage
        return StreamEnd(
            self._first_byte_at,
            _int(usage.get("prompt_tokens")),
            _int(usage.get("completion_tokens")),
            (failure.code or failure.type) if failure is not None else None,
            failure.message if failure is not None else None,
            client_gone,
            self._filter.kv_compaction,
        )

    def _close_upstream(self) -> None:
        s = self._stream
        s.replica.in_flight -= 1
        if self._filter.saw_done:
            s.response.release()
        else:
            s.response.close()  # aborts the request on the replica: vLLM stops generating

    async def _relay(self, send: Send) -> GatewayError | None:
        """Forward events; returns the failure when the stream ended badly."""
        s = self._stream
        await send({"type": "http.response.start", "status": 200, "headers": self._headers})
        await send(
            {"type": "http.response.body", "body": self._filter(s.first_events), "more_body": True}
        )
        self._first_byte_at = time.perf_counter()
        failure = await self._forward(send)
        if failure is not None:
            log.warning(
                "stream %s failed after its first byte: %s", self._request_id, failure.message
            )
            s.replica.breaker.record_failure()  # dispatch counted a success at the first event
            body = self._filter.flush() + error_event(failure)
            await send({"type": "http.response.body", "body": body, "more_body": False})
            return failure
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return None

    async def _forward(self, send: Send) -> GatewayError | None:
        s = self._stream
        buf = s.rest
        chunks = s.response.content.iter_any()
        try:
            while not self._filter.saw_done:
                chunk = await self._read(chunks)
                if chunk is None:
                    break
                events, buf = split_events(buf + chunk)
                if events:
                    body = self._filter(events)
                    await send({"type": "http.response.body", "body": body, "more_body": True})
        except UpstreamTimeout:
            return UpstreamTimeout(
                f"replica {s.replica.url} sent nothing for "
                f"{self._timeouts.between_chunks_s:g}s mid-stream"
            )
        except UpstreamUnreachable as exc:
            return UpstreamUnreachable(
                f"replica {s.replica.url} dropped the stream before [DONE]: {exc.__cause__!r}"
            )
        except GatewayError as exc:
            return exc
        if not self._filter.saw_done:
            return UpstreamUnreachable(f"replica {s.replica.url} ended the stream before [DONE]")
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
            self._attempts.upstream_s += time.perf_counter() - started


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


async def wait_disconnect(receive: Receive) -> None:
    """Return when the client disconnects (the request body must already be read)."""
    while True:
        message: Any = await receive()
        if message["type"] == "http.disconnect":
            return
