"""Read queries: the recorded steps routing rebuilds a session's history from.

A replica's routing history of a session (``gateway.routing.sessions``) is a cache; the
steps recorded in the store are the truth it is rebuilt from when another replica took
the session's last steps (``gateway.routing.recall``). Two ways in, both by index:

* a named session: its steps, by ``(tenant_id, external_id)`` and then ``(session_id, seq)``;
* an unnamed one: the step whose answer the request continues, by ``(tenant_id,
  continuation_sha256)``, then the chain of steps it extended, walked back by their
  ``prefix_sha256`` within its session (one more query only where the chain left it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Select, select

from gateway.store.schema import SUMMARY_POLICY, sessions, steps

CLIENT_CLOSED = 499  # a step its client abandoned: routing does not count it
MAX_CHAIN = 10_000  # steps walked back at most (a cycle cannot happen; a bound anyway)


@dataclass(frozen=True, slots=True)
class StepTrace:
    """What routing counted of one recorded choice of a step."""

    seq: int
    choice: int
    tier: str | None
    escalated: bool
    failed: bool  # the tier failed it: a 5xx, or an error after a 200 began (a cut stream)
    prefix: str | None
    continuation: str | None
    response: Any  # the assistant message (chat), as recorded


_COLUMNS = (
    steps.c.seq,
    steps.c.choice_index,
    steps.c.tier,
    steps.c.escalated,
    steps.c.status,
    steps.c.error,
    steps.c.prefix_sha256,
    steps.c.continuation_sha256,
    steps.c.response,
)


def _counted(query: Select[Any]) -> Select[Any]:
    """Only the steps routing counts: not a summarizer's own call, not an abandoned one."""
    return query.where(
        steps.c.policy.is_distinct_from(SUMMARY_POLICY), steps.c.status != CLIENT_CLOSED
    )


def _trace(row: Any) -> StepTrace:
    failed = row.status >= 500 or (row.status < 400 and row.error is not None)
    return StepTrace(
        row.seq, row.choice_index, row.tier, bool(row.escalated), failed,
        row.prefix_sha256, row.continuation_sha256, row.response,
    )  # fmt: skip


def named_session_steps(conn: Connection, tenant: str, external_id: str) -> list[StepTrace]:
    """Every counted choice of the session ``external_id``, in the order of its steps."""
    query = (
        select(*_COLUMNS)
        .join(sessions, sessions.c.id == steps.c.session_id)
        .where(sessions.c.tenant_id == tenant, sessions.c.external_id == external_id)
        .order_by(steps.c.seq, steps.c.choice_index)
    )
    return [_trace(row) for row in conn.execute(_counted(query))]


def chain_steps(conn: Connection, tenant: str, continuation: str) -> list[StepTrace]:
    """The chain of steps that ends with the answer hashed ``continuation``, first step
    first, one choice per step (the one the chain went through); empty when no step
    recorded that answer (not written yet, or never given by this store's replicas)."""
    chain: list[StepTrace] = []
    wanted: str | None = continuation
    while wanted is not None and len(chain) < MAX_CHAIN:
        session = conn.execute(
            _counted(select(steps.c.session_id))
            .where(steps.c.tenant_id == tenant, steps.c.continuation_sha256 == wanted)
            .limit(1)
        ).scalar()
        if session is None:
            break
        rows = conn.execute(_counted(select(*_COLUMNS)).where(steps.c.session_id == session)).all()
        by_continuation = {r.continuation_sha256: r for r in rows if r.continuation_sha256}
        while wanted in by_continuation and len(chain) < MAX_CHAIN:
            step = _trace(by_continuation.pop(wanted))
            chain.append(step)
            wanted = step.prefix
    chain.reverse()
    return chain
