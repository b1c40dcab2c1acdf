"""The recorder's view of an outcome: step ids planned up front, one record per request."""

from __future__ import annotations

import time

import pytest

from gateway.pipeline.outcome import Captured, Outcome, Served
from gateway.pipeline.record import MAX_CHOICES, plan_step, step_record
from gateway.pipeline.route import Routing
from gateway.recording.records import ChoiceCapture
from gateway.routing.sessions import SessionKeys
from router import Decision, Tier
from tests.gateway.pipeline.conftest import parsed


@pytest.mark.parametrize(
    ("n", "count"), [(None, 1), (1, 1), (3, 3), (0, 1), (-2, 1), ("4", 1), (10_000, MAX_CHOICES)]
)
def test_one_step_id_per_choice_asked_for(n, count):
    body = {"model": "auto"} if n is None else {"model": "auto", "n": n}
    before = time.time()
    step = plan_step(body)
    assert len(step.ids) == count and len(set(step.ids)) == count
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in step.ids)
    assert before <= step.created_at <= time.time()


def test_step_ids_differ_between_requests():
    assert plan_step({}).ids != plan_step({}).ids


def test_a_routed_answer_is_recorded_with_its_decision_and_capture():
    request = parsed({"model": "auto", "messages": [], "n": 1}, session_id="agent-1", t0=10.0)
    decision = Decision(
        Tier.FAST, "short", "classifier", 0.8, {"turns": 2.0}, score=0.3, threshold=0.5
    )
    routing = Routing(Tier.FAST, decision, SessionKeys("agent-1", named=True))
    choice = ChoiceCapture(0, {"role": "assistant", "content": "x"}, [5, 6], [-0.1, -0.2], "stop")
    step = plan_step(request.body)
    outcome = Outcome(
        request,
        routing,
        Served(Tier.FULL, True, 4, "http://r", 1.0, None),
        200,
        ended_at=10.5,
        prompt_tokens=7,
        completion_tokens=2,
        first_byte_at=10.1,
        captured=Captured([1, 2], [choice], "model-full"),
        step=step,
    )
    rec = step_record(outcome, step)
    assert rec.step_ids == list(step.ids) and rec.created_at == step.created_at
    assert (rec.request_id, rec.tenant, rec.api_key, rec.endpoint) == (
        "req-1",
        "default",
        "key-1",
        "chat",
    )
    assert rec.request is request.body and rec.external_session == "agent-1"
    assert (rec.task_id, rec.group_id) == ("task-1", "group-1")
    assert (rec.status, rec.tier, rec.model, rec.replica) == (200, "full", "model-full", "http://r")
    assert (rec.policy, rec.propensity) == ("classifier", 0.8)
    assert rec.route_reason == "short; fallback to full"
    assert rec.features == {"turns": 2.0, "route_score": 0.3, "route_threshold": 0.5}
    assert rec.fallback and not rec.escalated and rec.attempts == 4
    assert rec.prompt_token_ids == [1, 2] and rec.choices == [choice]
    assert (rec.prompt_tokens, rec.completion_tokens) == (7, 2)
    assert rec.ttft_ms == pytest.approx(100.0) and rec.duration_ms == pytest.approx(500.0)
    assert rec.error is None


def test_a_pinned_failure_is_recorded_without_capture_or_features():
    request = parsed({"model": "full", "messages": []}, t0=10.0)
    routing = Routing(Tier.FULL, None, SessionKeys(None))
    step = plan_step(request.body)
    outcome = Outcome(
        request,
        routing,
        Served(Tier.FULL, attempts=3, escalated="truncated"),
        502,
        ended_at=11.0,
        error="replica down",
        step=step,
    )
    rec = step_record(outcome, step)
    assert (rec.policy, rec.propensity, rec.features) == ("pinned", 1.0, None)
    assert rec.model is None and rec.prompt_token_ids is None and rec.choices == []
    assert rec.ttft_ms is None and rec.error == "replica down" and rec.status == 502
    assert rec.escalated
