"""What a batch of the writer's is made of: the prepared statements of its lookups, the rows
waiting for their multi-row INSERTs (``Pending``), and the row builders. The logic that
decides what goes in them is ``gateway.recording.writer`` (with ``numbering`` and
``tool_calls``)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, cast
from weakref import WeakKeyDictionary

import orjson
from sqlalchemy import Connection, and_, bindparam, func, insert, or_, select, update
from sqlalchemy.dialects import sqlite

from gateway.recording.prompt_ref import Encoded
from gateway.recording.records import ChoiceCapture, StepRecord, ToolResultRecord
from gateway.store import codec
from gateway.store.rows import insert_ignore, now_utc
from gateway.store.schema import blobs, context_events, sessions, steps, tool_calls
from gateway.store.schema import rewards as rewards_t

# The writer's lookups, built once: SQLAlchemy keeps their compiled form, so a lookup
# costs an execution, not a statement's construction and cache-key computation.
CONTINUED = (
    select(steps.c.session_id)
    .where(
        steps.c.tenant_id == bindparam("tenant"),
        steps.c.continuation_sha256 == bindparam("prefix"),
    )
    .limit(1)
)
# the sessions ending a step in any of a tenant's continuation hashes; a hash's first row
# is the one CONTINUED's LIMIT 1 reads (both walk ix_steps_tenant_continuation)
CONTINUED_ANY = select(steps.c.continuation_sha256, steps.c.session_id).where(
    steps.c.tenant_id == bindparam("tenant"),
    steps.c.continuation_sha256.in_(bindparam("prefixes", expanding=True)),
)
CONTINUED_CHUNK = 500  # hashes a statement: well inside every driver's parameter limit
TOP_SEQ = select(func.max(steps.c.seq)).where(steps.c.session_id == bindparam("sid"))
# each listed session's last committed step number (sessions without steps: no row)
TOPS = (
    select(steps.c.session_id, func.max(steps.c.seq))
    .where(steps.c.session_id.in_(bindparam("sids", expanding=True)))
    .group_by(steps.c.session_id)
)
# PostgreSQL: the sessions' rows locked until the commit, in one order (no deadlock), so
# that two writers number the steps of one session one after the other
LOCK_SESSIONS = (
    select(sessions.c.id)
    .where(sessions.c.id.in_(bindparam("sids", expanding=True)))
    .order_by(sessions.c.id)
    .with_for_update()
)
CALL_SIGS = select(tool_calls.c.tool, tool_calls.c.arguments).where(
    tool_calls.c.session_id == bindparam("sid")
)
OPEN_CALLS = select(tool_calls.c.id, tool_calls.c.call_id, tool_calls.c.exit_status).where(
    tool_calls.c.session_id == bindparam("sid"),
    tool_calls.c.call_id.in_(bindparam("call_ids", expanding=True)),
    tool_calls.c.result.is_(None),
)


def open_calls(conn: Connection, pairs: list[tuple[str, str]]) -> Sequence[Any]:
    """``OPEN_CALLS`` for several (session, call id) pairs at once (``ToolCalls.prefetch``):
    (session id, call pk, call id, exit status) rows. An OR of pairs, which the (session_id,
    call_id) index answers pair by pair (SQLite scanned the table for a tuple IN, and two IN
    lists made it look up every session with every call id); compiled once per dialect and
    number of pairs, and run as its SQL: SQLAlchemy would compute the cache key of its
    hundreds of terms at every execution. The pairs are padded with their last to a power of
    two (a repeated term selects nothing more), so a writer keeps at most ten statements, not
    one per count up to ``PREFETCH_IDS``."""
    if not pairs:
        return []
    size = 1 << (len(pairs) - 1).bit_length()
    pairs = pairs + pairs[-1:] * (size - len(pairs))
    known = _OPEN_CALLS_OF.setdefault(conn.dialect, {})
    compiled = known.get(size)
    if compiled is None:
        c = tool_calls.c
        terms = [
            and_(c.session_id == bindparam(f"s{i}"), c.call_id == bindparam(f"c{i}"))
            for i in range(size)
        ]
        stmt = select(c.session_id, c.id, c.call_id, c.exit_status).where(
            or_(*terms), c.result.is_(None)
        )
        compiled = known[size] = stmt.compile(dialect=conn.dialect)
    params = {f"{k}{i}": v for i, pair in enumerate(pairs) for k, v in zip("sc", pair, strict=True)}
    if compiled.positional:
        assert compiled.positiontup is not None
        return conn.exec_driver_sql(
            compiled.string, tuple(params[k] for k in compiled.positiontup)
        ).all()
    return conn.exec_driver_sql(compiled.string, params).all()


_OPEN_CALLS_OF: WeakKeyDictionary[Any, dict[int, Any]] = WeakKeyDictionary()

ANSWER_CALL = (
    update(tool_calls)
    .where(tool_calls.c.id == bindparam("pk"))
    .values(
        result=bindparam("answer"),
        result_step_id=bindparam("answer_step"),
        status=bindparam("answer_status"),
    )
)


_SANDBOX_COLUMNS = ("result", "status", "exit_status", "duration_ms", "denial",
                   "injected_fault", "attestation")  # fmt: skip
NO_SANDBOX_RESULT = dict.fromkeys(_SANDBOX_COLUMNS[2:])
SANDBOX_RESULT = (
    update(tool_calls)
    .where(tool_calls.c.id == bindparam("pk"))
    .values({c: bindparam("set_" + c) for c in _SANDBOX_COLUMNS})
)
CALL_BY_ID = (
    select(tool_calls.c.id, tool_calls.c.attestation)
    .where(tool_calls.c.session_id == bindparam("sid"), tool_calls.c.call_id == bindparam("call"))
    .limit(1)
)


class LRU(OrderedDict[str, Any]):
    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity

    def put(self, key: str, value: Any) -> None:
        self[key] = value
        self.move_to_end(key)
        if len(self) > self.capacity:
            self.popitem(last=False)


class Pending:
    """Rows waiting for their multi-row INSERT, in foreign-key order, and this batch's
    answers to tool calls committed earlier (one UPDATE statement for all of them).

    A step's ``seq`` waits here as its place among the batch's steps of its session
    (0, 1, ...); ``flush`` turns it into the session's step number (``number``)."""

    def __init__(self) -> None:
        self.blobs: dict[str, dict[str, Any]] = {}
        self.sessions: dict[str, dict[str, Any]] = {}
        self.steps: list[dict[str, Any]] = []
        self.calls: list[dict[str, Any]] = []
        self.rewards: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []  # context_events, after their steps
        self.answers: list[dict[str, Any]] = []
        self.sandbox_results: list[dict[str, Any]] = []  # for committed calls
        self.answered: set[str] = set()  # committed calls answered in this batch
        # session -> its calls made in this batch and not answered yet, by call id
        self.open_calls: dict[str, dict[str, dict[str, Any]]] = {}
        # sessions with nothing committed when this batch first saw them: no call of theirs
        # can be in the database, so answering their calls needs no query
        self.fresh: set[str] = set()
        # session -> the call ids read in one statement at the batch's start (``prefetched``)
        # and the open committed calls found under them, in the order the store gave them
        self.prefetched: dict[str, tuple[set[str], list[tuple[str, str, int | None]]]] = {}
        # the tool results of a step's messages (``id`` of the list), found by ``prefetch``
        self.tool_results: dict[int, dict[Any, Any]] = {}
        # session -> how many step numbers this batch gives it (choices of one request share one)
        self.order: dict[str, int] = {}
        # session -> its last committed step number (-1: none) as this batch found it
        self.tops: dict[str, int] = {}
        # (tenant, continuation hash) -> the committed session ending a step in it (None:
        # none), read in one statement at the batch's start for the steps that name no
        # session (``continued``)
        self.continued: dict[tuple[str, str], str | None] = {}

    def add_calls(self, rows: list[dict[str, Any]]) -> None:
        self.calls.extend(rows)
        for row in rows:
            if row["call_id"] is not None:
                self.open_calls.setdefault(row["session_id"], {}).setdefault(row["call_id"], row)

    def take(self, sid: str) -> int:
        """The next step's place among this batch's steps of session ``sid``."""
        at = self.order.get(sid, 0)
        self.order[sid] = at + 1
        return at

    def flush(self, conn: Connection) -> dict[str, int]:
        """Insert everything; the sessions' last step numbers the steps were numbered after."""
        # Sorted: two writers inserting the same keys wait for each other in one order.
        insert_rows(conn, blobs, [self.blobs[k] for k in sorted(self.blobs)], ignore=True)
        insert_rows(conn, sessions, [self.sessions[k] for k in sorted(self.sessions)], ignore=True)
        tops = self.number(conn)
        for table, rows in (
            (steps, self.steps),
            (tool_calls, self.calls),
            (rewards_t, self.rewards),
            (context_events, self.events),
        ):
            insert_rows(conn, table, rows)
        if self.answers:
            conn.execute(ANSWER_CALL, self.answers)
        if self.sandbox_results:
            conn.execute(SANDBOX_RESULT, self.sandbox_results)
        return tops

    def number(self, conn: Connection) -> dict[str, int]:
        """Give each step its number: after the last step of its session committed by
        anyone (another replica's writer included), read where no other writer can commit
        one before this transaction does. SQLite: the inserts above hold the database's
        write lock (``flush`` always inserts a blob with a step), and a transaction holding
        it reads the newest commit. PostgreSQL: the sessions' rows are locked first, then
        read in a new statement (which sees what the holder before us committed)."""
        if not self.order:
            return {}
        sids = sorted(self.order)
        if conn.dialect.name == "postgresql":
            conn.execute(LOCK_SESSIONS, {"sids": sids})
        tops = last_numbers(conn, sids)
        for row in self.steps:
            row["seq"] += tops[row["session_id"]] + 1
        return tops


