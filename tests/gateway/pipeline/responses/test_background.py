"""Background runs (``Background``) on a real store, their loop scripted: the end stored,
cancel (here and through the store, as another replica would), shutdown, a failing run."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Connection, Engine

from gateway.errors import InvalidRequest
from gateway.pipeline.request import ParsedRequest, RequestIdentity
from gateway.pipeline.responses import chat
from gateway.pipeline.responses.background import SHUTDOWN, Background
from gateway.pipeline.responses.loop import LoopState
from gateway.pipeline.responses.output import Frame, message_item
from gateway.pipeline.responses.protocol import ResponsesRequest
from gateway.pipeline.responses.serving import Turn
from gateway.store import responses as stored
from gateway.store.database import make_engine, upgrade

Loop = Callable[[Turn, LoopState], Awaitable[dict[str, Any]]]


@pytest.fixture
def engine(tmp_path: Any) -> Iterator[Engine]:
    url = f"sqlite:///{tmp_path}/store.db"
    upgrade(url)
    engine = make_engine(url)
    yield engine
    engine.dispose()


def cap(tenant: str) -> int:  # responses.max_background, by tenant
    return 16


class Service:
    """What ``Background`` uses of ``ResponsesService``, with a scripted loop."""

    def __init__(self, engine: Engine, loop: Loop) -> None:
        self.engine, self.script = engine, loop

    async def call(self, fn: Callable[[Connection], Any], param: str | None = None) -> Any:
        with self.engine.begin() as conn:
            return fn(conn)

    def new_state(self, turn: Turn) -> LoopState:
        return LoopState(None, None, 8)

    async def loop(self, turn: Turn, state: LoopState, *args: Any, **kwargs: Any) -> Any:
        return await self.script(turn, state)

    @staticmethod
    def failed(turn: Turn, state: LoopState, message: str) -> dict[str, Any]:
        error = {"code": "server_error", "message": message}
        return turn.frame.response("failed", state.output, error=error)


def turn() -> Turn:
    request = ResponsesRequest(model="m", input="hi", background=True)
    frame = Frame.new(request, chat.echo(request), True)
    who = RequestIdentity("req", time.perf_counter(), "chat", "m", "a")
    item = {"id": "in_1", "type": "message", "role": "user", "status": "completed",
            "content": [{"type": "input_text", "text": "hi"}]}  # fmt: skip
    return Turn(frame, ParsedRequest(who, {"model": "m", "messages": []}), [item], frame.id)


def body(engine: Engine, ident: str, tenant: str = "a") -> dict[str, Any]:
    with engine.begin() as conn:
        return stored.get(conn, tenant, ident)


def held(gate: asyncio.Event) -> Loop:
    async def loop(t: Turn, state: LoopState) -> dict[str, Any]:
        state.output.append(message_item("part", status="in_progress"))
        await gate.wait()
        return t.frame.response("completed", state.output)

    return loop


async def settled(bg: Background) -> None:
    while bg.tasks:
        await asyncio.sleep(0.01)


async def test_the_run_is_stored_queued_then_with_its_end(engine: Engine):
    gate = asyncio.Event()
    bg = Background(Service(engine, held(gate)), cap)  # type: ignore[arg-type]
    t = turn()
    queued = await bg.start(t)
    assert queued["status"] == "queued" and queued["background"] is True
    await asyncio.sleep(0.05)
    assert body(engine, t.frame.id)["status"] == "in_progress"
    gate.set()
    await settled(bg)
    done = body(engine, t.frame.id)
    assert done["status"] == "completed" and done["output"][0]["content"][0]["text"] == "part"
    with engine.begin() as conn:
        items = stored.load_chain(conn, "a", t.frame.id).items
        assert [i["id"] for i in items][:1] == ["in_1"] and items[-1]["status"] == "in_progress"
        with pytest.raises(InvalidRequest, match="already completed"):
            stored.cancel(conn, "a", t.frame.id)


async def test_cancel_stores_what_the_run_had(engine: Engine):
    bg = Background(Service(engine, held(asyncio.Event())), cap)  # type: ignore[arg-type]
    t = turn()
    await bg.start(t)
    await asyncio.sleep(0.05)
    out = await bg.cancel("a", t.frame.id)
    assert out["status"] == "cancelled" and out["output"][0]["status"] == "incomplete"
    assert body(engine, t.frame.id) == out and not bg.tasks


async def test_a_run_cancelled_elsewhere_stores_nothing_at_its_end(engine: Engine):
    gate = asyncio.Event()
    bg = Background(Service(engine, held(gate)), cap)  # type: ignore[arg-type]
    t = turn()
    await bg.start(t)
    await asyncio.sleep(0.05)
    with engine.begin() as conn:  # another replica's cancel: no task there
        assert stored.cancel(conn, "a", t.frame.id)["status"] == "cancelled"
    gate.set()
    await settled(bg)
    assert body(engine, t.frame.id)["status"] == "cancelled"


async def test_shutdown_stores_failed_with_the_reason(engine: Engine):
    bg = Background(Service(engine, held(asyncio.Event())), cap)  # type: ignore[arg-type]
    t = turn()
    await bg.start(t)
    await asyncio.sleep(0.05)
    await bg.close()
    out = body(engine, t.frame.id)
    assert out["status"] == "failed" and out["error"]["message"] == SHUTDOWN


async def test_a_failing_run_is_stored_failed(engine: Engine):
    async def broken(t: Turn, state: LoopState) -> dict[str, Any]:
        raise RuntimeError("boom")

    bg = Background(Service(engine, broken), cap)  # type: ignore[arg-type]
    t = turn()
    await bg.start(t)
    await settled(bg)
    out = body(engine, t.frame.id)
    assert out["status"] == "failed" and "boom" in out["error"]["message"]
