"""The usage ledger's store side: one transaction per turn of its thread
(``gateway.access.ledger``) that grants what reservations ask, writes the spent usage and
returns the idle free parts (``gateway.access.shares``), and renews this replica's leases.

The transaction (``gateway.store.ledger``) locks and reads the rows with this replica's
leases on them, writes spent usage to ``used``, gives back idle free parts, then admits each
reservation whole or refuses it whole (a block more than it needs while far from the cap),
tops up the shares running low, writes the rows and leases back, and commits once.

On SQLite the ledger's connection commits with ``synchronous=NORMAL`` (WAL): atomic and
consistent across processes, without an fsync per transaction; a power cut may lose the
last transactions' counts, never corrupt them; on PostgreSQL it commits with
``synchronous_commit=off``, the same trade. A transaction that fails (a lost connection, a
lock timeout) is retried on a fresh connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy.pool import NullPool

from gateway.access.shares import Moves, Share, grant, running_low
from gateway.store.database import make_engine
from gateway.store.ledger import Counter, Key, Row, Statements

ATTEMPTS = 5
Taken = list[tuple[Counter, int]]  # counters and the amount each reserves
Result = list[int] | Counter  # each counter's new total, or the counter that refused


@dataclass(slots=True)
class Reserve:
    """A reservation the shares did not cover, queued for the ledger's thread."""

    items: Taken
    future: asyncio.Future[Result]
    loop: asyncio.AbstractEventLoop
    local: list[tuple[Key, int]] = field(default_factory=list)  # taken from free, to undo
    need: list[tuple[Counter, int]] = field(default_factory=list)  # from the store
    low: list[tuple[Counter, int]] = field(default_factory=list)  # covered, but running out
    result: Result | None = None


@dataclass(slots=True)
class Turn:
    """What one turn of the ledger's thread asks of the store."""

    ops: list[Reserve]  # reservations the shares did not cover
    refills: Taken  # shares a take left running low
    moves: dict[Key, Moves]  # the flush: spent usage to write, free parts to return
    base: dict[Key, int]  # each share's lease before the turn: what the store should hold


@dataclass(slots=True)
class Outcome:
    """A transaction's effect on the shares, applied once it committed."""

    rows: dict[Key, Row]
    held: dict[Key, int] = field(default_factory=dict)
    free: dict[Key, int] = field(default_factory=dict)
    exact: dict[Key, bool] = field(default_factory=dict)


