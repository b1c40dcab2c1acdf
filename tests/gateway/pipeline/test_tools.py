"""Hosted tools: the sandbox client's errors as the gateway's, and the session of a
trajectory created by its first call, in one round trip (also when two first calls race)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.errors import (
    Conflict,
    GatewayError,
    InvalidRequest,
    PayloadTooLarge,
    ResourceNotFound,
    SandboxUnavailable,
    UpstreamError,
)
from gateway.pipeline.tools import list_tools, run_tool, translate
from sandbox import errors as sbx
from sandbox.client import SandboxClient
from sandbox.protocol import ToolResult, scoped_id
from tests.support.servers import free_port, serve_in_thread


@pytest.mark.parametrize(
    ("theirs", "ours", "status"),
    [
        (sbx.SessionNotFound, ResourceNotFound, 404),
        (sbx.UnknownTool, ResourceNotFound, 404),
        (sbx.InvalidRequest, InvalidRequest, 400),
        (sbx.InvalidArguments, InvalidRequest, 400),
        (sbx.SessionExists, Conflict, 409),
        (sbx.BodyTooLarge, PayloadTooLarge, 413),
        (sbx.SandboxUnreachable, SandboxUnavailable, 503),
        (sbx.Unauthorized, UpstreamError, 502),
        (sbx.InternalError, UpstreamError, 502),
        (sbx.SandboxError, UpstreamError, 502),
    ],
)
def test_each_sandbox_error_has_one_gateway_error(theirs, ours, status):
    mapped = translate(theirs("it broke", status=418))
    assert type(mapped) is ours and mapped.status == status
    assert mapped.message == "tool sandbox: it broke"


# -- a stand-in sandbox client, for the order of calls ------------------------------------


def result(tool: str) -> ToolResult:
    return ToolResult(tool=tool, allowed=True, rule="", reason="", stdout="42\n")


class Sandbox:
    """The client's interface over an in-memory table of sessions, creating one when a call
    asks for that (as ``sandbox.core`` does)."""

    def __init__(self, sessions: set[str] | None = None) -> None:
        self.sessions = set(sessions or ())
        self.log: list[tuple[str, str]] = []
        self.fail_call: sbx.SandboxError | None = None

    async def tools(self) -> list[dict[str, Any]]:
        if self.fail_call is not None:
            raise self.fail_call
        return [{"type": "function", "function": {"name": "run_python"}}]

    async def call(
        self, tenant, key, session_id, tool, arguments, approved=False, create_session=False
    ) -> ToolResult:
        self.log.append(("call", session_id))
        await asyncio.sleep(0)
        if self.fail_call is not None:
            raise self.fail_call
        if session_id not in self.sessions:
            if not create_session:
                raise sbx.SessionNotFound("no such session", status=404)
            self.sessions.add(session_id)
        return result(tool)


SID = scoped_id("acme", "agent-1")


async def run(sandbox: Any, tool: str = "run_python") -> ToolResult:
    return await run_tool(sandbox, "acme", "key-1", "agent-1", tool, {"code": "print(42)"})


async def test_without_a_sandbox_tools_are_unavailable():
    with pytest.raises(SandboxUnavailable, match="not running"):
        await run(None)
    with pytest.raises(SandboxUnavailable):
        await list_tools(None)


async def test_a_call_in_an_existing_session_goes_straight_through():
    sandbox = Sandbox({SID})
    assert (await run(sandbox)).stdout == "42\n"
    assert sandbox.log == [("call", SID)]


async def test_the_first_call_of_a_trajectory_creates_its_session_in_one_round_trip():
    sandbox = Sandbox()
    assert (await run(sandbox)).tool == "run_python"
    assert sandbox.log == [("call", SID)]
    assert sandbox.sessions == {SID}


async def test_two_racing_first_calls_both_succeed_with_one_session():
    sandbox = Sandbox()
    first, second = await asyncio.gather(run(sandbox), run(sandbox))
    assert first.allowed and second.allowed
    assert sandbox.sessions == {SID}
    assert sandbox.log == [("call", SID)] * 2


async def test_a_failed_call_is_translated_without_the_sandboxs_traceback():
    sandbox = Sandbox({SID})
    sandbox.fail_call = sbx.UnknownTool("no tool named nope", status=404)
    with pytest.raises(ResourceNotFound, match="tool sandbox: no tool named nope") as err:
        await run(sandbox, "nope")
    assert err.value.__suppress_context__
    with pytest.raises(ResourceNotFound):
        await list_tools(sandbox)


# -- the real client against a stand-in sandbox service --------------------------------------


def sandbox_service() -> Starlette:
    """Answers like ``sandbox.service``: errors as ``{"error": {"code", "message"}}``."""
    sessions: set[str] = set()

    def error(status: int, code: str, message: str) -> Response:
        body = orjson.dumps({"error": {"code": code, "message": message}})
        return Response(body, status, media_type="application/json")

    async def call(request: Request) -> Response:
        tool = request.path_params["tool"]
        body = orjson.loads(await request.body())
        if tool == "oversized":
            return error(413, "too_large", "body over 1 MiB")
        if tool != "run_python":
            return error(404, "unknown_tool", f"no tool named {tool}")
        if body["session_id"] not in sessions:
            if not body.get("create_session"):
                return error(404, "not_found", "no such session")
            sessions.add(body["session_id"])
        if "code" not in body["arguments"]:
            return error(400, "invalid_arguments", "arguments lacks the required 'code'")
        return Response(result(tool).model_dump_json(), media_type="application/json")

    return Starlette(
        routes=[
            Route("/v1/tools/{tool}", call, methods=["POST"]),
        ]
    )


@pytest.fixture(scope="module")
def service_url() -> Iterator[str]:
    with serve_in_thread(sandbox_service()) as url:
        yield url


async def test_the_real_client_creates_the_session_with_its_first_call(service_url):
    client = SandboxClient(service_url, "token")
    try:
        first = await run_tool(client, "acme", "key-1", "fresh", "run_python", {"code": "1"})
        again = await run_tool(client, "acme", "key-1", "fresh", "run_python", {"code": "2"})
        assert first.allowed and again.allowed
    finally:
        await client.close()


@pytest.mark.parametrize(
    ("tool", "arguments", "ours", "status"),
    [
        ("nope", {}, ResourceNotFound, 404),
        ("run_python", {}, InvalidRequest, 400),
        ("oversized", {}, PayloadTooLarge, 413),
    ],
)
async def test_the_services_answers_become_the_gateways_errors(
    service_url, tool, arguments, ours, status
):
    client = SandboxClient(service_url, "token")
    try:
        with pytest.raises(GatewayError) as err:
            await run_tool(client, "acme", "key-1", "s1", tool, arguments)
    finally:
        await client.close()
    assert type(err.value) is ours and err.value.status == status
    assert err.value.message.startswith("tool sandbox: sandbox answered ")


async def test_an_unreachable_sandbox_is_unavailable_not_a_bad_gateway():
    client = SandboxClient(f"http://127.0.0.1:{free_port()}", "token")
    try:
        with pytest.raises(SandboxUnavailable) as err:
            await run_tool(client, "acme", "key-1", "s1", "run_python", {"code": "1"})
    finally:
        await client.close()
    assert err.value.status == 503 and "unreachable" in err.value.message
