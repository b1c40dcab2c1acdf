"""The usage ledger's client: reservations and settlements, batched.

One thread owns a connection to the store. Each turn it takes everything queued (every
request that arrived while the last transaction ran) and applies it in one transaction
(``gateway.store.ledger``): lock and read the rows, settle, then admit each reservation
whole or refuse it whole, write the rows back, commit once. Under load the commit, the
thread hop and the round trips are shared by the batch.

On SQLite the ledger's connection commits with ``synchronous=NORMAL`` (WAL): atomic and
consistent across processes, without an fsync per batch; a power cut may lose the last
batches' counts, never corrupt them; on PostgreSQL it commits with
``synchronous_commit=off``, the same trade. A batch that fails (a lost connection, a lock
timeout) is retried on a fresh connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy.pool import NullPool

from gateway.errors import StoreUnavailable
from gateway.store.database import make_engine
from gateway.store.ledger import Counter, Key, Statements

log = logging.getLogger(__name__)
MAX_BATCH = 1024
ATTEMPTS = 5
Taken = list[tuple[Counter, int]]  # counters and the amount each reserves


@dataclass(slots=True)
class _Reserve:
    items: Taken
    future: asyncio.Future[list[int] | Counter]
    loop: asyncio.AbstractEventLoop
    result: list[int] | Counter | None = None


@dataclass(slots=True)
class _Settle:
    items: list[tuple[Counter, int, int]]  # counter, reserved, used


_STOP = object()


def _relaxed(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA busy_timeout=0")  # gateway.store.ledger waits for the lock itself
    cur.close()


class Ledger:
    def __init__(self, url: str) -> None:
        self.engine: Engine = make_engine(url, poolclass=NullPool)
        if self.engine.dialect.name == "sqlite":
            event.listen(self.engine, "connect", _relaxed)  # after make_engine's pragmas
        self.sql = Statements(self.engine.dialect.name)
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._known: set[Key] = set()  # rows this process has created or seen
        self._conn: Any = None  # the thread's DBAPI connection (SQLAlchemy's proxy of it)
        self._driver_error: type[Exception] = self.engine.dialect.loaded_dbapi.Error
        self._thread = threading.Thread(target=self._run, name="gearshift-ledger", daemon=True)
        self._thread.start()

    async def reserve(self, items: Taken) -> list[int] | Counter:
        """Each counter's new total, or the first counter that would pass its cap (then
        none is taken)."""
        loop = asyncio.get_running_loop()
        op = _Reserve(items, loop.create_future(), loop)
        self._queue.put(op)
        try:
            return await asyncio.shield(op.future)
        except asyncio.CancelledError:  # the client left: give back what the batch takes
            op.future.add_done_callback(lambda f: self._give_back(items, f))
            raise

    def settle(self, items: list[tuple[Counter, int, int]]) -> None:
        """Queue settlements; they commit with the next batch (nobody waits for them)."""
        self._queue.put(_Settle(items))

    def _give_back(self, items: Taken, done: asyncio.Future[list[int] | Counter]) -> None:
        if not done.cancelled() and done.exception() is None and isinstance(done.result(), list):
            self.settle([(c, n, 0) for c, n in items])

    def close(self) -> None:
        self._queue.put(_STOP)
        self._thread.join(10)
        self.engine.dispose()

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            batch = [first]
            while len(batch) < MAX_BATCH:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            ops = [op for op in batch if isinstance(op, _Reserve | _Settle)]
            if ops:
                self._apply(ops)
            if any(op is _STOP for op in batch):
                if self._conn is not None:
                    self._conn.close()
                return

    def _apply(self, ops: list[_Reserve | _Settle]) -> None:
        error: Exception | None = None
        for attempt in range(ATTEMPTS):
            try:
                self._transaction(ops)
                error = None
                break
            except self._driver_error as exc:  # a lost connection, a lock timeout
                error = exc
                self._reset()
                time.sleep(0.01 * 2**attempt)
        for op in ops:
            if not isinstance(op, _Reserve):
                continue
            if error is not None:
                failed = StoreUnavailable(f"the usage ledger is unreachable: {error}")
                op.loop.call_soon_threadsafe(_fail, op.future, failed)
            else:
                op.loop.call_soon_threadsafe(_resolve, op.future, op.result)
        if error is not None:
            log.error("usage ledger: %d operations lost: %s", len(ops), error)

    def _reset(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
        self._conn = None

    def _transaction(self, ops: list[_Reserve | _Settle]) -> None:
        if self._conn is None:
            self._conn = self.engine.raw_connection()
            if self.sql.dialect == "sqlite":
                self._conn.driver_connection.isolation_level = None  # we say BEGIN IMMEDIATE
            else:
                self._conn.cursor().execute("SET synchronous_commit TO off")
                self._conn.commit()
        conn, sql = self._conn, self.sql
        touched = sorted({c.key for op in ops for c, *_ in op.items})
        new = [k for k in touched if k not in self._known]
        cur = conn.cursor()
        try:
            sql.begin(cur)
            if new:
                sql.ensure(cur, new)
            rows = sql.read(cur, touched)
            before = {k: list(v) for k, v in rows.items()}
            for op in ops:
                if isinstance(op, _Settle):
                    for counter, reserved, used in op.items:
                        row = rows[counter.key]
                        row[0] += used
                        row[1] = max(0, row[1] - reserved)
            for op in ops:
                if isinstance(op, _Reserve):
                    op.result = _take(rows, op.items)
            sql.write(cur, {k: v for k, v in rows.items() if v != before[k]})
            conn.commit() if sql.dialect != "sqlite" else cur.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(Exception):
                conn.rollback() if sql.dialect != "sqlite" else cur.execute("ROLLBACK")
            raise
        finally:
            cur.close()
        if len(self._known) > 100_000:  # old windows' counters
            self._known.clear()
        self._known.update(new)


def _take(rows: dict[Key, list[int]], items: Taken) -> list[int] | Counter:
    """Reserve every counter of one request, or none: the new totals, or the first counter
    that would pass its cap."""
    for counter, amount in items:
        used, reserved = rows[counter.key]
        if used + reserved + amount > counter.cap:
            return counter
    totals = []
    for counter, amount in items:
        row = rows[counter.key]
        row[1] += amount
        totals.append(row[0] + row[1])
    return totals


def _resolve(future: asyncio.Future[list[int] | Counter], result: Any) -> None:
    if not future.done():
        future.set_result(result)


def _fail(future: asyncio.Future[list[int] | Counter], exc: Exception) -> None:
    if not future.done():
        future.set_exception(exc)