class _Compiled:
    """A table's INSERT for one set of row keys, compiled once for SQLite: its SQL, and each
    parameter's key and bind processor in the order the statement binds them."""

    __slots__ = ("binds", "sql")

    def __init__(self, conn: Connection, table: Any, keys: tuple[str, ...], ignore: bool) -> None:
        stmt = sqlite.insert(table).on_conflict_do_nothing() if ignore else insert(table)
        compiled = stmt.compile(dialect=conn.dialect, column_keys=list(keys))
        processors = compiled._bind_processors
        assert compiled.positiontup is not None and set(compiled.positiontup) == set(keys)
        self.sql = compiled.string
        # (a column's processor: one callable; a sequence only for tuple-valued binds)
        self.binds: list[tuple[str, Callable[[Any], Any] | None]] = [
            (k, cast(Callable[[Any], Any] | None, processors.get(k))) for k in compiled.positiontup
        ]


# per dialect (its JSON serializer is in the bind processors), table, keys and ignore
_COMPILED: WeakKeyDictionary[Any, dict[tuple[str, tuple[str, ...], bool], _Compiled]] = (
    WeakKeyDictionary()
)


def insert_rows(
    conn: Connection, table: Any, rows: list[dict[str, Any]], ignore: bool = False
) -> None:
    """One multi-row INSERT of ``rows`` (``ignore``: ON CONFLICT DO NOTHING).

    SQLite: the statement is compiled once per table and set of keys, and the rows go to
    the driver's ``executemany`` as tuples, each value through the bind processor
    SQLAlchemy gives its column: the parameters SQLAlchemy would send, without building
    its execution context's per-row dictionaries and its statement cache lookups (#29).
    Rows whose keys differ from the first's, and PostgreSQL, take SQLAlchemy's way."""
    if not rows:
        return
    if conn.dialect.name != "sqlite":
        if ignore:
            insert_ignore(conn, table, rows)
        else:
            conn.execute(insert(table), rows)
        return
    keys = tuple(rows[0])
    if any(r.keys() != rows[0].keys() for r in rows):
        conn.execute(
            (sqlite.insert(table).on_conflict_do_nothing() if ignore else insert(table)), rows
        )
        return
    known = _COMPILED.setdefault(conn.dialect, {})
    at = (table.name, keys, ignore)
    compiled = known.get(at)
    if compiled is None:
        compiled = known[at] = _Compiled(conn, table, keys, ignore)
    binds = compiled.binds
    params = [tuple(row[k] if p is None else p(row[k]) for k, p in binds) for row in rows]
    conn.exec_driver_sql(compiled.sql, params)


