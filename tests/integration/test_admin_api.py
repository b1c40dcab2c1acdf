"""The admin API, key scopes, rate limits and budgets, through a real gateway on a socket
with the official ``openai`` client (the store: SQLite; PostgreSQL in
test_admission_replicas.py)."""

from __future__ import annotations

import time
from typing import Any

import httpx
import openai
import pytest

from gateway.auth import new_key
from tests.integration.conftest import FAST_MODEL, FULL_MODEL, Stack
from tests.support.fake_upstream import FakeUpstream

ADMIN, ADMIN_DIGEST = new_key()
USER, USER_DIGEST = new_key()
CHAT = [{"role": "user", "content": "hi"}]


@pytest.fixture
def stack(make_stack: Any) -> Stack:
    keys = [
        {"name": "root", "tenant": "ops", "sha256": ADMIN_DIGEST, "admin": True},
        {"name": "plain", "tenant": "ops", "sha256": USER_DIGEST},
    ]
    return make_stack(  # type: ignore[no-any-return]
        [FakeUpstream("full")], [FakeUpstream("fast")], auth={"mode": "keys", "keys": keys},
        sandbox={"enabled": False},
    )  # fmt: skip


def admin(stack: Stack, method: str, path: str, key: str = ADMIN, **kw: Any) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"}
    return httpx.request(method, stack.url + "/admin/v1" + path, headers=headers, timeout=10, **kw)


def chat(stack: Stack, key: str, model: str = FULL_MODEL, **kw: Any) -> Any:
    return stack.client(api_key=key).chat.completions.with_raw_response.create(
        model=model, messages=CHAT, **kw
    )


def test_keys_created_rotated_expired_and_revoked_by_the_api(stack: Stack):
    made = admin(stack, "POST", "/keys", json={"tenant": "team-a", "name": "bot"})
    assert made.status_code == 201, made.text
    key, key_id = made.json()["key"], made.json()["id"]
    assert chat(stack, key).http_response.status_code == 200
    listed = admin(stack, "GET", "/keys", params={"tenant": "team-a"}).json()["data"]
    assert [k["id"] for k in listed] == [key_id] and "sha256" not in listed[0]
    assert "key" not in listed[0]

    twice = admin(stack, "POST", "/keys", json={"tenant": "team-a", "name": "bot"})
    assert twice.status_code == 409 and twice.json()["error"]["code"] == "conflict"

    rotated = admin(stack, "POST", f"/keys/{key_id}/rotate", json={"grace_s": 60}).json()
    new = rotated["key"]
    assert rotated["name"] == "bot" and new != key
    assert chat(stack, key).http_response.status_code == 200  # within its grace
    assert chat(stack, new).http_response.status_code == 200

    gone = admin(stack, "POST", f"/keys/{key_id}/expire", json={"expires_at": 1}).json()
    assert gone["expires_at"] == 1
    with pytest.raises(openai.AuthenticationError, match=r"expired|invalid"):
        chat(stack, key)

    revoked = admin(stack, "DELETE", f"/keys/{rotated['id']}").json()
    assert revoked["revoked_at"] is not None
    with pytest.raises(openai.AuthenticationError):
        chat(stack, new)
    assert admin(stack, "GET", "/keys", params={"tenant": "team-a"}).json()["data"] == []
    everything = admin(stack, "GET", "/keys", params={"tenant": "team-a", "all": "true"})
    assert len(everything.json()["data"]) == 2


def test_the_admin_api_wants_an_admin_key(stack: Stack):
    for key in (USER, "gs-nonsense"):
        r = admin(stack, "GET", "/keys", key=key)
        assert r.status_code in (401, 403) and "error" in r.json()
    assert admin(stack, "GET", "/keys", key=USER).json()["error"]["type"] == "permission_error"
    made = admin(stack, "POST", "/keys", json={"tenant": "t", "name": "boss", "admin": True})
    assert admin(stack, "GET", "/limits", key=made.json()["key"]).status_code == 200


HOSTILE = [
    ("POST", "/keys", {"tenant": "../etc", "name": "x"}),
    ("POST", "/keys", {"tenant": "t", "name": ""}),
    ("POST", "/keys", {"tenant": "t", "name": "x" * 200}),
    ("POST", "/keys", {"tenant": "t", "name": "x", "admin": "yes please"}),
    ("POST", "/keys", {"tenant": "t", "name": "x", "models": "auto"}),
    ("POST", "/keys", {"tenant": "t", "name": "x", "expires_at": -5}),
    ("POST", "/keys", {"tenant": "t", "name": "x", "expires_at": 10**30}),
    ("POST", "/keys", {"tenant": "t", "name": "x", "expires_at": 1, "expires_in_s": 1}),
    ("POST", "/keys", {"tenant": "t", "name": "x", "unknown": 1}),
    ("POST", "/keys", [1, 2]),
    ("POST", "/keys", "not json"),
    ("DELETE", "/keys/key_0123456789abcdef", None),
    ("DELETE", "/keys/'; DROP TABLE api_keys; --", None),
    ("POST", "/keys/key_00/rotate", {"grace_s": -1}),
    ("POST", "/keys/key_00/expire", {"expires_in_s": 0}),
    ("PUT", "/limits/t", {"requests_per_minute": -1}),
    ("PUT", "/limits/t", {"tokens_per_day": 1.5}),
    ("PUT", "/limits/t", {"soft_percent": 0}),
    ("PUT", "/limits/t/%00", {}),
    ("DELETE", "/limits/nobody", None),
    ("GET", "/usage/" + "x" * 300, None),
    ("PATCH", "/keys", None),
]


