"""Tool calls as frames on the service's Unix socket (``sandbox.frames``): the same answers
and errors as HTTP, the token checked per connection, the body limit kept, and HTTP used
where the service offers no frames socket."""

from __future__ import annotations

import asyncio
import os
import stat
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import uvicorn

from sandbox import frames
from sandbox.client import SandboxClient
from sandbox.config import SandboxConfig
from sandbox.core import Sandbox
from sandbox.errors import (
    BodyTooLarge,
    InvalidRequest,
    SandboxError,
    SessionNotFound,
    Unauthorized,
    UnknownTool,
)
from sandbox.service import create_app, error_answer


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="gs-frames-") as d:  # short: a socket path
        yield Path(d)


@pytest.fixture
async def frames_only(config: SandboxConfig, socket_dir: Path) -> AsyncIterator[Path]:
    """The socket path of a sandbox that answers only frames (beside it): no HTTP at all."""
    sandbox = Sandbox(config)
    path = frames.frames_path(socket_dir / "s.sock")
    server = await frames.serve(sandbox, path, 1 << 16, error_answer)
    try:
        yield socket_dir / "s.sock"
    finally:
        server.close()
        await sandbox.close()


async def test_a_call_goes_as_frames_with_the_same_answers_and_errors(frames_only: Path):
    assert stat.S_IMODE(os.stat(frames.frames_path(frames_only)).st_mode) == 0o600
    client = SandboxClient("http://sandbox", "test-token", socket=str(frames_only))
    try:
        w = await client.call(
            "acme", "k1", "s1", "write_file", {"path": "a.txt", "content": "hi"},
            create_session=True,
        )  # fmt: skip
        r = await client.call("acme", "k1", "s1", "read_file", {"path": "a.txt"})
        assert w.allowed and w.attestation and r.output == {"content": "hi", "truncated": False}
        for cls, status, call in [
            (SessionNotFound, 404, client.call("other", "k", "s1", "read_file", {"path": "a"})),
            (UnknownTool, 404, client.call("acme", "k1", "s1", "no_such_tool", {})),
            (InvalidRequest, 400, client.call("acme", "k1", "bad id!", "read_file", {})),
        ]:
            with pytest.raises(SandboxError) as err:
                await call
            assert type(err.value) is cls and err.value.status == status, err.value
        too_big = {"path": "b.txt", "content": "x" * (1 << 17)}
        with pytest.raises(BodyTooLarge):
            await client.call("acme", "k1", "s1", "write_file", too_big)
        # the connection the service closed is not reused
        again = await client.call("acme", "k1", "s1", "read_file", {"path": "a.txt"})
        assert again.output == {"content": "hi", "truncated": False}
    finally:
        await client.close()


async def test_a_wrong_token_is_refused_on_the_connection(frames_only: Path):
    client = SandboxClient("http://sandbox", "not-the-token", socket=str(frames_only))
    try:
        with pytest.raises(Unauthorized):
            await client.call("acme", "k1", "s1", "list_dir", {"path": "."}, create_session=True)
    finally:
        await client.close()


def _serve_uds(config: SandboxConfig, path: Path) -> tuple[uvicorn.Server, threading.Thread]:
    server = uvicorn.Server(
        uvicorn.Config(create_app(config), uds=str(path), log_level="warning", lifespan="on")
    )
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "service did not start"
        time.sleep(0.01)
    return server, thread


@pytest.mark.parametrize("offered", [True, False])
async def test_the_service_offers_frames_beside_its_socket_else_http_is_used(
    config: SandboxConfig, socket_dir: Path, offered: bool
):
    path = socket_dir / "s.sock"
    # The service opens frames beside the socket it is configured with; without one
    # (here: served on a socket it was not told of) the client goes by HTTP.
    server, thread = _serve_uds(
        config.model_copy(update={"socket": path if offered else None}), path
    )
    client = SandboxClient("http://sandbox", "test-token", socket=str(path))
    try:
        assert frames.frames_path(path).exists() is offered
        r = await client.call("acme", "k1", "s2", "list_dir", {"path": "."}, create_session=True)
        assert r.allowed and r.exit_status == 0
        assert bool(client._frames.idle) is offered  # type: ignore[union-attr]
    finally:
        await client.close()
        server.should_exit = True
        await asyncio.to_thread(thread.join, 10)
    assert not frames.frames_path(path).exists()  # removed as the service stopped
