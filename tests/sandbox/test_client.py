"""The client against a real service: every error it answers reaches the caller as the
tree's class, with the answered status and code; no answer at all is SandboxUnreachable."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sandbox.client import SandboxClient, SandboxError
from sandbox.config import SandboxConfig
from sandbox.errors import (
    BodyTooLarge,
    InternalError,
    InvalidArguments,
    InvalidRequest,
    SandboxUnreachable,
    SessionExists,
    SessionNotFound,
    Unauthorized,
    UnknownTool,
)
from sandbox.policy import ResourceClass
from sandbox.runtime.base import ProcessResult
from sandbox.service import create_app
from tests.support.servers import free_port, serve_in_thread


class Exploding:
    """A runtime with a bug: every run raises."""

    name = "exploding"

    def check(self) -> None:
        return None

    async def run(
        self, argv: list[str], workspace: Path, limits: ResourceClass, stdin: bytes = b""
    ) -> ProcessResult:
        raise RuntimeError("a bug in the runtime")


@pytest.fixture
def service(config: SandboxConfig) -> Iterator[str]:
    with serve_in_thread(create_app(config, runtime=Exploding())) as url:
        yield url


async def expect(cls: type[SandboxError], status: int, call: Awaitable[Any]) -> SandboxError:
    with pytest.raises(SandboxError) as err:
        await call
    assert type(err.value) is cls, err.value
    assert (err.value.status, err.value.code) == (status, cls.code)
    return err.value


async def test_each_answered_error_reaches_the_caller_as_its_class(service: str):
    client, stranger = SandboxClient(service, "test-token"), SandboxClient(service, "wrong")
    try:
        sid = await client.create_session("acme", "k1")
        await expect(SessionExists, 409, client.create_session("acme", "k1", session_id=sid))
        await expect(Unauthorized, 401, stranger.tools())
        await expect(UnknownTool, 404, client.call("acme", "k1", sid, "format_disk", {}))
        await expect(SessionNotFound, 404, client.call("evil", "k", sid, "list_dir", {}))
        await expect(InvalidRequest, 400, client.call("acme", "k1", "../x", "list_dir", {}))
        bad = await expect(
            InvalidArguments, 400, client.call("acme", "k1", sid, "run_shell", {"command": 1})
        )
        assert "run_shell.command should be string" in str(bad)
        huge = {"path": "a", "content": "x" * (5 << 20)}
        await expect(BodyTooLarge, 413, client.call("acme", "k1", sid, "write_file", huge))
        await expect(
            InternalError, 500, client.call("acme", "k1", sid, "run_shell", {"command": "true"})
        )
        assert (await client.call("acme", "k1", sid, "list_dir", {})).output == {"entries": []}
    finally:
        await client.close()
        await stranger.close()


async def test_no_service_listening_is_unreachable():
    client = SandboxClient(f"http://127.0.0.1:{free_port()}", "t")
    try:
        exc = await expect(SandboxUnreachable, 502, client.tools())
        assert "unreachable" in str(exc)
    finally:
        await client.close()


async def test_a_service_that_does_not_answer_in_time_is_unreachable():
    async def stuck(request: Request) -> Response:
        await asyncio.sleep(1.5)
        return Response(b"[]", media_type="application/json")

    with serve_in_thread(Starlette(routes=[Route("/v1/tools", stuck)])) as url:
        client = SandboxClient(url, "t", timeout_s=0.2)
        try:
            await expect(SandboxUnreachable, 502, client.tools())
        finally:
            await client.close()
