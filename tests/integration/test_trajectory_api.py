"""Sessions with a task, feedback, reads; and that tenants never see each other's data."""

from __future__ import annotations

import httpx

from gateway.auth import hash_key
from tests.support.fake_upstream import Behaviour, FakeUpstream

MESSAGES = [{"role": "user", "content": "hi"}]
KEYS = {"a": "gs-key-of-tenant-a", "b": "gs-key-of-tenant-b"}
AUTH = {
    "mode": "keys",
    "keys": [{"name": f"k{t}", "tenant": t, "sha256": hash_key(k)} for t, k in KEYS.items()],
}


def h(tenant: str, **extra: str) -> dict[str, str]:
    return {"authorization": f"Bearer {KEYS[tenant]}", **extra}


def test_task_session_scores_api_correctness_and_feedback(make_stack):
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "book", "arguments": '{"flight": "AF1", "seat": "2A"}'},
    }
    up = FakeUpstream().then(
        Behaviour(message={"role": "assistant", "content": None, "tool_calls": [call]})
    )
    stack = make_stack([up], auth=AUTH)
    r = httpx.post(
        stack.url + "/v1/sessions",
        json={"id": "ep-1", "task_id": "t-9", "group_id": "g-1",
              "expected_actions": [{"name": "book", "arguments": {"flight": "AF1"}}, {"name": "pay"}]},
        headers=h("a"),
    )  # fmt: skip
    assert r.status_code == 201, r.text
    assert (
        httpx.post(stack.url + "/v1/sessions", json={"id": "ep-1"}, headers=h("a")).status_code
        == 409
    )
    step = httpx.post(
        stack.url + "/v1/chat/completions",
        json={"model": "full", "messages": MESSAGES},
        headers=h("a", **{"x-session-id": "ep-1"}),
    ).headers["x-gearshift-step-id"]
    fb = httpx.post(
        stack.url + "/v1/feedback",
        json={"step_id": step, "score": 0.5, "label": "ok"},
        headers=h("a"),
    )
    assert fb.status_code == 201, fb.text
    end = httpx.post(
        stack.url + "/v1/sessions/ep-1/end", json={"outcome": "solved", "reward": 1}, headers=h("a")
    )
    assert end.status_code == 200, end.text
    # one of two expected actions made, and the one call made was right: P=1, R=1/2
    assert abs(end.json()["rewards"]["api_correctness"] - 2 / 3) < 1e-9
    s = httpx.get(stack.url + "/v1/sessions/ep-1", headers=h("a")).json()
    assert (s["task_id"], s["group_id"], s["status"], s["outcome"]) == (
        "t-9",
        "g-1",
        "ended",
        "solved",
    )
    names = {(r["scope"], r["name"]) for r in s["rewards"]}
    assert {
        ("step", "user_feedback"),
        ("session", "outcome"),
        ("session", "api_correctness"),
    } <= names


def test_tenants_are_isolated(make_stack):
    stack = make_stack([FakeUpstream()], auth=AUTH)
    r = httpx.post(
        stack.url + "/v1/chat/completions",
        json={"model": "full", "messages": MESSAGES},
        headers=h("a", **{"x-session-id": "shared-name"}),
    )
    step = r.headers["x-gearshift-step-id"]
    assert httpx.get(stack.url + f"/v1/steps/{step}", headers=h("a")).status_code == 200
    for path in (f"/v1/steps/{step}", "/v1/sessions/shared-name"):
        other = httpx.get(stack.url + path, headers=h("b"))
        assert other.status_code == 404, other.text
        assert other.json()["error"]["code"] == "not_found"
    fb = httpx.post(stack.url + "/v1/feedback", json={"step_id": step, "score": 1}, headers=h("b"))
    assert fb.status_code == 404
    # The same session name in tenant b is a different session.
    httpx.post(
        stack.url + "/v1/chat/completions",
        json={"model": "full", "messages": MESSAGES},
        headers=h("b", **{"x-session-id": "shared-name"}),
    )
    a = httpx.get(stack.url + "/v1/sessions/shared-name", headers=h("a")).json()
    b = httpx.get(stack.url + "/v1/sessions/shared-name", headers=h("b")).json()
    assert a["session_id"] != b["session_id"] and len(a["steps"]) == len(b["steps"]) == 1
    assert httpx.get(stack.url + "/v1/sessions/shared-name").status_code == 401


def test_bad_feedback_gets_a_clear_400(make_stack):
    stack = make_stack([FakeUpstream()])
    cases = [
        {"score": 1},  # neither target
        {"session_id": "s", "step_id": "x", "score": 1},
        {"session_id": "s"},  # no score
        {"session_id": "s", "score": "high"},
        {"session_id": "s", "score": 1, "extra": True},
    ]
    for body in cases:
        r = httpx.post(stack.url + "/v1/feedback", json=body)
        assert r.status_code == 400, (body, r.text)
        assert r.json()["error"]["type"] == "invalid_request_error"
    for raw, says in [
        (b'{"session_id": "s", "score": NaN}', "not valid JSON"),
        (b'{"session_id": ', "not valid JSON"),
        (b"[1, 2]", "must be a JSON object, not list"),
    ]:
        r = httpx.post(stack.url + "/v1/feedback", content=raw)
        assert r.status_code == 400 and says in r.json()["error"]["message"], r.text
    r = httpx.post(stack.url + "/v1/sessions/x/end", json={"reward": "lots"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "reward"
    r = httpx.post(stack.url + "/v1/feedback", content=b"x" * (2 << 20))
    assert r.status_code == 413
    # curl -d sends a form content-type; a JSON body is still read as JSON.
    form = {"content-type": "application/x-www-form-urlencoded"}
    r = httpx.post(stack.url + "/v1/sessions", content=b'{"id": "from-curl"}', headers=form)
    assert r.status_code == 201, r.text
    r = httpx.post(stack.url + "/v1/feedback", json={"session_id": "nope", "score": 1})
    assert r.status_code == 404
