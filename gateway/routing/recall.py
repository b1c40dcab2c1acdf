"""A session's routing history rebuilt from its recorded steps, for a replica that missed them.

Each replica keeps the routing history of the sessions it serves in memory
(``gateway.routing.sessions``); the store holds every step any replica recorded: the tier
that answered, whether it was escalated, whether the tier failed it. When a step continues
an answer this replica did not give (another replica took the session's last steps, or this
one forgot them), the history is replayed from those steps — the same ``advance`` the
replica that took them applied — so tier stickiness and the cooldown after a fast-tier
failure carry over to whichever replica takes the next step.

Recording is asynchronous (a writer process commits steps in batches), so the step the
request continues may not be in the store yet. ``wait_s`` bounds how long a miss polls for
it; with 0 (the default) or past it, a named session's history stands as far as it is
written (without that step), and an unnamed session's step, whose answer no recorded step
gave, falls back to its opening's history. Only a miss waits; a replica that gave the last
answer itself reads nothing.

What is not rebuilt: the last exact prompt count (``SessionState.anchor``; the next step
is sized by the estimate and anchored again) and the history kept under a session's
opening (each replica's own, the fallback for steps that continue no known answer).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from itertools import groupby

from gateway.errors import StoreUnavailable
from gateway.routing.sessions import advance, answer_tag
from gateway.store.routing_history import StepTrace, chain_steps, named_session_steps
from gateway.store.worker import StoreWorker
from router.types import SessionState, Tier

log = logging.getLogger(__name__)


def replay(traces: Sequence[StepTrace]) -> SessionState | None:
    """The history after ``traces`` (one entry per step: its first choice counts)."""
    state: SessionState | None = None
    for _, choices in groupby(traces, key=lambda t: t.seq):
        step = next(choices)
        try:
            tier = Tier(step.tier or "")
        except ValueError:  # no tier (or one this version does not know): not counted
            continue
        state = advance(state, tier, step.escalated, step.failed, None)
    return state


def last_tags(traces: Sequence[StepTrace]) -> frozenset[int]:
    """The tags of the answers of the last recorded step (one per choice)."""
    if not traces:
        return frozenset()
    last = traces[-1].seq
    return frozenset(
        answer_tag(t.response) for t in traces if t.seq == last and isinstance(t.response, dict)
    )


class SessionRecall:
    def __init__(self, worker: StoreWorker, wait_s: float = 0.0, poll_s: float = 0.05) -> None:
        self.worker = worker
        self.wait_s = wait_s
        self.poll_s = poll_s

    async def named(self, tenant: str, name: str, answer: int | None) -> SessionState | None:
        """The named session's history as recorded, once its step that gave ``answer``
        (the tag of the request's last assistant message) is, or ``wait_s`` has passed."""

        def done(traces: list[StepTrace]) -> bool:
            return answer is None or answer in last_tags(traces)

        traces = await self._read(lambda c: named_session_steps(c, tenant, name), done)
        return replay(traces) if traces else None

    async def chain(self, tenant: str, prefix: str) -> SessionState | None:
        """The history of the unnamed session whose answer hashed ``prefix`` the request
        continues: the chain of steps that led to it, once it is recorded."""
        traces = await self._read(lambda c: chain_steps(c, tenant, prefix), bool)
        return replay(traces) if traces else None

    async def _read(
        self, query: Callable[..., list[StepTrace]], done: Callable[[list[StepTrace]], bool]
    ) -> list[StepTrace]:
        """``query`` on the store's thread, again every ``poll_s`` until ``done`` or
        ``wait_s``; a store that does not answer leaves the replica's own history."""
        deadline = time.monotonic() + self.wait_s
        while True:
            try:
                traces = await self.worker.call(query, write=False)
            except StoreUnavailable as exc:
                log.warning("session history not read from the store: %s", exc)
                return []
            if done(traces) or time.monotonic() >= deadline:
                return traces
            await asyncio.sleep(self.poll_s)
