"""The sandbox service over HTTP: token, bad input, tenant isolation, faults, attestation."""

from __future__ import annotations

import hashlib
import hmac

import httpx
import orjson
import pytest

from sandbox.client import SandboxClient, SandboxError
from sandbox.config import GrantConfig
from sandbox.protocol import FaultPlan, FaultRule
from sandbox.runtime.base import RuntimeUnavailable
from sandbox.service import create_app
from tests.support.servers import serve_in_thread

AUTH = {"authorization": "Bearer test-token"}
ACME = {"tenant": "acme", "key": "k1"}


@pytest.fixture
def service(config):
    with serve_in_thread(create_app(config)) as url:
        yield url


def session(url: str, **extra: object) -> str:
    r = httpx.post(url + "/v1/sessions", json={"principal": ACME, **extra}, headers=AUTH)
    assert r.status_code == 201, r.text
    return str(r.json()["session_id"])


def call(
    url: str, tool: str, sid: str, principal: dict = ACME, **arguments: object
) -> httpx.Response:
    body = {"principal": principal, "session_id": sid, "arguments": arguments}
    return httpx.post(f"{url}/v1/tools/{tool}", json=body, headers=AUTH, timeout=30)


def test_token_is_required(service):
    assert httpx.get(service + "/v1/tools").status_code == 401
    assert (
        httpx.get(service + "/v1/tools", headers={"authorization": "Bearer nope"}).status_code
        == 401
    )
    assert httpx.get(service + "/health").status_code == 200
    tools = httpx.get(service + "/v1/tools", headers=AUTH).json()
    assert {t["function"]["name"] for t in tools} >= {"run_python", "read_file", "write_file"}


def test_bad_input_gets_clear_errors_and_the_service_keeps_running(service):
    sid = session(service)
    cases = [
        (b"{not json", 400),
        (b"[]", 400),
        (orjson.dumps({"principal": ACME, "session_id": sid, "arguments": {}, "extra": 1}), 400),
        (orjson.dumps({"principal": ACME, "session_id": "../../etc", "arguments": {}}), 400),
        (orjson.dumps({"principal": ACME, "session_id": sid, "arguments": {"code": 1}}), 400),
        (orjson.dumps({"principal": ACME, "session_id": sid, "arguments": {}}), 400),
        (
            orjson.dumps(
                {"principal": ACME, "session_id": sid, "arguments": {"code": "x", "y": 2}}
            ),
            400,
        ),
        (b"x" * (5 << 20), 413),
    ]
    for raw, status in cases:
        r = httpx.post(service + "/v1/tools/run_python", content=raw, headers=AUTH)
        assert r.status_code == status, (raw[:60], r.text)
        assert r.json()["error"]["message"]
    assert call(service, "no_such_tool", sid).status_code == 404
    assert call(service, "run_python", sid, code="print(6*7)").json()["stdout"] == "42\n"


def test_sessions_belong_to_their_tenant(service):
    sid = session(service)
    other = call(service, "list_dir", sid, principal={"tenant": "evil", "key": "k"})
    assert other.status_code == 404
    assert (
        httpx.post(
            service + "/v1/sessions", json={"principal": ACME, "session_id": sid}, headers=AUTH
        ).status_code
        == 409
    )


def test_denials_are_structured_and_nothing_runs(service):
    sid = session(service)
    r = call(
        service,
        "run_shell",
        sid,
        principal={"tenant": "acme", "key": "k1"},
        command="touch /workspace/x",
    )
    assert r.json()["allowed"]  # acme has run_shell
    httpx.post(
        service + "/v1/sessions",
        json={"principal": {"tenant": "nobody-tenant", "key": "k"}, "session_id": "s2"},
        headers=AUTH,
    )
    d = call(
        service,
        "run_shell",
        "s2",
        principal={"tenant": "nobody-tenant", "key": "k"},
        command="touch x",
    ).json()
    assert d["allowed"] is False and d["rule"] == "default" and "no grant" in d["reason"]
    assert d["exit_status"] is None


