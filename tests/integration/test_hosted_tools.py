"""Tools through the gateway: the caller's key decides in the sandbox, and the result lands on
the recorded tool call (status, exit status, attestation, sandbox rewards)."""

from __future__ import annotations

import httpx

from sandbox.config import SandboxConfig
from sandbox.service import create_app
from tests.sandbox.conftest import EVERYTHING
from tests.support.fake_upstream import Behaviour, FakeUpstream
from tests.support.servers import free_port, serve_in_thread

CALL = {
    "id": "call_7",
    "type": "function",
    "function": {"name": "run_python", "arguments": '{"code": "print(6*7)"}'},
}


def test_a_model_tool_call_runs_in_the_sandbox_and_is_recorded(make_stack, sandbox_root):
    port = free_port()
    sandbox_cfg = SandboxConfig(
        token="test-token", root=sandbox_root, host="127.0.0.1", port=port,
        grants_by_tenant={"default": EVERYTHING},
    )  # fmt: skip
    with serve_in_thread(create_app(sandbox_cfg), port=port):
        up = FakeUpstream().then(
            Behaviour(message={"role": "assistant", "content": None, "tool_calls": [CALL]})
        )
        stack = make_stack([up], sandbox={"token": "test-token", "host": "127.0.0.1", "port": port})
        h = {"x-session-id": "agent-1"}
        tools = httpx.get(stack.url + "/v1/tools").json()["data"]
        assert "run_python" in {t["function"]["name"] for t in tools}
        step = httpx.post(stack.url + "/v1/chat/completions", headers=h,
                          json={"model": "full", "messages": [{"role": "user", "content": "compute"}], "tools": tools})  # fmt: skip
        assert step.status_code == 200
        r = httpx.post(stack.url + "/v1/tools/run_python", headers=h, timeout=30,
                       json={"arguments": {"code": "print(6*7)"}, "tool_call_id": "call_7"})  # fmt: skip
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["stdout"] == "42\n" and out["allowed"] and out["recorded"] and out["attestation"]
        s = httpx.get(stack.url + "/v1/sessions/agent-1").json()
        assert ("tool_call", "tool_success", 1.0) in [
            (x["scope"], x["name"], x["value"]) for x in s["rewards"]
        ]
        # the workspace persists for the session; another session is another workspace
        httpx.post(
            stack.url + "/v1/tools/write_file",
            headers=h,
            json={"arguments": {"path": "a", "content": "x"}},
        )
        mine = httpx.post(
            stack.url + "/v1/tools/list_dir", headers=h, json={"arguments": {}}
        ).json()
        other = httpx.post(
            stack.url + "/v1/tools/list_dir",
            headers={"x-session-id": "agent-2"},
            json={"arguments": {}},
        ).json()
        assert [e["name"] for e in mine["output"]["entries"]] == ["a"] and other["output"][
            "entries"
        ] == []


def test_tools_without_a_sandbox_or_a_session_get_clear_errors(make_stack):
    stack = make_stack([FakeUpstream()], sandbox={"enabled": False})
    r = httpx.post(
        stack.url + "/v1/tools/run_python", headers={"x-session-id": "s"}, json={"arguments": {}}
    )
    assert r.status_code == 503 and "sandbox is not running" in r.json()["error"]["message"]
    r = httpx.post(stack.url + "/v1/tools/run_python", json={"arguments": {}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "session_id"


def test_an_unreachable_sandbox_is_a_503_sandbox_unavailable_not_a_crash(make_stack):
    port = free_port()  # nothing listens there
    stack = make_stack([FakeUpstream()], sandbox={"token": "t", "host": "127.0.0.1", "port": port})
    r = httpx.post(
        stack.url + "/v1/tools/run_python",
        headers={"x-session-id": "s"},
        json={"arguments": {"code": "1"}},
    )
    error = r.json()["error"]
    assert r.status_code == 503 and error["code"] == "sandbox_unavailable"
    assert "unreachable" in error["message"]
