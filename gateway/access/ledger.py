"""The usage ledger's client: reservations from this replica's shares, and the store
transactions that grant, flush and return them (``gateway.access.shares``).

A reservation its shares cover is taken under a lock, in the event loop: no store call;
a take that leaves a share running low (half a block left, far from the cap) also queues a
refill, so that the thread tops the share up before a request has to wait for it. One that
they do not cover is queued for the ledger's thread, which owns a connection to
the store. Each turn it takes everything queued (every request that missed while the last
transaction ran), adds the flush that is due, and applies it all in one transaction
(``gateway.store.ledger``): lock and read the rows with this replica's leases on them,
write spent usage to ``used``, give back idle free parts, then admit each reservation whole
or refuse it whole (a block more than it needs while far from the cap), write the rows and
leases back, commit once. Without misses, a flush runs every ``flush_s``; it also renews the
leases (``lease_s``): a replica that dies holding a lease under-admits only until the lease
ends, when a reservation that would be refused takes it back.

On SQLite the ledger's connection commits with ``synchronous=NORMAL`` (WAL): atomic and
consistent across processes, without an fsync per transaction; a power cut may lose the
last transactions' counts, never corrupt them; on PostgreSQL it commits with
``synchronous_commit=off``, the same trade. A transaction that fails (a lost connection, a
lock timeout) is retried on a fresh connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy.pool import NullPool

from gateway.access.shares import BLOCK_REQUESTS, Moves, Share, grant, plan_flush
from gateway.errors import StoreUnavailable
from gateway.store.database import make_engine
from gateway.store.ledger import Counter, Key, Row, Statements

log = logging.getLogger(__name__)
MAX_BATCH = 1024
ATTEMPTS = 5
LEASE_S = 30.0  # how long a lease outlives its replica's last transaction
FLUSH_S = 0.5  # how often settled usage is written to the store
TICK_S = 0.1  # how often the thread looks for a flush, a return or a renewal to do
Taken = list[tuple[Counter, int]]  # counters and the amount each reserves
Result = list[int] | Counter  # each counter's new total, or the counter that refused


@dataclass(slots=True)
class _Reserve:
    items: Taken
    future: asyncio.Future[Result]
    loop: asyncio.AbstractEventLoop
    local: list[tuple[Key, int]] = field(default_factory=list)  # taken from free, to undo
    need: list[tuple[Counter, int]] = field(default_factory=list)  # from the store
    low: list[tuple[Counter, int]] = field(default_factory=list)  # covered, but running out
    result: Result | None = None


@dataclass(slots=True)
class _Refill:
    """Shares that a take left running low: each counter and the reservation that took."""

    items: list[tuple[Counter, int]]


@dataclass(slots=True)
class _Outcome:
    """A transaction's effect on the shares, applied once it committed."""

    rows: dict[Key, Row]
    held: dict[Key, int] = field(default_factory=dict)
    free: dict[Key, int] = field(default_factory=dict)
    exact: dict[Key, bool] = field(default_factory=dict)


_STOP = object()
_NUDGE = object()