def continued(conn: Connection, asks: dict[str, set[str]]) -> dict[tuple[str, str], str | None]:
    """For each tenant's continuation hashes in ``asks``, the session that ends a step in
    it (None: no committed step does), in one statement per tenant and chunk."""
    out: dict[tuple[str, str], str | None] = {}
    for tenant, prefixes in asks.items():
        ordered = sorted(prefixes)
        for at in range(0, len(ordered), CONTINUED_CHUNK):
            chunk = ordered[at : at + CONTINUED_CHUNK]
            out.update(((tenant, prefix), None) for prefix in chunk)
            for prefix, sid in conn.execute(CONTINUED_ANY, {"tenant": tenant, "prefixes": chunk}):
                if out[(tenant, prefix)] is None:
                    out[(tenant, prefix)] = str(sid)
    return out


def last_numbers(conn: Connection, sids: list[str]) -> dict[str, int]:
    """Each session's last committed step number; -1 for a session without steps."""
    tops = dict.fromkeys(sids, -1)
    tops.update((sid, int(top)) for sid, top in conn.execute(TOPS, {"sids": sids}))
    return tops


def text_of(content: Any) -> str:
    return content if isinstance(content, str) else orjson.dumps(content).decode()


def session_row(rec: StepRecord, sid: str) -> dict[str, Any]:
    return {
        "id": sid,
        "tenant_id": rec.tenant,
        "api_key": rec.api_key,
        "external_id": rec.external_session,
        "task_id": rec.task_id,
        "group_id": rec.group_id,
        "task_spec": None,
        "status": "open",
        "outcome": None,
        "created_at": now_utc(rec.created_at),
        "ended_at": None,
    }


