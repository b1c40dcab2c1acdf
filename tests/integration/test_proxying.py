"""Requests that succeed: what the client sees and what reaches the replica."""

from __future__ import annotations

import httpx
import pytest

from router.tokens import estimate_prompt_tokens
from tests.integration.conftest import FAST_MODEL, FULL_MODEL
from tests.support.fake_upstream import FakeUpstream

MESSAGES = [{"role": "user", "content": "hi"}]


def test_non_stream_answer_and_gateway_headers(make_stack):
    full, fast = FakeUpstream("full"), FakeUpstream("fast")
    stack = make_stack([full], [fast])
    raw = stack.client().chat.completions.with_raw_response.create(model="auto", messages=MESSAGES)
    answer = raw.parse()
    assert answer.choices[0].message.content == "hello from fast"
    assert raw.headers["x-gearshift-tier"] == "fast"
    tokens = estimate_prompt_tokens({"messages": MESSAGES})  # "hi" and the template's share
    assert raw.headers["x-gearshift-route-reason"].startswith(
        f"length_threshold: ~{tokens} prompt tokens < 512"
    )
    assert len(raw.headers["x-request-id"]) >= 16
    assert 0 <= float(raw.headers["x-gearshift-overhead-ms"]) < 1000
    assert fast.requests[0]["model"] == FAST_MODEL and not full.requests


def test_pinned_model_and_tier_alias(make_stack):
    full, fast = FakeUpstream("full"), FakeUpstream("fast")
    stack = make_stack([full], [fast])
    client = stack.client()
    for model in (FULL_MODEL, "full"):
        raw = client.chat.completions.with_raw_response.create(model=model, messages=MESSAGES)
        assert raw.headers["x-gearshift-tier"] == "full"
        assert raw.headers["x-gearshift-route-reason"] == "pinned"
    assert [r["model"] for r in full.requests] == [FULL_MODEL, FULL_MODEL]


def test_long_prompt_routes_to_full(make_stack):
    full, fast = FakeUpstream("full"), FakeUpstream("fast")
    stack = make_stack([full], [fast], router={"params": {"threshold_tokens": 10}})
    raw = stack.client().chat.completions.with_raw_response.create(
        model="auto", messages=[{"role": "user", "content": "word " * 20}]
    )
    assert raw.headers["x-gearshift-tier"] == "full"
    assert ">= 10" in raw.headers["x-gearshift-route-reason"]


def test_every_parameter_reaches_the_replica_unchanged(make_stack):
    full = FakeUpstream()
    stack = make_stack([full])
    params = {
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "f",
                    "strict": True,
                    "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}},
                },
            }
        ],
        "tool_choice": {"type": "function", "function": {"name": "f"}},
        "parallel_tool_calls": False,
        "response_format": {"type": "json_object"},
        "logprobs": True,
        "top_logprobs": 3,
        "n": 2,
        "seed": 11,
        "stop": ["\n"],
        "max_completion_tokens": 9,
        "temperature": 0.3,
        "some_future_parameter": {"nested": [1, 2]},
    }
    body = {"model": "full", "messages": MESSAGES, **params}
    r = httpx.post(stack.url + "/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    sent = full.requests[0]
    assert sent.pop("model") == FULL_MODEL
    # Recording adds exactly one field (logprobs was already asked for here).
    assert sent == {"messages": MESSAGES, **params, "return_token_ids": True}
    assert len(r.json()["choices"]) == 2


def test_without_recording_the_body_is_forwarded_verbatim(make_stack):
    full = FakeUpstream()
    stack = make_stack([full], store={"enabled": False})
    body = {"model": "full", "messages": MESSAGES, "seed": 3, "x_future": [1]}
    r = httpx.post(stack.url + "/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    assert "x-gearshift-step-id" not in r.headers
    assert full.requests[0] == {**body, "model": FULL_MODEL}


def test_stream_relays_events_and_hides_usage_it_added(make_stack):
    full = FakeUpstream()
    stack = make_stack([full])
    chunks = list(
        stack.client().chat.completions.create(model="full", messages=MESSAGES, stream=True)
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "tok0 tok1 tok2 tok3 tok4 "
    assert all(c.usage is None for c in chunks)
    assert full.requests[0]["stream_options"] == {"include_usage": True}
    stack.wait_metric("gearshift_tokens_total", {"tier": "full", "kind": "completion"}, 5)


def test_stream_keeps_usage_when_client_asked(make_stack):
    stack = make_stack([FakeUpstream()])
    chunks = list(
        stack.client().chat.completions.create(
            model="full", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5


def test_completions_endpoint(make_stack):
    full = FakeUpstream()
    stack = make_stack([full])
    r = httpx.post(
        stack.url + "/v1/completions", json={"model": "full", "prompt": "Once", "max_tokens": 3}
    )
    assert r.status_code == 200
    assert full.requests[0] == {
        "model": FULL_MODEL,
        "prompt": "Once",
        "max_tokens": 3,
        "logprobs": 0,  # the sampled tokens' logprobs, for the recorder
        "return_token_ids": True,
    }


def test_models_lists_auto_and_each_tier(make_stack):
    stack = make_stack([FakeUpstream()], [FakeUpstream()])
    ids = [m.id for m in stack.client().models.list()]
    assert ids == ["auto", FULL_MODEL, FAST_MODEL]


def test_upstream_client_error_passes_through(make_stack):
    from tests.support.fake_upstream import status

    full = FakeUpstream().then(status(400, message="max_tokens is too large"))
    stack = make_stack([full])
    r = httpx.post(stack.url + "/v1/chat/completions", json={"model": "full", "messages": MESSAGES})
    assert r.status_code == 400
    assert r.json()["error"]["message"] == "max_tokens is too large"
    assert len(full.requests) == 1  # client errors are not retried


def test_span_follows_genai_conventions(make_stack):
    stack = make_stack([FakeUpstream()], [FakeUpstream()])
    stack.client().chat.completions.create(
        model="auto", messages=MESSAGES, max_tokens=5, temperature=0.5
    )
    (span,) = stack.spans.get_finished_spans()
    assert span.name == "chat auto"
    attrs = dict(span.attributes or {})
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.request.model"] == "auto"
    assert attrs["gen_ai.response.model"] == FAST_MODEL
    assert attrs["gen_ai.request.max_tokens"] == 5
    assert attrs["gen_ai.usage.input_tokens"] == 7
    assert attrs["gen_ai.usage.output_tokens"] == 4
    assert attrs["gearshift.tier"] == "fast"


def test_health_ready_and_metrics(make_stack):
    stack = make_stack([FakeUpstream()], [FakeUpstream()])
    assert httpx.get(stack.url + "/health").json() == {"status": "ok"}
    import time

    deadline = time.monotonic() + 5
    while httpx.get(stack.url + "/ready").status_code != 200:
        assert time.monotonic() < deadline, "gateway never became ready"
        time.sleep(0.05)
    stack.client().chat.completions.create(model="full", messages=MESSAGES)
    text = httpx.get(stack.url + "/metrics").text
    assert 'gearshift_requests_total{endpoint="chat",status="200",tier="full"} 1.0' in text
    assert "gearshift_overhead_seconds_bucket" in text


@pytest.mark.parametrize("header", ["x-session-id"])
def test_session_id_reaches_span(make_stack, header):
    stack = make_stack([FakeUpstream()])
    httpx.post(
        stack.url + "/v1/chat/completions",
        json={"model": "full", "messages": MESSAGES},
        headers={header: "sess-42"},
    )
    (span,) = stack.spans.get_finished_spans()
    assert span.attributes["gen_ai.conversation.id"] == "sess-42"