def _relaxed(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA busy_timeout=0")  # gateway.store.ledger waits for the lock itself
    cur.close()


class Ledger:
    def __init__(self, url: str, *, lease_s: float = LEASE_S, flush_s: float = FLUSH_S) -> None:
        self.engine: Engine = make_engine(url, poolclass=NullPool)
        if self.engine.dialect.name == "sqlite":
            event.listen(self.engine, "connect", _relaxed)  # after make_engine's pragmas
        self.sql = Statements(self.engine.dialect.name)
        self.lease_s, self.flush_s = lease_s, flush_s
        self.holder = f"{socket.gethostname()[:30]}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
        self._shares: dict[Key, Share] = {}
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._known: set[Key] = set()  # rows this process has created or seen
        self._conn: Any = None  # the thread's DBAPI connection (SQLAlchemy's proxy of it)
        self._driver_error: type[Exception] = self.engine.dialect.loaded_dbapi.Error
        self._flushed = time.monotonic()
        self.transactions = 0  # committed: what the allotments save shows here
        self._thread = threading.Thread(target=self._run, name="gearshift-ledger", daemon=True)
        self._thread.start()

    def take(self, items: Taken) -> list[int] | None:
        """Reserve from this replica's shares alone: each counter's new total as far as
        this replica knows, or None if a share falls short (then nothing is taken)."""
        now = time.monotonic()
        shares = self._shares
        low: list[tuple[Counter, int]] | None = None
        with self._lock:
            found = []
            for counter, amount in items:
                s = shares.get(counter.key)
                if s is None or s.free < amount or now > s.usable_until:
                    return None
                found.append(s)
            totals = []
            for s, item in zip(found, items, strict=True):
                amount = item[1]
                s.free -= amount
                s.held += amount
                s.last = now
                totals.append(s.seen - s.free)  # Share.total(), inlined: the hot path
                if s.free < amount * BLOCK_REQUESTS // 2 and not s.exact and not s.refilling:
                    s.refilling = True
                    low = [item] if low is None else [*low, item]
        if low is not None:
            self._queue.put(_Refill(low))
        return totals

    async def reserve(self, items: Taken) -> Result:
        """Each counter's new total, or the first counter that would pass its cap (then
        none is taken)."""
        taken = self.take(items)
        if taken is not None:
            return taken
        loop = asyncio.get_running_loop()
        op = _Reserve(items, loop.create_future(), loop)
        self._queue.put(op)
        try:
            return await asyncio.shield(op.future)
        except asyncio.CancelledError:  # the client left: give back what the batch takes
            op.future.add_done_callback(lambda f: self._give_back(items, f))
            raise

    def settle(self, items: list[tuple[Counter, int, int]]) -> None:
        """Charge what admitted requests used (``(counter, reserved, used)``); written to
        the store by the next flush, at once near a cap."""
        nudge = False
        with self._lock:
            for counter, reserved, used in items:
                s = self._shares.get(counter.key)
                if s is None:  # its lease was given up (cannot be while it is held)
                    s = self._shares[counter.key] = Share()
                s.held -= reserved
                s.free += reserved - used
                s.spent += used
                nudge = nudge or s.exact or s.free < 0
        if nudge:
            self._queue.put(_NUDGE)

    def _give_back(self, items: Taken, done: asyncio.Future[Result]) -> None:
        if not done.cancelled() and done.exception() is None and isinstance(done.result(), list):
            self.settle([(c, n, 0) for c, n in items])

    def close(self) -> None:
        """Write what was spent, give back every free part (what requests in flight hold
        stays leased until the lease ends)."""
        self._queue.put(_STOP)
        self._thread.join(10)
        self.engine.dispose()

    def _run(self) -> None:
        while True:
            try:
                batch = [self._queue.get(timeout=TICK_S)]
            except queue.Empty:
                batch = [_NUDGE]
            while len(batch) < MAX_BATCH:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stop = any(op is _STOP for op in batch)
            ops = [op for op in batch if isinstance(op, _Reserve)]
            refills = [i for op in batch if isinstance(op, _Refill) for i in op.items]
            try:
                self._apply(ops, refills, stop)
            except Exception as exc:  # a bug: fail these requests, keep the thread
                log.exception("usage ledger: %d reservations failed", len(ops))
                for op in ops:
                    op.loop.call_soon_threadsafe(_fail, op.future, StoreUnavailable(str(exc)))
            if stop:
                if self._conn is not None:
                    self._conn.close()
                return

    def _plan(self, ops: list[_Reserve], closing: bool) -> tuple[dict[Key, Moves], dict[Key, int]]:
        """Under the lock: take what the shares cover of each reservation, the flush that
        is due; and each touched share's lease before (what the store should hold)."""
        now = time.monotonic()
        due = closing or now - self._flushed >= self.flush_s
        if due:
            self._flushed = now
        shares = self._shares
        base = {key: s.leased for key, s in shares.items()}
        moves = plan_flush(shares, now, due, closing)
        for op in ops:
            for counter, amount in op.items:
                s = shares.get(counter.key)
                part = min(amount, s.free) if s is not None and now <= s.usable_until else 0
                if part > 0 and s is not None:
                    s.free -= part
                    s.held += part
                    op.local.append((counter.key, part))
                if part < amount:
                    op.need.append((counter, amount - part))
                elif s is not None and s.free < amount * BLOCK_REQUESTS // 2:
                    op.low.append((counter, amount))  # refilled in the same transaction
        return moves, base

    def _apply(
        self, ops: list[_Reserve], refills: list[tuple[Counter, int]], closing: bool
    ) -> None:
        with self._lock:
            moves, base = self._plan(ops, closing)
            # closing gives every free part back: no refill then
            wanted = [] if closing else [(c, n) for c, n in refills if self._running_low(c.key, n)]
        asking = [op for op in ops if op.need]
        error: Exception | None = None
        outcome = None
        if asking or wanted or moves:
            for attempt in range(ATTEMPTS):
                try:
                    outcome = self._transaction(asking, wanted, moves, base)
                    error = None
                    break
                except self._driver_error as exc:  # a lost connection, a lock timeout
                    error = exc
                    self._reset()
                    time.sleep(0.01 * 2**attempt)
        with self._lock:
            for counter, _ in refills:  # done, or failed: a later take may ask again
                s = self._shares.get(counter.key)
                if s is not None:
                    s.refilling = False
            if outcome is not None:
                self._commit(outcome)
            else:
                for key, m in moves.items():  # nothing was written: it is all still here
                    self._shares[key].free += m.returned
                    self._shares[key].spent += m.spent
            for op in ops:
                if error is not None or isinstance(op.result, Counter):
                    for key, part in op.local:
                        self._shares[key].free += part
                        self._shares[key].held -= part
                elif not op.need:
                    op.result = [self._shares[c.key].total() for c, _ in op.items]
        for op in ops:
            if error is not None:
                failed = StoreUnavailable(f"the usage ledger is unreachable: {error}")
                op.loop.call_soon_threadsafe(_fail, op.future, failed)
            else:
                op.loop.call_soon_threadsafe(_resolve, op.future, op.result)
        if error is not None:
            log.error("usage ledger: %d reservations failed: %s", len(ops), error)

    def _running_low(self, key: Key, amount: int) -> bool:
        """Whether a share a take left low still is (a miss's transaction may have topped
        it up since) and still leased."""
        s = self._shares.get(key)
        return s is not None and s.free < amount * BLOCK_REQUESTS // 2 and bool(s.leased)

    def _commit(self, outcome: _Outcome) -> None:
        now = time.monotonic()
        for key, row in outcome.rows.items():
            s = self._shares.get(key)
            if s is None:
                s = self._shares[key] = Share(last=now)
            s.held += outcome.held.get(key, 0)
            s.free += outcome.free.get(key, 0)
            s.exact = outcome.exact.get(key, s.exact)
            s.seen = row.used + row.reserved
            s.usable_until, s.renew_at = now + self.lease_s / 2, now + self.lease_s / 4
            if not s.leased:
                del self._shares[key]

    def _reset(self) -> None:
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

    def _transaction(
        self,
        ops: list[_Reserve],
        refills: list[tuple[Counter, int]],
        moves: dict[Key, Moves],
        base: dict[Key, int],
    ) -> _Outcome:
        conn, sql = self._connection(), self.sql
        asked = {c.key for op in ops for c, _ in (*op.need, *op.low)}
        asked.update(c.key for c, _ in refills)
        touched = sorted(asked | set(moves))
        new = [k for k in touched if k not in self._known]
        now_ms = int(time.time() * 1000)
        cur = conn.cursor()
        try:
            sql.begin(cur)
            if new:
                sql.ensure(cur, new)
            rows = sql.read(cur, touched, self.holder)
            before = {k: (r.used, r.reserved) for k, r in rows.items()}
            out = _Outcome(rows)
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
                op.result = self._decide(cur, op, rows, spare, out, now_ms)
            _top_up(refills, rows, spare, out)
            leases = {}
            for key, row in rows.items():
                row.reserved = max(0, row.reserved)
                leases[key] = base.get(key, 0) - _moved(moves.get(key)) + out.held.get(key, 0)
                leases[key] += out.free.get(key, 0)
            sql.write(cur, {k: r for k, r in rows.items() if (r.used, r.reserved) != before[k]})
            sql.lease(cur, leases, self.holder, now_ms + int(self.lease_s * 1000))
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
        self.transactions += 1
        return out

    def _decide(
        self,
        cur: Any,
        op: _Reserve,
        rows: dict[Key, Row],
        spare: dict[Key, int],
        out: _Outcome,
        now_ms: int,
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
            s, read = self._shares.get(counter.key), rows.get(counter.key)  # for warnings)
            if read is None:  # all of it taken from the share
                totals.append(s.total() if s is not None else 0)
                continue
            free = spare.get(counter.key, 0) + (max(0, s.free) if s is not None else 0)
            totals.append(read.used + read.reserved - free)
        return totals


def _top_up(
    low: list[tuple[Counter, int]], rows: dict[Key, Row], spare: dict[Key, int], out: _Outcome
) -> None:
    """A block more for each share running low (``grant``: none near the cap), unless this
    transaction already gave it one."""
    for counter, amount in low:
        key, row = counter.key, rows[counter.key]
        more = grant(counter.cap, counter.cap - row.used - row.reserved, amount) - amount
        if more > 0 and spare.get(key, 0) < amount * BLOCK_REQUESTS // 2:
            row.reserved += more
            spare[key] = spare.get(key, 0) + more
            out.free[key] = out.free.get(key, 0) + more


def _moved(m: Moves | None) -> int:
    return 0 if m is None else m.spent + m.returned


def _resolve(future: asyncio.Future[Result], result: Any) -> None:
    if not future.done():
        future.set_result(result)


def _fail(future: asyncio.Future[Result], exc: Exception) -> None:
    if not future.done():
        future.set_exception(exc)
