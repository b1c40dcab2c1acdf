"""Routing history rebuilt from the recorded steps (``gateway.routing.recall``): two
``RouteSessions`` stand for two replicas on one store (SQLite and PostgreSQL), their steps
written by the real ``StepWriter``; a replica that did not take a session's last steps
routes its next one from the same history as the replica that did."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from sqlalchemy import Engine

from gateway.recording.records import ChainHashes, ChoiceCapture, StepRecord
from gateway.recording.writer import StepWriter
from gateway.routing.recall import SessionRecall
from gateway.routing.sessions import RouteSessions, SessionKeys, chain_links
from gateway.store.database import make_engine, upgrade
from gateway.store.worker import StoreWorker
from router.types import SessionState, Tier

USER = {"role": "user", "content": "fix the bug"}


@pytest.fixture
def engine(store_url: str) -> Iterator[Engine]:
    upgrade(store_url)
    e = make_engine(store_url)
    yield e
    e.dispose()


@pytest.fixture
async def worker(engine: Engine, store_url: str) -> AsyncIterator[StoreWorker]:
    w = StoreWorker(store_url)
    await w.open()
    yield w
    await w.close()


def answer(k: int) -> dict[str, Any]:
    return {"role": "assistant", "content": f"answer {k}"}


class Replica:
    """A replica's routing sessions and the steps it hands its writer (written at once)."""

    def __init__(self, engine: Engine, worker: StoreWorker, wait_s: float = 0.0) -> None:
        self.engine = engine
        self.sessions = RouteSessions(recall=SessionRecall(worker, wait_s, poll_s=0.02))
        self.writer = StepWriter()

    async def step(
        self, name: str | None, messages: list[Any], tier: Tier, *, escalated: bool = False,
        failed: bool = False, answers: int = 1, write: bool = True,
    ) -> tuple[SessionKeys, SessionState | None, list[dict[str, Any]]]:  # fmt: skip
        """One step: the history routing saw, then the step counted and recorded."""
        body = {"messages": messages}
        keys = await self.sessions.known("acme", name, body)
        seen = self.sessions.get("acme", keys.key)
        got = [answer(len(messages) * 10 + i) for i in range(answers)] if not failed else []
        links = chain_links(keys.history, got) or []
        self.sessions.finish(
            "acme", keys, tier, escalated=escalated, failed=failed,
            continuations=["chain:" + c for c in links if c], answers=got,
        )  # fmt: skip
        record = StepRecord(
            step_ids=[uuid.uuid4().hex for _ in range(max(1, answers))],
            request_id=uuid.uuid4().hex, tenant="acme", api_key="k", endpoint="chat",
            request={"model": "auto", **body}, external_session=name, task_id=None,
            group_id=None, created_at=time.time(), status=500 if failed else 200,
            tier=str(tier), escalated=escalated, policy="session",
            choices=[ChoiceCapture(i, a, [1, 2], [-0.1, -0.2], "stop") for i, a in enumerate(got)],
            chain=ChainHashes(keys.history.prefix(), list(links))
            if keys.history is not None else None,
        )  # fmt: skip
        if write:
            self.write(record)
        return keys, seen, got

    def write(self, record: StepRecord) -> None:
        with self.engine.begin() as conn:
            self.writer.write(conn, [record])


@pytest.mark.parametrize("name", ["agent-1", None])
async def test_alternating_replicas_see_the_history_one_replica_would(
    engine: Engine, worker: StoreWorker, name: str | None
) -> None:
    replicas = [Replica(engine, worker), Replica(engine, worker)]
    alone = RouteSessions()  # one replica taking every step: what stickiness must match
    plan = [(Tier.FAST, False), (Tier.FULL, True), (Tier.FULL, False), (Tier.FAST, False),
            (Tier.FULL, False), (Tier.FAST, False)]  # fmt: skip
    messages: list[Any] = [USER]
    for k, (tier, escalated) in enumerate(plan):
        _, seen, got = await replicas[k % 2].step(name, messages, tier, escalated=escalated)
        own = alone.keys("acme", name, {"messages": messages})
        assert seen == alone.get("acme", own.key), f"step {k}"
        links = chain_links(own.history, got) or []
        alone.finish(
            "acme", own, tier, escalated=escalated, failed=False,
            continuations=["chain:" + c for c in links if c], answers=got,
        )  # fmt: skip
        messages = [*messages, got[0], {"role": "user", "content": f"go on {k}"}]
    final = replicas[0].sessions.get("acme", (await replicas[0].sessions.known(
        "acme", name, {"messages": messages})).key)  # fmt: skip
    assert final is not None and final.steps == len(plan)
    assert (final.escalations, final.fast_failures, final.last_failure_step) == (1, 1, 1)
    assert final.last_tier is Tier.FAST


