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