def test_scripted_and_seeded_faults_are_marked(service):
    plan = {
        "seed": 7,
        "script": ["timeout", None, "rate_limit"],
        "rules": [{"kind": "exception", "probability": 1.0}],
    }
    sid = session(service, faults=plan)
    got = [call(service, "run_python", sid, code="print(1)").json() for _ in range(4)]
    assert [g["fault"] for g in got] == ["timeout", None, "rate_limit", "exception"]
    assert got[0]["limit"] == "wall_time" and got[1]["stdout"] == "1\n"
    assert got[2]["retry_after_s"] == 1.0


def test_tenant_wide_fault_plan_applies_to_sessions_without_their_own(config):
    from sandbox.protocol import FaultPlan

    cfg = config.model_copy(update={"faults_by_tenant": {"acme": FaultPlan(script=["permission"])}})
    with serve_in_thread(create_app(cfg)) as url:
        sid = session(url)
        got = call(url, "run_python", sid, code="print(1)").json()
        assert got["fault"] == "permission" and got["allowed"] is False
        own = session(url, faults={"script": [None]})
        assert call(url, "run_python", own, code="print(1)").json()["stdout"] == "1\n"


def test_attestation_covers_request_and_result(service):
    sid = session(service)
    body = {
        "principal": ACME,
        "session_id": sid,
        "arguments": {"code": "print(2)"},
        "approved": False,
    }
    result = httpx.post(service + "/v1/tools/run_python", json=body, headers=AUTH).json()
    claimed = result.pop("attestation")
    payload = orjson.dumps(
        {"tool": "run_python", "request": body, "result": result}, option=orjson.OPT_SORT_KEYS
    )
    assert hmac.compare_digest(
        claimed, hmac.new(b"test-token", payload, hashlib.sha256).hexdigest()
    )
    result["stdout"] = "forged\n"
    forged = orjson.dumps(
        {"tool": "run_python", "request": body, "result": result}, option=orjson.OPT_SORT_KEYS
    )
    assert claimed != hmac.new(b"test-token", forged, hashlib.sha256).hexdigest()


async def test_client_round_trip(service):
    client = SandboxClient(service, "test-token")
    try:
        sid = await client.create_session(
            "acme", "k1", faults=FaultPlan(rules=[FaultRule(kind="permission", probability=0.0)])
        )
        w = await client.call("acme", "k1", sid, "write_file", {"path": "a.txt", "content": "hi"})
        r = await client.call("acme", "k1", sid, "read_file", {"path": "a.txt"})
        assert w.allowed and r.output == {"content": "hi", "truncated": False}
        with pytest.raises(SandboxError) as err:
            await client.call("other", "k", sid, "read_file", {"path": "a.txt"})
        assert err.value.status == 404
        await client.delete_session(sid)
    finally:
        await client.close()


def test_no_isolation_no_service(config):
    class Broken:
        name = "broken"

        def check(self) -> None:
            raise RuntimeUnavailable("bwrap missing")

        async def run(self, *a, **k):  # pragma: no cover - never reached
            raise AssertionError

    with pytest.raises(RuntimeUnavailable, match="bwrap missing"):
        create_app(config, runtime=Broken())


def test_the_tools_held_for_an_approval_are_declared(config):
    """``POST /v1/approvals``: what a principal's grant holds for an approval, so that a
    caller (the gateway's hosted loop) can ask a human before it calls."""
    strict = GrantConfig(tools=["run_shell", "read_file"], approval=["destructive"])
    config = config.model_copy(update={"grants_by_tenant": {"acme": strict}})
    with serve_in_thread(create_app(config)) as url:
        body = {"principal": ACME}
        assert httpx.post(url + "/v1/approvals", json=body).status_code == 401
        r = httpx.post(url + "/v1/approvals", json=body, headers=AUTH)
        assert r.status_code == 200 and r.json() == {"approval": {"run_shell": "destructive"}}
        other = {"principal": {"tenant": "nobody", "key": "k"}}
        assert httpx.post(url + "/v1/approvals", json=other, headers=AUTH).json() == {
            "approval": {}
        }
        bad = httpx.post(url + "/v1/approvals", json={"principal": {}}, headers=AUTH)
        assert bad.status_code == 400 and "principal" in bad.json()["error"]["message"]