async def test_a_failed_fast_step_on_one_replica_cools_the_session_down_on_the_other(
    engine: Engine, worker: StoreWorker
) -> None:
    a, b, c = Replica(engine, worker), Replica(engine, worker), Replica(engine, worker)
    await a.step("s", [USER], Tier.FAST)
    first = [USER, answer(10), {"role": "user", "content": "more"}]
    await b.step("s", first, Tier.FAST, failed=True)  # no answer: the client retries it
    _, seen, _ = await c.step("s", first, Tier.FULL)
    assert seen is not None and (seen.steps, seen.fast_failures, seen.last_failure_step) == (
        2, 1, 1,
    )  # fmt: skip
    # A gave the answer the retry continues: its entry looks current, and the failure that
    # gave no answer is not seen there (documented: docs/deployment.md)
    _, seen, _ = await a.step("s", first, Tier.FULL)
    assert seen is not None and (seen.steps, seen.fast_failures) == (1, 0)


async def test_a_hit_reads_nothing_and_a_first_step_reads_nothing(
    engine: Engine, worker: StoreWorker
) -> None:
    a = Replica(engine, worker)
    calls = 0
    real = worker.call

    async def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        return await real(*args, **kwargs)

    worker.call = counted  # type: ignore[method-assign]
    messages: list[Any] = [USER]
    for k in range(3):
        for name in ("named", None):
            _, _, got = await a.step(name, messages, Tier.FAST)
        messages = [*messages, got[0], {"role": "user", "content": f"go on {k}"}]
    assert calls == 0


async def test_a_step_not_yet_written_is_waited_for_within_wait_s(
    engine: Engine, worker: StoreWorker
) -> None:
    a, b = Replica(engine, worker), Replica(engine, worker, wait_s=5.0)
    await a.step("s", [USER], Tier.FAST)
    messages = [USER, answer(10), {"role": "user", "content": "tool failed"}]
    await a.step("s", messages, Tier.FULL, escalated=True, write=False)  # written late:
    late = [USER, answer(10), {"role": "user", "content": "tool failed"}, answer(30),
            {"role": "user", "content": "next"}]  # fmt: skip
    pending = StepRecord(
        step_ids=[uuid.uuid4().hex], request_id="late", tenant="acme", api_key="k",
        endpoint="chat", request={"messages": messages}, external_session="s", task_id=None,
        group_id=None, created_at=time.time(), status=200, tier="full", escalated=True,
        choices=[ChoiceCapture(0, answer(30), [1], [-0.1], "stop")],
    )  # fmt: skip
    loop = asyncio.get_running_loop()
    loop.call_later(0.3, a.write, pending)
    started = time.monotonic()
    _, seen, _ = await b.step("s", late, Tier.FULL)
    assert 0.25 < time.monotonic() - started < 4.0
    assert seen is not None and (seen.steps, seen.escalations, seen.last_tier) == (
        2, 1, Tier.FULL,
    )  # fmt: skip

    # without a wait the missing step is not in the history: one step's stickiness lost
    c = Replica(engine, worker, wait_s=0.0)
    more = [*late, answer(50), {"role": "user", "content": "again"}]
    _, seen, _ = await c.step("s", more, Tier.FULL, write=False)
    assert seen is not None and seen.steps == 3  # B's step is written: read at once


async def test_a_fork_continues_the_chain_of_the_answer_it_took(
    engine: Engine, worker: StoreWorker
) -> None:
    a, b = Replica(engine, worker), Replica(engine, worker)
    _, _, got = await a.step(None, [USER], Tier.FULL, answers=2)
    await a.step(None, [USER, got[0], {"role": "user", "content": "x"}], Tier.FAST)
    keys, seen, _ = await b.step(None, [USER, got[1], {"role": "user", "content": "y"}], Tier.FAST)
    assert keys.chained and seen is not None
    assert (seen.steps, seen.last_tier) == (1, Tier.FULL)  # not the other sample's fast step


async def test_an_unreachable_store_leaves_the_replicas_own_history(tmp_path: Any) -> None:
    worker = StoreWorker(f"sqlite:///{tmp_path}/never-opened.db")  # not open: unavailable
    sessions = RouteSessions(recall=SessionRecall(worker))
    body = {"messages": [USER, answer(1), {"role": "user", "content": "more"}]}
    keys = await sessions.known("acme", "s", body)
    assert keys.named and sessions.get("acme", "s") is None
    keys = await sessions.known("acme", None, body)
    assert not keys.chained
    await worker.close()
