"""The rules policy through the gateway: code goes to the full tier, with the reason shown."""

from __future__ import annotations

import httpx

from tests.support.fake_upstream import FakeUpstream


def test_code_is_routed_to_full_and_explained(make_stack):
    full, fast = FakeUpstream("full"), FakeUpstream("fast")
    stack = make_stack([full], [fast], router={"policy": "rules"})
    code = {"model": "auto", "messages": [{"role": "user", "content": "```python\nprint(1)\n```"}]}
    r = httpx.post(stack.url + "/v1/chat/completions", json=code)
    assert r.headers["x-gearshift-tier"] == "full"
    assert r.headers["x-gearshift-route-reason"] == "rule code: code in the request"
    chat = {"model": "auto", "messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(stack.url + "/v1/chat/completions", json=chat, headers={"x-session-id": "r1"})
    assert r.headers["x-gearshift-tier"] == "fast"
    step = httpx.get(stack.url + "/v1/steps/" + r.headers["x-gearshift-step-id"]).json()
    assert step["route_reason"].endswith("(no rule applied)")


def test_the_default_chain_sends_a_forced_tool_call_to_full(make_stack):
    full, fast = FakeUpstream("full"), FakeUpstream("fast")
    stack = make_stack([full], [fast], router={"policy": "session"})  # the default chain
    tools = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]  # fmt: skip
    named = {"type": "function", "function": {"name": "read_file"}}
    body = {"model": "auto", "messages": [{"role": "user", "content": "hi"}], "tools": tools}
    r = httpx.post(stack.url + "/v1/chat/completions", json={**body, "tool_choice": named})
    assert r.headers["x-gearshift-tier"] == "full"
    reason = "rule tool_call: a forced tool call (the fast tier's calls agree 0.44 of the time)"
    assert r.headers["x-gearshift-route-reason"] == reason
    step = httpx.get(stack.url + "/v1/steps/" + r.headers["x-gearshift-step-id"]).json()
    assert (step["tier"], step["route_reason"]) == ("full", reason)
    # the same step, free to answer in text, is the classifier's to decide
    r = httpx.post(stack.url + "/v1/chat/completions", json={**body, "tool_choice": "auto"})
    assert not r.headers["x-gearshift-route-reason"].startswith("rule ")
