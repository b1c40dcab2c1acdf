"""The completion pipeline end to end, in process: a real ``Services`` (aiohttp, pools,
policy, metrics, tracer) in front of fake replicas on loopback, driven through a hand-made
ASGI receive/send pair. Each test checks exactly what was sent and the one outcome that was
finished."""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.config import Settings
from gateway.errors import ModelNotFound, UpstreamError, UpstreamRateLimited
from gateway.metrics import Metrics
from gateway.pipeline.handler import CompletionPipeline
from gateway.pipeline.outcome import CLIENT_CLOSED, Outcome
from gateway.pipeline.request import ParsedRequest
from gateway.pipeline.services import Services
from gateway.recording.records import StepRecord
from gateway.upstream.sse import DONE
from router import Tier
from tests.gateway.pipeline.conftest import MESSAGES, parsed
from tests.support.fake_upstream import Behaviour, FakeUpstream, status
from tests.support.servers import free_port, serve_in_thread
from tests.support.tools import WEATHER_TOOLS

FULL_MODEL = "model-full"
FAST_MODEL = "model-fast"
SCOPE = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": []}


@dataclass
class Fakes:
    full: FakeUpstream
    fast: FakeUpstream
    full_url: str
    fast_url: str


@pytest.fixture(scope="module")
def replicas() -> Iterator[Fakes]:
    full, fast = FakeUpstream("full"), FakeUpstream("fast")
    with serve_in_thread(full.app) as full_url, serve_in_thread(fast.app) as fast_url:
        yield Fakes(full, fast, full_url, fast_url)


@pytest.fixture
def fakes(replicas: Fakes) -> Fakes:
    for fake in (replicas.full, replicas.fast):
        fake.script.clear()
        fake.requests.clear()
        fake.disconnects = 0
    return replicas


class Client:
    """The ASGI side of one request: what was sent; leaves when ``leave`` says so."""

    def __init__(self, leave: Callable[[Client], bool] | None = None) -> None:
        self.sent: list[dict[str, Any]] = []
        self.gone = asyncio.Event()
        self.leave = leave

    async def receive(self) -> dict[str, Any]:
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)
        if self.leave is not None and self.leave(self):
            self.gone.set()

    @property
    def status(self) -> int:
        (start,) = [m for m in self.sent if m["type"] == "http.response.start"]
        return int(start["status"])

    @property
    def headers(self) -> dict[str, str]:
        (start,) = [m for m in self.sent if m["type"] == "http.response.start"]
        return {k.decode(): v.decode() for k, v in start["headers"]}

    @property
    def raw(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body")

    def json(self) -> Any:
        return orjson.loads(self.raw)


class StubRecorder:
    """The recorder's interface without its writer process: keeps what it was offered."""

    def __init__(self) -> None:
        self.records: list[StepRecord] = []

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def record(self, rec: StepRecord) -> bool:
        self.records.append(rec)
        return True


@dataclass
class Gateway:
    services: Services
    pipeline: CompletionPipeline
    spans: InMemorySpanExporter
    outcomes: list[Outcome] = field(default_factory=list)

    async def __call__(self, request: ParsedRequest, client: Client | None = None) -> Client:
        client = client or Client()
        await asyncio.wait_for(self.pipeline(request, SCOPE, client.receive, client.send), 10)
        return client

    @property
    def outcome(self) -> Outcome:
        (only,) = self.outcomes
        return only

    def metric(self, name: str, **labels: str) -> float:
        return self.services.metrics.registry.get_sample_value(name, labels) or 0.0


@pytest.fixture
async def gateway() -> AsyncIterator[Callable[..., Any]]:
    started: list[Services] = []

    async def build(full: str, fast: str | None = None, *, recorder: bool = False) -> Gateway:
        tiers = {"full": {"model": FULL_MODEL, "replicas": [full]}}
        if fast is not None:
            tiers["fast"] = {"model": FAST_MODEL, "replicas": [fast]}
        settings = Settings(
            tiers=tiers,
            timeouts={"connect_s": 5, "first_byte_s": 5, "between_chunks_s": 5},
            retries={"attempts": 3, "backoff_base_s": 0.005, "backoff_max_s": 0.01},
            health={"interval_s": 60, "timeout_s": 0.5, "unhealthy_after": 10},
            # a policy these tests can predict: the short prompts here go to the fast tier
            router={"policy": "length_threshold", "calibrate_tokens": False},
            telemetry={"scrape_interval_s": 60},
            store={"enabled": False},
            sandbox={"enabled": False},
        )
        spans = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(spans))
        services = Services(settings, metrics=Metrics(), tracer_provider=provider)
        if recorder:
            services.recorder = StubRecorder()  # type: ignore[assignment]
        await services.start()
        started.append(services)
        pipeline = CompletionPipeline(services)
        gw = Gateway(services, pipeline, spans)
        finish = pipeline.finish

        async def spy(outcome: Outcome, span: Any, ticket: Any = None) -> None:
            gw.outcomes.append(outcome)
            await finish(outcome, span, ticket)

        pipeline.finish = spy  # type: ignore[assignment]
        return gw

    yield build
    for services in started:
        await services.close()


