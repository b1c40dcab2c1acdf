"""StreamRelay: what reaches the client's ASGI ``send``, and how the stream ended.

Most tests feed the relay a stand-in upstream response (``content.iter_any()``,
``release()``, ``close()``) so that the bytes are exact; the last ones relay real streams
from a fake replica opened by the real ``Dispatcher``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest

from gateway.config import TimeoutSettings
from gateway.errors import UpstreamTimeout
from gateway.upstream.breaker import BreakerState, CircuitBreaker
from gateway.upstream.dispatch import Attempts, OpenStream
from gateway.upstream.pool import Replica
from gateway.upstream.relay import StreamEnd, StreamRelay
from gateway.upstream.sse import DONE
from router import Tier
from tests.gateway.upstream.conftest import Payload
from tests.support.fake_upstream import Behaviour

HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"x-request-id", b"r-1")]
TIMEOUTS = TimeoutSettings(between_chunks_s=2.0)
STALL = object()  # in a chunk script: the upstream goes quiet


def event(data: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(data) + b"\n\n"


def content(text: str) -> bytes:
    return event({"object": "chat.completion.chunk", "choices": [{"delta": {"content": text}}]})


USAGE = event(
    {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}}
)


class Upstream:
    """A stand-in for the aiohttp response: chunks as scripted; what the relay did to it."""

    def __init__(self, *chunks: object, delay_s: float = 0.0) -> None:
        self.chunks = chunks
        self.delay_s = delay_s
        self.released = 0
        self.closed = 0
        self.reads = 0
        self.content = self

    async def iter_any(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            self.reads += 1
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            if chunk is STALL:
                await asyncio.sleep(30)
            if isinstance(chunk, BaseException):
                raise chunk
            assert isinstance(chunk, bytes)
            yield chunk

    def release(self) -> None:
        self.released += 1

    def close(self) -> None:
        self.closed += 1


class Client:
    """The ASGI side: records what was sent; disconnects when told (or after ``leave_after``
    body messages)."""

    def __init__(self, leave_after: int | None = None, broken: bool = False) -> None:
        self.sent: list[dict[str, Any]] = []
        self.gone = asyncio.Event()
        self.leave_after = leave_after
        self.broken = broken
        self.receives = 0

    async def receive(self) -> dict[str, Any]:
        self.receives += 1
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        if self.broken and message["type"] == "http.response.body":
            raise ConnectionResetError("client socket broke")
        self.sent.append(message)
        bodies = [m for m in self.sent if m["type"] == "http.response.body"]
        if self.leave_after is not None and len(bodies) >= self.leave_after:
            self.gone.set()

    @property
    def bodies(self) -> list[bytes]:
        return [m["body"] for m in self.sent if m["type"] == "http.response.body"]

    @property
    def raw(self) -> bytes:
        return b"".join(self.bodies)


def open_stream(upstream: Upstream, first: list[bytes], rest: bytes = b"") -> OpenStream:
    replica = Replica("http://replica-1", CircuitBreaker(5, 10))
    replica.in_flight = 1  # as dispatch hands it over
    return OpenStream(upstream, replica, first, rest)  # type: ignore[arg-type]


async def relay(
    stream: OpenStream,
    client: Client,
    *,
    strip_usage: bool = True,
    rewrite=None,
    timeouts: TimeoutSettings = TIMEOUTS,
    attempts: Attempts | None = None,
) -> StreamEnd:
    r = StreamRelay(
        stream,
        HEADERS,
        timeouts,
        attempts or Attempts(Tier.FULL),
        strip_usage=strip_usage,
        rewrite=rewrite,
        request_id="r-1",
    )
    return await asyncio.wait_for(r.run(client.receive, client.send), 5)


# -- a stream that ends well --------------------------------------------------------------


async def test_events_are_relayed_byte_for_byte_and_the_gateways_usage_chunk_is_dropped():
    first, second, third = content("a"), content("b"), content("c")
    # the third event and the usage chunk straddle two upstream chunks
    upstream = Upstream(second + third[:9], third[9:] + USAGE + DONE)
    stream = open_stream(upstream, [first])
    client = Client()
    started = time.perf_counter()
    end = await relay(stream, client)
    assert client.sent[0] == {"type": "http.response.start", "status": 200, "headers": HEADERS}
    assert client.bodies == [first, second, third + DONE, b""]
    assert [m["more_body"] for m in client.sent[1:]] == [True, True, True, False]
    assert end.prompt_tokens == 7 and end.completion_tokens == 3
    assert end.error is None and end.error_kind is None and not end.client_gone
    assert end.first_byte_at is not None and end.first_byte_at >= started
    assert (upstream.released, upstream.closed) == (1, 0)  # a finished stream's connection
    assert stream.replica.in_flight == 0


async def test_usage_the_client_asked_for_is_kept():
    upstream = Upstream(USAGE + DONE)
    client = Client()
    end = await relay(open_stream(upstream, [content("a")]), client, strip_usage=False)
    assert client.raw == content("a") + USAGE + DONE
    assert end.prompt_tokens == 7


async def test_usage_inside_a_content_chunk_is_read_but_the_chunk_is_kept():
    chunk = event({"choices": [{"delta": {"content": "x"}}], "usage": {"prompt_tokens": 5}})
    client = Client()
    end = await relay(open_stream(Upstream(DONE), [chunk]), client)
    assert client.raw == chunk + DONE
    assert (end.prompt_tokens, end.completion_tokens) == (5, None)


async def test_a_stream_complete_in_its_first_events_reads_nothing_more():
    upstream = Upstream(content("never read"))
    client = Client()
    end = await relay(open_stream(upstream, [content("a"), USAGE, DONE]), client)
    assert client.raw == content("a") + DONE
    assert upstream.reads == 0 and upstream.released == 1
    assert end.error is None and end.prompt_tokens == 7


async def test_the_rest_of_the_first_read_is_completed_by_the_next_chunk():
    second = content("b")
    client = Client()
    await relay(open_stream(Upstream(second[5:] + DONE), [content("a")], rest=second[:5]), client)
    assert client.raw == content("a") + second + DONE


async def test_rewrite_sees_every_event_but_done_and_the_stripped_usage_chunk():
    seen: list[bytes] = []

    def rewrite(ev: bytes) -> bytes:
        seen.append(ev)
        return ev.replace(b'"b"', b'"B"')

    client = Client()
    await relay(
        open_stream(Upstream(content("b") + USAGE + DONE), [content("a")]), client, rewrite=rewrite
    )
    assert seen == [content("a"), content("b")]
    assert client.raw == content("a") + content("B") + DONE


async def test_usage_with_odd_types_is_not_reported():
    bad = event({"choices": [], "usage": {"prompt_tokens": True, "completion_tokens": "3"}})
    end = await relay(open_stream(Upstream(DONE), [content("a"), bad]), Client())
    assert (end.prompt_tokens, end.completion_tokens) == (None, None)


async def test_waiting_on_the_replica_counts_as_upstream_time():
    attempts = Attempts(Tier.FULL, upstream_s=1.0)
    upstream = Upstream(content("b"), DONE, delay_s=0.05)
    await relay(open_stream(upstream, [content("a")]), Client(), attempts=attempts)
    assert attempts.upstream_s >= 1.0 + 2 * 0.05


async def test_the_engines_kv_record_reaches_the_stream_end_and_not_the_client():
    record = {"prompt_tokens": 40, "kept_tokens": 20, "evicted_tokens": 20, "freed_blocks": 1}
    kv = event({"choices": [], "kv_transfer_params": {"gearshift_kv_compaction": record}})
    client = Client()
    end = await relay(open_stream(Upstream(USAGE + kv + DONE), [content("a")]), client)
    assert client.raw == content("a") + DONE
    assert end.kv_compaction == record and end.prompt_tokens == 7


# -- a stream that fails after its first byte ---------------------------------------------


def error_of(last_body: bytes) -> dict[str, Any]:
    """The error of a stream's last body message, which must be the error event then [DONE]."""
    error_event, done = last_body.split(b"\n\n", 1)
    assert done == DONE
    return orjson.loads(error_event.removeprefix(b"data: "))["error"]


