"""Escalation before commit: a routed fast-tier answer that fails validation is re-run on
the full tier, and the client only ever sees the full tier's answer."""

from __future__ import annotations

import httpx

from tests.support.fake_upstream import Behaviour, FakeUpstream
from tests.support.tools import WEATHER_TOOLS

TOOLS = WEATHER_TOOLS


def tool_message(arguments: str) -> dict:
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": arguments},
    }
    return {"role": "assistant", "content": None, "tool_calls": [call]}


def ask(stack, **extra) -> httpx.Response:
    body = {
        "model": "auto",
        "messages": [{"role": "user", "content": "weather?"}],
        "tools": TOOLS,
        **extra,
    }
    return httpx.post(
        stack.url + "/v1/chat/completions", json=body, headers={"x-session-id": "esc"}
    )


def test_invalid_fast_tool_call_is_rerun_on_full(make_stack):
    fast = FakeUpstream("fast").then(Behaviour(message=tool_message('{"town": 3}')))
    full = FakeUpstream("full").then(Behaviour(message=tool_message('{"city": "Paris"}')))
    stack = make_stack([full], [fast])
    r = ask(stack)
    assert r.status_code == 200, r.text
    assert (
        r.json()["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
        == '{"city": "Paris"}'
    )
    assert r.headers["x-gearshift-tier"] == "full"
    assert "escalated to full" in r.headers["x-gearshift-route-reason"]
    assert len(fast.requests) == 1 and len(full.requests) == 1
    assert stack.metric("gearshift_escalations_total", {"reason": "invalid_tool_call"}) == 1
    step = httpx.get(stack.url + "/v1/steps/" + r.headers["x-gearshift-step-id"]).json()
    assert step["tier"] == "full" and step["escalated"] is True
    s = httpx.get(stack.url + "/v1/sessions/esc").json()
    assert s["steps"][0]["id"] == step["id"]


def test_missing_forced_tool_call_escalates(make_stack):
    fast, full = (
        FakeUpstream("fast"),
        FakeUpstream("full").then(Behaviour(message=tool_message('{"city": "Oslo"}'))),
    )
    stack = make_stack([full], [fast])
    r = ask(stack, tool_choice="required")
    assert r.headers["x-gearshift-tier"] == "full"
    assert stack.metric("gearshift_escalations_total", {"reason": "no_tool_call"}) == 1


def test_valid_fast_answers_and_pinned_requests_are_not_escalated(make_stack):
    fast = FakeUpstream("fast").then(Behaviour(message=tool_message('{"city": "Rome"}')))
    full = FakeUpstream("full")
    stack = make_stack([full], [fast])
    r = ask(stack)
    assert r.headers["x-gearshift-tier"] == "fast" and not full.requests
    fast.then(Behaviour(message=tool_message("not json")))
    body = {"model": "fast", "messages": [{"role": "user", "content": "x"}], "tools": TOOLS}
    pinned = httpx.post(stack.url + "/v1/chat/completions", json=body)
    assert pinned.headers["x-gearshift-tier"] == "fast" and not full.requests  # a pin is a pin
    assert stack.metric("gearshift_escalations_total", {"reason": "invalid_tool_call"}) == 0


def test_escalation_can_be_turned_off(make_stack):
    fast = FakeUpstream("fast").then(Behaviour(message=tool_message("{broken")))
    full = FakeUpstream("full")
    stack = make_stack([full], [fast], router={"escalate": False})
    assert ask(stack).headers["x-gearshift-tier"] == "fast" and not full.requests