def step_row(
    rec: StepRecord,
    step_id: str,
    choice: ChoiceCapture,
    sid: str,
    seq: int,
    sha: str,
    prompt: Encoded,
    created: datetime,
) -> dict[str, Any]:
    return {
        "id": step_id,
        "tenant_id": rec.tenant,
        "session_id": sid,
        "seq": seq,
        "choice_index": choice.index,
        "request_id": rec.request_id,
        "endpoint": rec.endpoint,
        "request_sha256": sha,
        "response": choice.message,
        "prompt_token_ids": prompt.ids,
        "prompt_ref_step": prompt.ref,
        "prompt_ref_len": prompt.shared,
        "completion_token_ids": codec.pack_ids(choice.token_ids),
        "logprobs": codec.pack_floats(choice.logprobs) if choice.token_ids is not None else None,
        "tier": rec.tier,
        "model": rec.model,
        "replica": rec.replica,
        "policy": rec.policy,
        "routing_version": rec.routing_version,
        "propensity": rec.propensity,
        "route_reason": rec.route_reason,
        "features": rec.features,
        "fallback": rec.fallback,
        "escalated": rec.escalated,
        "attempts": rec.attempts,
        "status": rec.status,
        "finish_reason": choice.finish_reason,
        "prompt_tokens": rec.prompt_tokens,
        "completion_tokens": len(choice.token_ids)
        if choice.token_ids is not None
        else rec.completion_tokens,
        "ttft_ms": rec.ttft_ms,
        "duration_ms": rec.duration_ms,
        "error": rec.error,
        "created_at": created,
    }


def reward_row(
    rec: StepRecord | ToolResultRecord,
    sid: str,
    step_id: str | None,
    call_id: str | None,
    name: str,
    value: float,
    created: datetime,
    source: str = "gateway",
) -> dict[str, Any]:
    scope = "tool_call" if call_id else "step" if step_id else "session"
    return {
        "tenant_id": rec.tenant,
        "session_id": sid,
        "step_id": step_id,
        "tool_call_id": call_id,
        "scope": scope,
        "name": name,
        "value": value,
        "source": source,
        "created_at": created,
    }