async def test_a_cut_stream_ends_with_an_error_event_then_done():
    cut = aiohttp.ClientPayloadError("Response payload is not completed")
    upstream = Upstream(content("b"), cut)
    stream = open_stream(upstream, [content("a")])
    client = Client()
    end = await relay(stream, client)
    assert client.bodies[:2] == [content("a"), content("b")]
    assert client.sent[-1]["more_body"] is False
    err = error_of(client.bodies[-1])
    assert err["type"] == "upstream_error" and err["code"] == "upstream_unreachable"
    assert "dropped the stream before [DONE]" in err["message"]
    assert "ClientPayloadError" in err["message"]
    assert end.error_kind == "upstream_unreachable" and end.error == err["message"]
    assert not end.client_gone and end.first_byte_at is not None
    assert (upstream.released, upstream.closed) == (0, 1)  # vLLM must stop generating
    assert stream.replica.in_flight == 0


async def test_a_finishing_chunk_held_for_the_usage_chunk_goes_out_before_the_error():
    finish = event({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    cut = aiohttp.ClientPayloadError("Response payload is not completed")
    client = Client()
    end = await relay(open_stream(Upstream(finish, cut), [content("a")]), client)
    assert client.bodies[-1].startswith(finish + b"data: {")
    assert error_of(client.bodies[-1].removeprefix(finish))["code"] == "upstream_unreachable"
    assert end.error_kind == "upstream_unreachable"


async def test_a_cut_stream_counts_against_the_replica():
    # dispatch counted a success at the first event; the cut must count as the failure
    stream = open_stream(Upstream(content("b")), [content("a")])
    stream.replica.breaker = CircuitBreaker(1, 10)  # opens at the first failure
    end = await relay(stream, Client())
    assert end.error_kind == "upstream_unreachable"
    assert stream.replica.breaker.state is BreakerState.OPEN


async def test_a_client_leaving_does_not_count_against_the_replica():
    stream = open_stream(Upstream(content("b"), STALL), [content("a")])
    stream.replica.breaker = CircuitBreaker(1, 10)
    end = await relay(stream, Client(leave_after=2))  # after the second event
    assert end.client_gone and stream.replica.breaker.state is BreakerState.CLOSED


async def test_a_stream_that_ends_without_done_is_a_failure():
    upstream = Upstream(content("b"))
    client = Client()
    end = await relay(open_stream(upstream, [content("a")]), client)
    err = error_of(client.bodies[-1])
    assert end.error_kind == "upstream_unreachable"
    assert "ended the stream before [DONE]" in err["message"]
    assert upstream.closed == 1


async def test_a_stream_quiet_for_longer_than_between_chunks_times_out():
    upstream = Upstream(content("b"), STALL)
    attempts = Attempts(Tier.FULL)
    client = Client()
    timeouts = TimeoutSettings(between_chunks_s=0.1)
    end = await relay(
        open_stream(upstream, [content("a")]), client, timeouts=timeouts, attempts=attempts
    )
    err = error_of(client.bodies[-1])
    assert err == {
        "message": "replica http://replica-1 sent nothing for 0.1s mid-stream",
        "type": "timeout",
        "param": None,
        "code": "upstream_timeout",
    }
    assert end.error_kind == "upstream_timeout" and not end.client_gone
    assert attempts.upstream_s >= 0.1
    assert upstream.closed == 1


# -- the client goes away -----------------------------------------------------------------


async def test_a_client_that_leaves_mid_stream_cancels_the_upstream_request():
    upstream = Upstream(content("b"), STALL)
    stream = open_stream(upstream, [content("a")])
    client = Client(leave_after=2)  # after the second event
    started = time.monotonic()
    end = await relay(stream, client)
    assert time.monotonic() - started < 2  # did not wait for the stalled upstream
    assert end.client_gone and end.error is None and end.error_kind is None
    assert client.bodies == [content("a"), content("b")]  # no error event to a gone client
    assert (upstream.released, upstream.closed) == (0, 1)
    assert stream.replica.in_flight == 0


async def test_a_client_socket_that_breaks_mid_write_is_a_client_gone():
    upstream = Upstream(content("b"), DONE)
    stream = open_stream(upstream, [content("a")])
    end = await relay(stream, Client(broken=True))
    assert end.client_gone and end.error is None
    assert upstream.closed == 1 and stream.replica.in_flight == 0


async def test_in_flight_is_given_back_once_even_when_the_server_cancels_the_relay():
    upstream = Upstream(STALL)
    stream = open_stream(upstream, [content("a")])
    client = Client()
    r = StreamRelay(stream, HEADERS, TIMEOUTS, Attempts(Tier.FULL), strip_usage=True)
    task = asyncio.ensure_future(r.run(client.receive, client.send))
    while upstream.reads == 0:
        await asyncio.sleep(0.005)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert upstream.closed == 1 and stream.replica.in_flight == 0
    end = r.ended(UpstreamTimeout("stopping"))  # what the handler reports for it
    assert stream.replica.in_flight == 0
    assert end.error_kind == "upstream_timeout" and end.error == "stopping"
    assert end.first_byte_at is not None


# -- real streams from a fake replica -------------------------------------------------------


async def open_real(rig, url: str) -> tuple[OpenStream, Attempts]:
    attempts = Attempts(Tier.FULL)
    r = rig([url])
    result = await r.dispatcher.dispatch(
        Payload(stream=True), "/v1/chat/completions", True, attempts, allow_fallback=False
    )
    assert isinstance(result, OpenStream)
    return result, attempts


def contents(raw: bytes) -> list[str]:
    out = []
    for ev in raw.split(b"\n\n"):
        if ev.startswith(b"data: {"):
            data = orjson.loads(ev[6:])
            out += [c["delta"].get("content") for c in data.get("choices") or ()]
    return out


async def test_a_real_stream_is_relayed_whole_without_the_usage_chunk(fakes, rig):
    stream, attempts = await open_real(rig, fakes.a.url)
    client = Client()
    end = await relay(stream, client, attempts=attempts)
    assert client.raw.endswith(b"\n\n" + DONE) and b'"usage"' not in client.raw
    assert contents(client.raw) == ["", "tok0 ", "tok1 ", "tok2 ", "tok3 ", "tok4 "]
    assert (end.prompt_tokens, end.completion_tokens) == (7, 5) and end.error is None
    assert stream.replica.in_flight == 0


async def test_a_real_stream_cut_mid_way_ends_with_an_error_event(fakes, rig):
    fakes.a.then(Behaviour("cut", after=2))
    stream, attempts = await open_real(rig, fakes.a.url)
    client = Client()
    end = await relay(stream, client, attempts=attempts)
    assert contents(client.raw)[:3] == ["", "tok0 ", "tok1 "]
    assert error_of(client.bodies[-1])["code"] == "upstream_unreachable"
    assert end.error_kind == "upstream_unreachable" and stream.replica.in_flight == 0


async def test_a_real_client_disconnect_aborts_the_replicas_request(fakes, rig):
    fakes.a.then(Behaviour("stall_mid", after=2))
    stream, attempts = await open_real(rig, fakes.a.url)
    client = Client()
    relaying = asyncio.ensure_future(relay(stream, client, attempts=attempts))
    while b"tok1" not in client.raw:
        await asyncio.sleep(0.01)
    client.gone.set()
    end = await relaying
    assert end.client_gone and end.error is None
    deadline = time.monotonic() + 5
    while fakes.a.fake.disconnects == 0:
        assert time.monotonic() < deadline, "the replica never saw the hang-up"
        await asyncio.sleep(0.01)
