"""The finish stage: one outcome, handed once, to session state, metrics, calibration, the
span and the recorder (in that order)."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from gateway.metrics import Metrics
from gateway.pipeline.finish import Finish, anchor
from gateway.pipeline.outcome import CLIENT_CLOSED, Outcome, Served, StepPlan
from gateway.pipeline.route import Routing, Sizing
from gateway.recording.records import StepRecord
from gateway.routing.calibration import TokenCalibrator
from gateway.routing.sessions import RouteSessions, SessionKeys
from router import Decision, RouteRequest, Tier
from tests.gateway.pipeline.conftest import parsed

MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is the capital of Norway?"},
]
BODY = {"model": "auto", "messages": MESSAGES}
DECISION = Decision(Tier.FAST, "short", "rules")


class Recorder:
    """Keeps what it was offered and what the other stages had done by then."""

    def __init__(self, sessions: RouteSessions, spans: InMemorySpanExporter) -> None:
        self.records: list[StepRecord] = []
        self.sessions = sessions
        self.spans = spans
        self.seen: list[tuple[Any, int]] = []

    async def record(self, rec: StepRecord) -> bool:
        self.records.append(rec)
        self.seen.append(
            (self.sessions.get(rec.tenant, "agent-1"), len(self.spans.get_finished_spans()))
        )
        return True


class Rig:
    def __init__(self, recorder: bool = True) -> None:
        self.metrics = Metrics()
        self.sessions = RouteSessions()
        self.spans = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.tracer = provider.get_tracer("test")
        self.recorder = Recorder(self.sessions, self.spans) if recorder else None
        self.finish = Finish(self.metrics, self.sessions, TokenCalibrator(None), self.recorder)

    async def __call__(self, outcome: Outcome) -> None:
        await self.finish(outcome, self.tracer.start_span("chat auto"))

    def metric(self, name: str, **labels: str) -> float:
        return self.metrics.registry.get_sample_value(name, labels) or 0.0

    @property
    def span(self):
        (span,) = self.spans.get_finished_spans()
        return span


def sizing(body: dict[str, Any] = BODY, anchored: bool = False) -> Sizing:
    analysis = RouteRequest("chat", body).analysis
    return Sizing(analysis.counts, analysis.prompt_tokens[0], anchored, analysis.position)


def outcome(status: int = 200, *, tier: Tier = Tier.FAST, named: bool = True, **kw: Any) -> Outcome:
    request = parsed(BODY, session_id="agent-1" if named else None, t0=kw.pop("t0", 100.0))
    keys = kw.pop("keys", SessionKeys("agent-1", named=True))
    routing = Routing(Tier.FAST, DECISION, keys, kw.pop("sizing", None))
    served = Served(
        tier, attempts=1, replica="http://r", upstream_s=0.2, escalated=kw.pop("escalated", None)
    )
    kw.setdefault("ended_at", 100.5)
    return Outcome(request, routing, served, status, **kw)


async def test_a_served_request_reaches_every_stage_once_in_order():
    rig = Rig()
    step = StepPlan(("s" * 32,), 0.0)
    await rig(
        outcome(
            prompt_tokens=7,
            completion_tokens=4,
            first_byte_at=100.1,
            finish_reasons=("stop",),
            step=step,
        )
    )
    state = rig.sessions.get("default", "agent-1")
    assert state.steps == 1 and state.last_tier is Tier.FAST and state.fast_failures == 0
    assert rig.metric("gearshift_requests_total", endpoint="chat", tier="fast", status="200") == 1
    assert rig.metric(
        "gearshift_request_duration_seconds_sum", endpoint="chat", tier="fast", stream="false"
    ) == pytest.approx(0.5)
    assert rig.metric("gearshift_overhead_seconds_sum", endpoint="chat", stream="false") == (
        pytest.approx(0.3)
    )
    assert rig.metric("gearshift_time_to_first_token_seconds_sum", tier="fast") == pytest.approx(
        0.1
    )
    assert rig.metric("gearshift_tokens_total", tier="fast", kind="prompt") == 7
    assert rig.metric("gearshift_tokens_total", tier="fast", kind="completion") == 4
    attrs = rig.span.attributes
    assert attrs["http.response.status_code"] == 200 and attrs["gearshift.tier"] == "fast"
    assert attrs["gen_ai.usage.input_tokens"] == 7 and attrs["gen_ai.response.finish_reasons"] == (
        "stop",
    )
    assert rig.span.status.status_code is StatusCode.UNSET
    (rec,) = rig.recorder.records
    assert rec.step_ids == list(step.ids) and rec.status == 200 and rec.prompt_tokens == 7
    # session state and the span were done before the recorder was offered the step
    assert rig.recorder.seen == [(state, 1)]


async def test_an_outcome_without_a_step_or_recorder_is_not_recorded():
    rig = Rig()
    await rig(outcome())
    assert rig.recorder.records == []
    without = Rig(recorder=False)
    await without(outcome(step=StepPlan(("s" * 32,), 0.0)))
    assert (
        without.metric("gearshift_requests_total", endpoint="chat", tier="fast", status="200") == 1
    )


async def test_a_client_that_left_is_not_a_session_step_but_is_counted():
    rig = Rig()
    await rig(outcome(CLIENT_CLOSED, client_gone=True))
    assert rig.sessions.get("default", "agent-1") is None
    assert rig.metric("gearshift_client_disconnects_total", tier="fast") == 1
    assert rig.metric("gearshift_requests_total", endpoint="chat", tier="fast", status="499") == 1
    assert rig.metric("gearshift_time_to_first_token_seconds_count", tier="fast") == 0
    assert rig.span.attributes["error.type"] == "499"


async def test_a_failed_fast_step_counts_against_the_fast_tier():
    rig = Rig()
    await rig(outcome(502, error="replica down"))
    state = rig.sessions.get("default", "agent-1")
    assert state.steps == 1 and state.fast_failures == 1 and state.last_failure_step == 0
    assert rig.span.status.status_code is StatusCode.ERROR
    assert rig.span.status.description == "replica down"


async def test_an_escalated_step_counts_as_a_fast_failure_and_an_escalation():
    rig = Rig()
    await rig(outcome(tier=Tier.FULL, escalated="truncated"))
    state = rig.sessions.get("default", "agent-1")
    assert (state.escalations, state.fast_failures, state.last_tier) == (1, 1, Tier.FULL)


async def test_a_stream_that_failed_mid_way_is_counted_by_kind():
    rig = Rig()
    await rig(outcome(stream_error="upstream_timeout", error="sent nothing", first_byte_at=100.1))
    assert rig.metric("gearshift_stream_errors_total", tier="fast", kind="upstream_timeout") == 1
    assert rig.span.attributes["error.type"] == "stream_error"


async def test_a_fast_stream_cut_mid_way_counts_against_the_fast_tier():
    rig = Rig()
    await rig(outcome(stream_error="upstream_unreachable", error="dropped", first_byte_at=100.1))
    state = rig.sessions.get("default", "agent-1")
    assert state.fast_failures == 1 and state.last_failure_step == 0


async def test_the_tiers_prompt_count_teaches_calibration_and_anchors_the_session():
    rig = Rig()
    size = sizing()
    await rig(outcome(prompt_tokens=40, sizing=size))
    assert rig.metric("gearshift_route_prompt_tokens_error_count") == 1
    assert rig.metric("gearshift_route_prompt_tokens_anchored_error_count") == 0
    state = rig.sessions.get("default", "agent-1")
    assert state.anchor is not None and state.anchor.tokens == 40
    assert (state.anchor.messages, state.anchor.counts) == (2, size.counts)


async def test_an_anchored_estimate_is_measured_on_its_own():
    rig = Rig()
    await rig(outcome(prompt_tokens=40, sizing=sizing(anchored=True)))
    assert rig.metric("gearshift_route_prompt_tokens_anchored_error_count") == 1
    assert rig.metric("gearshift_route_prompt_tokens_anchored_error_sum") == pytest.approx(
        abs(sizing().estimate - 40) / 40
    )


async def test_without_the_tiers_count_nothing_is_learnt():
    rig = Rig()
    await rig(outcome(502, sizing=sizing()))
    assert rig.metric("gearshift_route_prompt_tokens_error_count") == 0
    assert rig.sessions.get("default", "agent-1").anchor is None
    assert anchor(outcome(prompt_tokens=9)) is None  # a pinned step has no sizing


async def test_the_next_step_of_an_unnamed_session_continues_this_ones_chain():
    rig = Rig()
    keys = rig.sessions.keys("default", None, BODY)
    reply = {"role": "assistant", "content": "Oslo."}
    await rig(outcome(named=False, keys=keys, answers=(reply,)))
    after = {
        "model": "auto",
        "messages": [*MESSAGES, reply, {"role": "user", "content": "And Sweden?"}],
    }
    following = rig.sessions.keys("default", None, after)
    assert following.chained
    assert rig.sessions.get("default", following.key).steps == 1
    assert rig.sessions.get("default", keys.opening).steps == 1


async def test_a_failed_unnamed_step_starts_no_chain():
    rig = Rig()
    keys = rig.sessions.keys("default", None, BODY)
    reply = {"role": "assistant", "content": "Oslo."}
    await rig(outcome(502, named=False, keys=keys, answers=(reply,)))
    after = {
        "model": "auto",
        "messages": [*MESSAGES, reply, {"role": "user", "content": "And Sweden?"}],
    }
    assert not rig.sessions.keys("default", None, after).chained