def _relaxed(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA busy_timeout=0")  # gateway.store.ledger waits for the lock itself
    cur.close()


class LedgerStore:
    """The ledger thread's connection to the store and the transaction it runs each turn.
    Used from that thread alone."""

    def __init__(self, url: str, lease_s: float) -> None:
        self.engine: Engine = make_engine(url, poolclass=NullPool)
        if self.engine.dialect.name == "sqlite":
            event.listen(self.engine, "connect", _relaxed)  # after make_engine's pragmas
        self.sql = Statements(self.engine.dialect.name)
        self.lease_s = lease_s
        self.holder = f"{socket.gethostname()[:30]}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
        self.transactions = 0  # committed: what the allotments save shows here
        self._known: set[Key] = set()  # rows this process has created or seen
        self._conn: Any = None  # the DBAPI connection (SQLAlchemy's proxy of it)
        self._driver_error: type[Exception] = self.engine.dialect.loaded_dbapi.Error

    def run(self, turn: Turn, shares: dict[Key, Share]) -> tuple[Outcome | None, Exception | None]:
        """The transaction, retried on a fresh connection when the driver fails: its
        outcome, or the last driver error. ``shares`` is read unlocked, for the totals."""
        error: Exception | None = None
        for attempt in range(ATTEMPTS):
            try:
                return self._transaction(turn, shares), None
            except self._driver_error as exc:  # a lost connection, a lock timeout
                error = exc
                self.reset()
                time.sleep(0.01 * 2**attempt)
        return None, error

    def reset(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
        self._conn = None

    def _connection(self) -> Any:
        if self._conn is None:
            self._conn = self.engine.raw_connection()
            if self.sql.dialect == "sqlite":
                self._conn.driver_connection.isolation_level = None  # we say BEGIN IMMEDIATE
            else:
                self._conn.cursor().execute("SET synchronous_commit TO off")
                self._conn.commit()
        return self._conn

    def _transaction(self, turn: Turn, shares: dict[Key, Share]) -> Outcome:
        conn, sql = self._connection(), self.sql
        ops, refills, moves, base = turn.ops, turn.refills, turn.moves, turn.base
        asked = {c.key for op in ops for c, _ in (*op.need, *op.low)}
        asked.update(c.key for c, _ in refills)
        touched = sorted(asked | set(moves))
        new = [k for k in touched if k not in self._known]
        now_ms = int(time.time() * 1000)
        cur = conn.cursor()
        sqlite = sql.dialect == "sqlite"
        try:
            sql.begin(cur)
            if new:
                sql.ensure(cur, new)
            rows = sql.read(cur, touched, self.holder)
            before = {k: (r.used, r.reserved) for k, r in rows.items()}
            out = Outcome(rows)
            for key, row in rows.items():
                # the store counts row.leased for this replica; it holds base (they differ
                # when the lease ended and another replica took it back)
                row.reserved += base.get(key, 0) - row.leased
                m = moves.get(key)
                if m is not None:
                    row.used += m.spent
                    row.reserved -= m.spent + m.returned
            spare: dict[Key, int] = {}
            for op in ops:
                op.result = self._decide(cur, op, rows, spare, out, now_ms, shares)
            _top_up(refills, rows, spare, out)
            leases = {}
            for key, row in rows.items():
                row.reserved = max(0, row.reserved)
                leases[key] = base.get(key, 0) - _moved(moves.get(key)) + out.held.get(key, 0)
                leases[key] += out.free.get(key, 0)
            sql.write(cur, {k: r for k, r in rows.items() if (r.used, r.reserved) != before[k]})
            sql.lease(cur, leases, self.holder, now_ms + int(self.lease_s * 1000))
            cur.execute("COMMIT") if sqlite else conn.commit()
        except BaseException:
            with contextlib.suppress(Exception):
                cur.execute("ROLLBACK") if sqlite else conn.rollback()
            raise
        finally:
            cur.close()
        if len(self._known) > 100_000:  # old windows' counters
            self._known.clear()
        self._known.update(new)
        self.transactions += 1
        return out

    def _decide(
        self,
        cur: Any,
        op: Reserve,
        rows: dict[Key, Row],
        spare: dict[Key, int],
        out: Outcome,
        now_ms: int,
        shares: dict[Key, Share],
    ) -> Result:
        """Admit ``op`` whole from the store (its part from ``spare``, what earlier grants
        of this transaction left over, first) or refuse it whole."""
        for counter, amount in op.need:
            row = rows[counter.key]
            if (
                spare.get(counter.key, 0) < amount
                and counter.cap - row.used - row.reserved < amount
            ):
                row.reserved -= self.sql.take_back(cur, counter.key, self.holder, now_ms)
                if counter.cap - row.used - row.reserved < amount:
                    return counter
        for counter, amount in op.need:
            key, row = counter.key, rows[counter.key]
            out.held[key] = out.held.get(key, 0) + amount
            if spare.get(key, 0) >= amount:
                spare[key] -= amount
                out.free[key] = out.free.get(key, 0) - amount
                continue
            granted = grant(counter.cap, counter.cap - row.used - row.reserved, amount)
            row.reserved += granted
            spare[key] = spare.get(key, 0) + granted - amount
            out.free[key] = out.free.get(key, 0) + granted - amount
            out.exact[key] = granted == amount
        _top_up(op.low, rows, spare, out)  # one transaction refills all of a request's shares
        totals = []
        for counter, _ in op.items:  # less what this replica holds free (read unlocked:
            s, read = shares.get(counter.key), rows.get(counter.key)  # for warnings)
            if read is None:  # all of it taken from the share
                totals.append(s.total() if s is not None else 0)
                continue
            free = spare.get(counter.key, 0) + (max(0, s.free) if s is not None else 0)
            totals.append(read.used + read.reserved - free)
        return totals


def _top_up(low: Taken, rows: dict[Key, Row], spare: dict[Key, int], out: Outcome) -> None:
    """A block more for each share running low (``grant``: none near the cap), unless this
    transaction already gave it one."""
    for counter, amount in low:
        key, row = counter.key, rows[counter.key]
        more = grant(counter.cap, counter.cap - row.used - row.reserved, amount) - amount
        if more > 0 and running_low(spare.get(key, 0), amount):
            row.reserved += more
            spare[key] = spare.get(key, 0) + more
            out.free[key] = out.free.get(key, 0) + more


def _moved(m: Moves | None) -> int:
    return 0 if m is None else m.spent + m.returned
