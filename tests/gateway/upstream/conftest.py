"""Fake vLLM replicas on loopback (one uvicorn thread each, shared by a module) and a
``Dispatcher`` wired to them with an injected no-op sleep and its own metrics registry."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
import pytest

from gateway.config import BreakerSettings, HealthSettings, RetrySettings, TimeoutSettings
from gateway.metrics import Metrics
from gateway.upstream.dispatch import Dispatcher
from gateway.upstream.pool import TierPool
from gateway.upstream.transport import new_session
from router import Tier
from tests.support.fake_upstream import FakeUpstream
from tests.support.servers import free_port, serve_in_thread

FULL_MODEL = "model-full"
FAST_MODEL = "model-fast"
CONNECT_S = 5.0  # generous: the CPUs may be busy; a dead port is refused at once


@dataclass
class Live:
    """A fake replica and the URL it serves on."""

    fake: FakeUpstream
    url: str

    @property
    def requests(self) -> list[dict[str, Any]]:
        return self.fake.requests

    def then(self, *behaviours: Any) -> Live:
        self.fake.then(*behaviours)
        return self


@dataclass
class Replicas:
    a: Live
    b: Live
    f: Live  # meant for the fast tier


@pytest.fixture(scope="module")
def replicas() -> Iterator[Replicas]:
    with contextlib.ExitStack() as stack:
        lives = []
        for name in ("a", "b", "f"):
            fake = FakeUpstream(name)
            lives.append(Live(fake, stack.enter_context(serve_in_thread(fake.app))))
        yield Replicas(*lives)


@pytest.fixture
def fakes(replicas: Replicas) -> Replicas:
    """The module's replicas, with an empty script and history for this test."""
    for live in (replicas.a, replicas.b, replicas.f):
        live.fake.script.clear()
        live.fake.requests.clear()
        live.fake.disconnects = 0
        live.fake.healthy = True
    return replicas


def dead_url() -> str:
    return f"http://127.0.0.1:{free_port()}"  # nothing listens: connection refused


@pytest.fixture
def blackhole_url() -> Iterator[str]:
    """A listening socket whose accept queue is full: the kernel drops further SYNs, so a
    connect hangs until the client's connect timeout (a host that went dark)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(0)
    port = srv.getsockname()[1]
    fillers = []
    for _ in range(4):
        c = socket.socket()
        c.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            c.connect(("127.0.0.1", port))
        fillers.append(c)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        for c in fillers:
            c.close()
        srv.close()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    s = new_session(TimeoutSettings(connect_s=CONNECT_S))
    yield s
    await s.close()


class Payload:
    """The ``payload(model)`` callable dispatch is given; remembers the models asked for."""

    def __init__(self, stream: bool = False) -> None:
        self.stream = stream
        self.models: list[str] = []

    def __call__(self, model: str) -> bytes:
        self.models.append(model)
        body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
        if self.stream:
            body |= {"stream": True, "stream_options": {"include_usage": True}}
        return orjson.dumps(body)


@dataclass
class Rig:
    dispatcher: Dispatcher
    pools: dict[Tier, TierPool]
    metrics: Metrics
    timeouts: TimeoutSettings
    sleeps: list[float] = field(default_factory=list)

    def metric(self, name: str, **labels: str) -> float:
        return self.metrics.registry.get_sample_value(name, labels) or 0.0

    def replica(self, tier: Tier, url: str) -> Any:
        return next(r for r in self.pools[tier].replicas if r.url == url)


@pytest.fixture
async def rig(session: aiohttp.ClientSession) -> AsyncIterator[Callable[..., Rig]]:
    own: list[aiohttp.ClientSession] = []

    def build(
        full: list[str],
        fast: list[str] | None = None,
        *,
        attempts: int = 3,
        threshold: int = 5,
        first_byte_s: float = 5.0,
        between_chunks_s: float = 5.0,
        connect_s: float | None = None,
        max_retry_after_s: float = 10.0,
        fallback: bool = True,
        clock: Callable[[], float] | None = None,
        backoff_takes_s: float = 0.0,
    ) -> Rig:
        breaker = BreakerSettings(failure_threshold=threshold, reset_after_s=10)
        health = HealthSettings()
        pools = {
            Tier.FULL: TierPool(
                Tier.FULL, FULL_MODEL, full, breaker, health, fallback=fallback, clock=clock
            )
        }
        if fast is not None:
            pools[Tier.FAST] = TierPool(Tier.FAST, FAST_MODEL, fast, breaker, health, clock=clock)
        timeouts = TimeoutSettings(
            connect_s=connect_s or CONNECT_S,
            first_byte_s=first_byte_s,
            between_chunks_s=between_chunks_s,
        )
        client = session
        if connect_s is not None:  # a session of its own with this connect timeout
            client = new_session(timeouts)
            own.append(client)
        retries = RetrySettings(
            attempts=attempts,
            backoff_base_s=0.1,
            backoff_max_s=2.0,
            max_retry_after_s=max_retry_after_s,
        )
        metrics = Metrics()
        sleeps: list[float] = []

        async def sleep(seconds: float) -> None:
            sleeps.append(seconds)
            if backoff_takes_s:  # a backoff that really waits, however long it asked for
                await asyncio.sleep(backoff_takes_s)

        dispatcher = Dispatcher(pools, client, timeouts, retries, metrics, sleep=sleep)
        return Rig(dispatcher, pools, metrics, timeouts, sleeps)

    yield build
    for s in own:
        await s.close()
