"""`gearshift serve` under either HTTP server (``GEARSHIFT_HTTP_SERVER``: uvicorn, the default,
or the experimental granian; docs/decisions/http-server.md): the start-up gate opens, plain
and streamed answers, a client that hangs up is noticed upstream, SIGTERM drains the request
in flight, and a port already taken is exit code 1."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import signal
import socket
import time

import httpx
import pytest

from gateway.cli import serve
from gateway.config import Settings
from tests.support.fake_upstream import Behaviour, FakeUpstream
from tests.support.servers import free_port, serve_in_thread

SERVERS = [
    "uvicorn",
    pytest.param(
        "granian",
        marks=pytest.mark.skipif(
            importlib.util.find_spec("granian") is None, reason="granian: the bench extra"
        ),
    ),
]
CHAT = {"model": "auto", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}


def settings_for(replica: str, port: int) -> Settings:
    return Settings(
        port=port,
        tiers={
            "full": {"model": "m", "replicas": [replica]},
            "fast": {"model": "m-fast", "replicas": [replica]},
        },
        health={"interval_s": 0.2},
        router={"calibrate_tokens": False},
        store={"enabled": False},
        sandbox={"enabled": False},
    )


async def _ready(client: httpx.AsyncClient, task: asyncio.Task[int]) -> None:
    deadline = time.monotonic() + 30
    while True:
        assert not task.done(), "serve stopped before it was ready"
        assert time.monotonic() < deadline, "not ready after 30 s"
        try:
            if (await client.get("/ready")).status_code == 200:
                return
        except httpx.TransportError:
            pass
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("server", SERVERS)
def test_serve_answers_notices_hang_ups_and_drains_on_sigterm(
    server: str, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("GEARSHIFT_HTTP_SERVER", server)
    upstream = FakeUpstream().then(Behaviour(), Behaviour(), Behaviour(kind="stall"))
    upstream.then(Behaviour(delay_s=1.0))
    port = free_port()

    async def scenario(replica: str) -> tuple[int, list[int], bytes]:
        task = asyncio.create_task(serve.run(settings_for(replica, port)))
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=20) as client:
            await _ready(client, task)
            plain = await client.post("/v1/chat/completions", json=CHAT)
            streamed = await client.post("/v1/chat/completions", json=CHAT | {"stream": True})
            with pytest.raises(httpx.ReadTimeout):  # hangs up on the stalled answer
                await client.post("/v1/chat/completions", json=CHAT, timeout=0.5)
            deadline = time.monotonic() + 10
            while upstream.disconnects == 0 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            slow = asyncio.create_task(client.post("/v1/chat/completions", json=CHAT))
            await asyncio.sleep(0.3)  # in flight upstream
            os.kill(os.getpid(), signal.SIGTERM)
            drained = await slow
            code = await asyncio.wait_for(task, 20)
        statuses = [plain.status_code, streamed.status_code, drained.status_code]
        return code, statuses, streamed.content

    with serve_in_thread(upstream.app) as replica:
        code, statuses, streamed = asyncio.run(scenario(replica))
    assert code == 0
    assert statuses == [200, 200, 200]
    assert streamed.rstrip().endswith(b"data: [DONE]")
    assert upstream.disconnects == 1  # the gateway let go of the stalled request


@pytest.mark.parametrize("server", SERVERS)
def test_a_port_already_taken_is_exit_code_1(server: str, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("GEARSHIFT_HTTP_SERVER", server)
    with socket.socket() as taken, serve_in_thread(FakeUpstream().app) as replica:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = asyncio.run(asyncio.wait_for(serve.run(settings_for(replica, port)), 30))
    assert code == 1