def test_hostile_admin_input_gets_a_4xx_in_the_openai_shape(stack: Stack):
    for method, path, body in HOSTILE:
        kw: dict[str, Any] = {}
        if isinstance(body, str):
            kw["content"] = body
        elif body is not None:
            kw["json"] = body
        r = admin(stack, method, path, **kw)
        assert 400 <= r.status_code < 500, (method, path, r.status_code, r.text)
        error = r.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}, (method, path)
    assert admin(stack, "GET", "/keys").status_code == 200  # and the API still answers


def test_scopes_limit_models_and_tools(stack: Stack):
    made = admin(stack, "POST", "/keys", json={
        "tenant": "team-b", "name": "fast-only", "models": [FAST_MODEL, "fast"], "tools": [],
    }).json()  # fmt: skip
    assert chat(stack, made["key"], FAST_MODEL).http_response.status_code == 200
    with pytest.raises(openai.PermissionDeniedError, match="may not use model") as refused:
        chat(stack, made["key"], FULL_MODEL)
    assert refused.value.body["param"] == "model"  # type: ignore[index]
    tool = httpx.post(
        stack.url + "/v1/tools/run_shell", json={"arguments": {}, "session_id": "s"},
        headers={"authorization": f"Bearer {made['key']}"},
    )  # fmt: skip
    assert tool.status_code == 403 and tool.json()["error"]["code"] == "permission_denied"


def test_requests_per_minute_answer_429_with_retry_after(stack: Stack):
    set_ = admin(stack, "PUT", "/limits/ops/plain", json={"requests_per_minute": 2})
    assert set_.status_code == 200, set_.text
    codes = []
    for _ in range(3):
        try:
            codes.append(chat(stack, USER).http_response.status_code)
        except openai.RateLimitError as exc:
            codes.append(exc.status_code)
            retry_after = int(exc.response.headers["retry-after"])
            assert exc.body["code"] == "rate_limit_exceeded"  # type: ignore[index]
    if codes[-1] == 200:  # the first two straddled a minute's end: the third had a new one
        pytest.skip("crossed a minute boundary")
    assert codes == [200, 200, 429] and 1 <= retry_after <= 60
    assert stack.metric(
        "gearshift_admission_refused_total",
        {"tenant": "ops", "scope": "key", "limit": "requests/minute"},
    ) == 1  # fmt: skip
    assert chat(stack, ADMIN).http_response.status_code == 200  # another key of the tenant


def test_a_spent_budget_is_403_and_real_usage_is_what_is_charged(stack: Stack):
    # one request reserves its prompt bytes / 4 + max_tokens; the fake answers 7 + 4 tokens
    admin(stack, "PUT", "/limits/ops", json={"tokens_per_day": 600, "soft_percent": 50})
    first = chat(stack, USER, max_tokens=100)
    assert first.http_response.status_code == 200
    assert "x-gearshift-budget-warning" not in first.http_response.headers
    usage = _usage(stack, "ops", "tokens")
    assert usage["used"] == 11 and usage["reserved"] == 0  # settled on the real usage
    with pytest.raises(openai.PermissionDeniedError) as refused:
        chat(stack, USER, max_tokens=590)  # more than the 589 left
    assert refused.value.body["code"] == "budget_exceeded"  # type: ignore[index]
    assert int(refused.value.response.headers["retry-after"]) >= 1
    near = chat(stack, USER, max_tokens=280)  # reserves past 50% of the budget
    assert near.http_response.headers["x-gearshift-budget-warning"].startswith("tenant day ")
    assert _usage(stack, "ops", "tokens")["used"] == 22
    assert stack.metric(
        "gearshift_budget_soft_exceeded_total", {"tenant": "ops", "scope": "tenant", "period": "day"}
    ) == 1  # fmt: skip


def test_a_failed_request_releases_its_reservation(make_stack: Any):
    from tests.support.fake_upstream import status

    upstream = FakeUpstream().then(status(500), status(500), status(500))
    stack = make_stack([upstream], auth={"mode": "keys", "keys": [
        {"name": "root", "tenant": "ops", "sha256": ADMIN_DIGEST, "admin": True}]},
        sandbox={"enabled": False})  # fmt: skip
    admin(stack, "PUT", "/limits/ops", json={"tokens_per_month": 10**6})
    with pytest.raises(openai.InternalServerError):
        chat(stack, ADMIN, max_tokens=10)
    usage = _usage(stack, "ops", "tokens")
    assert usage == {"key_name": None, "unit": "tokens", "used": 0, "reserved": 0} | {
        "window": usage["window"]
    }


def _usage(stack: Stack, tenant: str, unit: str) -> dict[str, Any]:
    deadline = time.monotonic() + 5
    while True:  # settlements commit with the ledger's next batch
        rows = admin(stack, "GET", f"/usage/{tenant}").json()["data"]
        found = [r for r in rows if r["unit"] == unit and r["key_name"] is None]
        if (found and found[0]["reserved"] == 0) or time.monotonic() > deadline:
            return found[0]
        time.sleep(0.02)