def chat(model: str = "full", **extra: Any) -> ParsedRequest:
    return parsed({"model": model, "messages": MESSAGES, **extra})


def events(raw: bytes) -> list[dict[str, Any]]:
    return [orjson.loads(ev[6:]) for ev in raw.split(b"\n\n") if ev.startswith(b"data: {")]


def contents(raw: bytes) -> list[str]:
    return [c["delta"].get("content") for data in events(raw) for c in data.get("choices") or ()]


async def eventually(check: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


# -- answered -------------------------------------------------------------------------------


async def test_a_pinned_request_is_answered_and_its_outcome_finished(fakes, gateway):
    gw = await gateway(fakes.full_url, fakes.fast_url)
    request = chat("full", temperature=0.1)
    client = await gw(request)
    assert client.status == 200 and not client.sent[-1].get("more_body", False)
    assert client.json()["choices"][0]["message"]["content"] == "hello from full"
    h = client.headers
    assert h["x-request-id"] == "req-1" and h["x-gearshift-tier"] == "full"
    assert h["x-gearshift-route-reason"] == "pinned" and "x-gearshift-step-id" not in h
    assert float(h["x-gearshift-overhead-ms"]) >= 0
    assert h["content-type"] == "application/json"
    assert fakes.full.requests == [{**request.body, "model": FULL_MODEL}]
    assert fakes.fast.requests == []
    o = gw.outcome
    assert (o.status, o.tier, o.served.attempts, o.served.replica) == (
        200,
        Tier.FULL,
        1,
        fakes.full_url,
    )
    assert (o.prompt_tokens, o.completion_tokens, o.finish_reasons) == (7, 4, ("stop",))
    assert o.response_model == FULL_MODEL and o.error is None and not o.served.fallback
    assert o.routing.decision is None and o.step is None
    assert gw.metric("gearshift_requests_total", endpoint="chat", tier="full", status="200") == 1
    assert gw.metric("gearshift_route_decisions_total", tier="full", policy="pinned") == 1
    (span,) = gw.spans.get_finished_spans()
    assert span.name == "chat full" and span.attributes["gearshift.tier"] == "full"


async def test_a_routed_request_is_served_by_the_policys_tier(fakes, gateway):
    gw = await gateway(fakes.full_url, fakes.fast_url)
    client = await gw(chat("auto"))
    assert client.json()["model"] == FAST_MODEL
    assert client.headers["x-gearshift-tier"] == "fast"
    assert client.headers["x-gearshift-route-reason"].startswith("length_threshold: ~")
    o = gw.outcome
    assert o.tier is Tier.FAST and o.routing.decision.policy == "length_threshold"
    assert o.routing.sizing is not None
    assert gw.metric("gearshift_route_decisions_total", tier="fast", policy="length_threshold") == 1


async def test_the_clients_body_is_left_as_it_came(fakes, gateway):
    gw = await gateway(fakes.full_url, fakes.fast_url, recorder=True)
    request = chat("auto", stream=True, logprobs=False)
    before = copy.deepcopy(request.body)
    await gw(request)
    assert request.body == before
    assert gw.outcome.request is request


# -- refused and failed before the first byte -------------------------------------------


async def test_an_unknown_model_is_refused_before_any_tier_is_chosen(fakes, gateway):
    gw = await gateway(fakes.full_url, fakes.fast_url)
    client = Client()
    with pytest.raises(ModelNotFound):
        await gw(chat("gpt-4"), client)
    assert client.sent == [] and gw.outcomes == [] and gw.spans.get_finished_spans() == ()
    assert gw.metric("gearshift_requests_total", endpoint="chat", tier="none", status="404") == 1
    assert fakes.full.requests == [] and fakes.fast.requests == []


async def test_a_tier_that_keeps_failing_raises_before_anything_is_sent(fakes, gateway):
    fakes.full.then(status(500), status(500), status(500))
    gw = await gateway(fakes.full_url, fakes.fast_url)
    client = Client()
    with pytest.raises(UpstreamError) as err:
        await gw(chat("full"), client)
    assert client.sent == []  # the caller answers the error (gateway.http.errors)
    o = gw.outcome
    assert (o.status, o.served.attempts, o.tier) == (502, 3, Tier.FULL)
    assert o.error == err.value.message and "returned 500: boom" in o.error
    assert gw.metric("gearshift_requests_total", endpoint="chat", tier="full", status="502") == 1
    assert len(gw.spans.get_finished_spans()) == 1


async def test_a_rate_limit_reaches_the_caller_with_its_retry_after(fakes, gateway):
    fakes.full.then(status(429, {"retry-after": "60"}))
    gw = await gateway(fakes.full_url)
    with pytest.raises(UpstreamRateLimited) as err:
        await gw(chat("full"))
    assert err.value.headers == {"retry-after": "60"}
    assert gw.outcome.status == 429


async def test_a_routed_request_falls_back_when_its_tier_is_down(fakes, gateway):
    gw = await gateway(fakes.full_url, f"http://127.0.0.1:{free_port()}")
    client = await gw(chat("auto"))
    assert client.status == 200 and client.json()["model"] == FULL_MODEL
    assert client.headers["x-gearshift-tier"] == "full"
    assert client.headers["x-gearshift-route-reason"].endswith("; fallback to full")
    o = gw.outcome
    assert o.served.fallback and o.tier is Tier.FULL and o.served.attempts == 4
    assert o.routing.tier is Tier.FAST  # what routing chose stays on record
    assert fakes.full.requests[0]["model"] == FULL_MODEL


async def test_an_invalid_fast_answer_is_escalated_before_the_client_sees_it(fakes, gateway):
    bad = {"id": "c1", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}
    fakes.fast.then(Behaviour(message={"role": "assistant", "content": None, "tool_calls": [bad]}))
    gw = await gateway(fakes.full_url, fakes.fast_url)
    client = await gw(chat("auto", tools=WEATHER_TOOLS))
    assert client.json()["choices"][0]["message"]["content"] == "hello from full"
    assert (
        "escalated to full: tool 'get_time' was not offered"
        in (client.headers["x-gearshift-route-reason"])
    )
    o = gw.outcome
    assert o.tier is Tier.FULL and o.served.escalated == "tool 'get_time' was not offered"
    assert not o.served.fallback and o.served.attempts == 2
    assert len(fakes.fast.requests) == 1 and fakes.full.requests[0]["model"] == FULL_MODEL
    assert gw.metric("gearshift_escalations_total", reason="invalid_tool_call") == 1


async def test_a_fast_answer_after_falling_back_from_full_is_not_escalated_to_it(fakes, gateway):
    # routed to full (a long prompt), full is down, the fast tier answers: sending that
    # answer back to the tier that just failed would turn a usable answer into an error
    bad = {"id": "c1", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}
    fakes.fast.then(Behaviour(message={"role": "assistant", "content": None, "tool_calls": [bad]}))
    gw = await gateway(f"http://127.0.0.1:{free_port()}", fakes.fast_url)
    long = [{"role": "user", "content": "word " * 2000}]
    client = await gw(parsed({"model": "auto", "messages": long, "tools": WEATHER_TOOLS}))
    assert client.status == 200 and client.headers["x-gearshift-tier"] == "fast"
    o = gw.outcome
    assert o.routing.tier is Tier.FULL and o.served.fallback and o.served.escalated is None
    assert gw.metric("gearshift_escalations_total", reason="invalid_tool_call") == 0


async def test_a_client_that_leaves_during_dispatch_gets_499_and_the_replica_is_hung_up_on(
    fakes, gateway
):
    fakes.full.then(Behaviour(delay_s=8.0))  # the fake stops early when the gateway hangs up
    gw = await gateway(fakes.full_url, fakes.fast_url)
    client = Client()
    asyncio.get_running_loop().call_later(0.1, client.gone.set)
    started = time.monotonic()
    await gw(chat("full"), client)
    assert time.monotonic() - started < 4  # did not wait for the replica
    assert client.status == CLIENT_CLOSED
    o = gw.outcome
    assert o.status == CLIENT_CLOSED and o.client_gone and o.served.attempts == 1
    assert gw.metric("gearshift_client_disconnects_total", tier="full") == 1
    await eventually(lambda: fakes.full.disconnects == 1)


async def test_a_server_stopping_during_dispatch_hangs_up_on_the_replica(fakes, gateway):
    fakes.full.then(Behaviour(delay_s=8.0))
    gw = await gateway(fakes.full_url, fakes.fast_url)
    client = Client()
    task = asyncio.ensure_future(gw(chat("full"), client))
    await eventually(lambda: len(fakes.full.requests) == 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert client.sent == [] and not client.gone.is_set()
    assert gw.services.pools[Tier.FULL].replicas[0].in_flight == 0
    await eventually(lambda: fakes.full.disconnects == 1)


# -- streamed -------------------------------------------------------------------------------


async def test_a_stream_is_relayed_and_its_usage_counted_but_not_shown(fakes, gateway):
    gw = await gateway(fakes.full_url, fakes.fast_url)
    client = await gw(chat("full", stream=True))
    assert client.status == 200
    h = client.headers
    assert h["content-type"] == "text/event-stream; charset=utf-8"
    assert h["x-gearshift-tier"] == "full" and h["x-gearshift-route-reason"] == "pinned"
    assert contents(client.raw) == ["", "tok0 ", "tok1 ", "tok2 ", "tok3 ", "tok4 "]
    assert client.raw.endswith(b"\n\n" + DONE) and b'"usage"' not in client.raw
    assert client.sent[-1]["more_body"] is False
    assert fakes.full.requests[0]["stream_options"] == {"include_usage": True}
    o = gw.outcome
    assert (o.status, o.prompt_tokens, o.completion_tokens) == (200, 7, 5)
    assert o.first_byte_at is not None and o.first_byte_at > o.identity.t0
    assert o.stream_error is None and not o.client_gone
    assert gw.metric("gearshift_time_to_first_token_seconds_count", tier="full") == 1


async def test_a_stream_cut_mid_way_ends_with_an_error_event(fakes, gateway):
    fakes.full.then(Behaviour("cut", after=2))
    gw = await gateway(fakes.full_url, fakes.fast_url)
    client = await gw(chat("full", stream=True))
    assert client.status == 200 and contents(client.raw)[:3] == ["", "tok0 ", "tok1 "]
    error_event, done = client.sent[-1]["body"].split(b"\n\n", 1)
    assert done == DONE
    assert orjson.loads(error_event[6:])["error"]["code"] == "upstream_unreachable"
    o = gw.outcome
    assert o.status == 200 and o.stream_error == "upstream_unreachable" and o.error
    assert gw.metric("gearshift_stream_errors_total", tier="full", kind="upstream_unreachable") == 1


async def test_a_client_that_leaves_mid_stream_stops_the_replica(fakes, gateway):
    fakes.full.then(Behaviour("stall_mid", after=2))
    gw = await gateway(fakes.full_url, fakes.fast_url)
    client = await gw(chat("full", stream=True), Client(leave=lambda c: b"tok1" in c.raw))
    assert client.status == 200 and DONE not in client.raw
    o = gw.outcome
    assert o.status == CLIENT_CLOSED and o.client_gone and o.stream_error is None
    assert gw.metric("gearshift_client_disconnects_total", tier="full") == 1
    await eventually(lambda: fakes.full.disconnects == 1)


async def test_a_server_stopping_mid_stream_still_finishes_the_outcome(fakes, gateway):
    fakes.full.then(Behaviour("stall_mid", after=2))
    gw = await gateway(fakes.full_url, fakes.fast_url)
    client = Client()
    task = asyncio.ensure_future(gw(chat("full", stream=True), client))
    await eventually(lambda: b"tok1" in client.raw)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    o = gw.outcome
    assert o.stream_error == "shutting_down"
    assert o.error == "the gateway stopped while the answer was streaming"
    assert gw.services.pools[Tier.FULL].replicas[0].in_flight == 0
    await eventually(lambda: fakes.full.disconnects == 1)


# -- recorded -------------------------------------------------------------------------------


async def test_a_recorded_answer_is_captured_whole_and_shown_as_asked(fakes, gateway):
    gw = await gateway(fakes.full_url, fakes.fast_url, recorder=True)
    client = await gw(chat("full"))
    sent = fakes.full.requests[0]
    assert sent["return_token_ids"] is True and sent["logprobs"] is True
    body = client.json()  # as the client's own request would have been answered
    assert body.get("prompt_token_ids") is None
    assert body["choices"][0].get("token_ids") is None and body["choices"][0]["logprobs"] is None
    o = gw.outcome
    assert client.headers["x-gearshift-step-id"] == o.step.header()
    (rec,) = gw.services.recorder.records
    assert rec.step_ids == list(o.step.ids) and rec.status == 200 and rec.policy == "pinned"
    assert rec.prompt_token_ids.parsed() == list(range(1, 8))
    assert rec.choices[0].token_ids == [100, 101, 102, 103]
    assert rec.choices[0].logprobs == pytest.approx([0.0, -0.1, -0.2, -0.3])


async def test_a_recorded_stream_is_assembled_and_stripped_on_the_way_out(fakes, gateway):
    gw = await gateway(fakes.full_url, fakes.fast_url, recorder=True)
    client = await gw(chat("full", stream=True))
    for data in events(client.raw):
        assert data.get("prompt_token_ids") is None
        assert all(
            c.get("token_ids") is None and c.get("logprobs") is None for c in data["choices"]
        )
    assert contents(client.raw)[1:] == ["tok0 ", "tok1 ", "tok2 ", "tok3 ", "tok4 "]
    (rec,) = gw.services.recorder.records
    (choice,) = rec.choices
    assert choice.token_ids == list(range(100, 110)) and len(choice.logprobs) == 10
    assert choice.message == {"role": "assistant", "content": "tok0 tok1 tok2 tok3 tok4 "}
    assert choice.finish_reason == "stop" and rec.model == FULL_MODEL
    o = gw.outcome
    assert o.finish_reasons == ("stop",) and o.response_model == FULL_MODEL


# -- sessions -------------------------------------------------------------------------------


async def test_an_unnamed_sessions_next_step_continues_its_chain(fakes, gateway):
    gw = await gateway(fakes.full_url, fakes.fast_url)
    first = await gw(chat("auto"))
    reply = first.json()["choices"][0]["message"]
    second = parsed(
        {"model": "auto", "messages": [*MESSAGES, reply, {"role": "user", "content": "more"}]}
    )
    await gw(second)
    one, two = gw.outcomes
    assert not one.routing.keys.chained and two.routing.keys.chained
    assert two.routing.decision is not None


async def test_a_stream_the_replica_refuses_is_answered_as_a_whole_error(fakes, gateway):
    fakes.full.then(status(400, message="n must be 1 when streaming"))
    gw = await gateway(fakes.full_url, fakes.fast_url)
    client = await gw(chat("full", stream=True, n=2))
    assert client.status == 400 and client.headers["content-type"] == "application/json"
    assert client.json()["error"]["message"] == "n must be 1 when streaming"
    o = gw.outcome
    assert o.status == 400 and o.error == "n must be 1 when streaming" and o.first_byte_at is None
    assert gw.metric("gearshift_requests_total", endpoint="chat", tier="full", status="400") == 1
