"""Human approval of the sandbox's own tools in the hosted loop: a grant that holds a risk
class for an approval (``approval: [destructive, mutating]``) makes the calls of those
tools wait as ``mcp_approval_request`` items, answered by the client or an operator. The
official ``openai`` SDK, a scripted fake tier, and a REAL sandbox service (bubblewrap)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from sandbox.config import GrantConfig, SandboxConfig
from sandbox.service import create_app
from tests.integration.conftest import Stack
from tests.support.fake_upstream import Behaviour, FakeUpstream
from tests.support.servers import free_port, serve_in_thread

GRANT = GrantConfig(
    tools=["run_python", "write_file", "read_file"], read=["*"], write=["*"],
    approval=["destructive", "mutating"],
)  # fmt: skip
CODE = {"type": "code_interpreter", "container": "auto"}
WRITE = {"type": "sandbox", "name": "write_file"}
READ = {"type": "sandbox", "name": "read_file"}


def asks(name: str, arguments: str, call_id: str) -> Behaviour:
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    return Behaviour(message={"role": "assistant", "content": None, "tool_calls": [call]})


def answer(request_id: str, approve: bool, reason: str | None = None) -> list[dict[str, Any]]:
    return [{"type": "mcp_approval_response", "approval_request_id": request_id,
             "approve": approve, "reason": reason}]  # fmt: skip


@pytest.fixture
def sandbox_port(sandbox_root) -> Iterator[int]:
    port = free_port()
    cfg = SandboxConfig(
        token="test-token", root=sandbox_root, host="127.0.0.1", port=port,
        grants_by_tenant={"default": GRANT},
    )  # fmt: skip
    with serve_in_thread(create_app(cfg), port=port):
        yield port


def build(make_stack: Any, port: int, up: FakeUpstream) -> Stack:
    sandbox = {"token": "test-token", "host": "127.0.0.1", "port": port}
    return make_stack([up], sandbox=sandbox)


def test_held_tools_wait_for_the_client_or_an_operator(make_stack, sandbox_port):
    write = '{"path": "a.txt", "content": "approved text"}'
    up = FakeUpstream().then(
        asks("write_file", write, "call_1"), Behaviour(),  # asked, denied, told
        asks("write_file", write, "call_2"),  # asked again: an operator approves it
        asks("read_file", '{"path": "a.txt"}', "call_3"), Behaviour(),  # not held: runs
    )  # fmt: skip
    stack = build(make_stack, sandbox_port, up)
    client = stack.client()
    tools = [WRITE, READ]
    asked = client.responses.create(model="full", input="write it", tools=tools)
    (request,) = asked.output
    assert asked.status == "completed" and request.type == "mcp_approval_request"
    assert (request.server_label, request.name, request.arguments) == (
        "sandbox",
        "write_file",
        write,
    )

    denied = client.responses.create(
        model="full", previous_response_id=asked.id, tools=tools,
        input=answer(request.id, False, "not now"),
    )  # fmt: skip
    call = denied.output[0]
    assert call.type == "mcp_call" and call.status == "failed"
    assert call.approval_request_id == request.id
    told = "error: denied: the call was not approved (by client:anonymous): not now"
    assert call.output == told
    assert up.requests[1]["messages"][-1] == {
        "role": "tool",
        "tool_call_id": "call_1",
        "content": told,
    }

    again = client.responses.create(
        model="full", previous_response_id=denied.id, tools=tools, input="please"
    )
    request2 = again.output[-1]
    assert request2.type == "mcp_approval_request" and request2.name == "write_file"
    pending = httpx.get(stack.url + "/admin/v1/approvals").json()["data"]
    assert [p["id"] for p in pending] == [request2.id]
    r = httpx.post(stack.url + f"/admin/v1/approvals/{request2.id}", json={"approve": True})
    assert r.status_code == 200, r.text
    assert httpx.get(stack.url + "/admin/v1/approvals").json()["data"] == []

    done = client.responses.create(
        model="full", previous_response_id=again.id, tools=tools, input="go on"
    )
    assert [o.type for o in done.output] == ["mcp_call", "mcp_call", "message"]
    wrote, read = done.output[0], done.output[1]
    assert wrote.status == "completed" and wrote.approval_request_id == request2.id
    assert wrote.error is None
    assert read.name == "read_file" and "approved text" in read.output  # it ran once, for real
    assert len(up.requests) == 5


def test_a_code_interpreter_call_waits_then_runs_approved(make_stack, sandbox_port):
    up = FakeUpstream().then(asks("run_python", '{"code": "print(6*7)"}', "call_1"), Behaviour())
    stack = build(make_stack, sandbox_port, up)
    client = stack.client()
    force = {"type": "code_interpreter"}
    asked = client.responses.create(model="full", input="compute", tools=[CODE], tool_choice=force)
    (request,) = asked.output  # nothing ran: run_python is destructive, held for an approval
    assert request.type == "mcp_approval_request" and request.name == "run_python"
    assert request.arguments == '{"code": "print(6*7)"}' and request.server_label == "sandbox"
    ran = client.responses.create(
        model="full", previous_response_id=asked.id, tools=[CODE], input=answer(request.id, True)
    )
    call = ran.output[0]
    assert call.type == "mcp_call" and call.output == "42\n" and call.status == "completed"
    told = {"role": "tool", "tool_call_id": "call_1", "content": "42\n"}
    assert up.requests[1]["messages"][-1] == told


def test_back_to_back_requests_ask_the_sandbox_once(make_stack, sandbox_root):
    """The listing and the principal's held tools are remembered for about a second: an
    agent's next request does not ask the sandbox again (``sandbox_offers``)."""
    asked: list[str] = []
    port = free_port()
    app = create_app(SandboxConfig(token="test-token", root=sandbox_root, host="127.0.0.1",
                                   port=port, grants_by_tenant={"default": GRANT}))  # fmt: skip

    async def counted(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            asked.append(f"{scope['method']} {scope['path']}")
        await app(scope, receive, send)

    with serve_in_thread(counted, port=port):
        sandbox = {"token": "test-token", "host": "127.0.0.1", "port": port}
        # a TTL no loaded test machine outlasts between two requests (default: 1 s)
        stack = make_stack([FakeUpstream()], sandbox=sandbox, responses={"sandbox_cache_s": 30})
        client = stack.client()
        for text in ("first", "second"):
            done = client.responses.create(model="full", input=text, tools=[WRITE, READ])
            assert done.status == "completed" and done.output_text
    assert asked.count("GET /v1/tools") == 1 and asked.count("POST /v1/approvals") == 1
