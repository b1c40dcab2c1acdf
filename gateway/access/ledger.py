"""The usage ledger's client: reservations from this replica's shares
(``gateway.access.shares``), and the thread that batches what they do not cover into one
store transaction per turn (``gateway.access.grants``).

A reservation its shares cover is taken under a lock, in the event loop: no store call;
a take that leaves a share running low (half a block left, far from the cap) also queues a
refill, so that the thread tops the share up before a request has to wait for it; a refill
asks for blocks as big as the rate the share is spent at needs (``Share.rescale``). A
reservation they do not cover is queued for the ledger's thread, which owns a connection to
the store. Each turn it takes everything queued (every request that missed while the last
transaction ran), adds the flush that is due, and applies it all in one transaction.
Without misses, a flush runs every ``flush_s``; it also renews the leases (``lease_s``): a
replica that dies holding a lease under-admits only until the lease ends, when a
reservation that would be refused takes it back.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

from gateway.access.grants import LedgerStore, Outcome, Reserve, Result, Taken, Turn
from gateway.access.shares import Moves, Share, plan_flush, running_low
from gateway.errors import StoreUnavailable
from gateway.store.ledger import Counter, Key

log = logging.getLogger(__name__)
MAX_BATCH = 1024
LEASE_S = 30.0  # how long a lease outlives its replica's last transaction
FLUSH_S = 0.5  # how often settled usage is written to the store
TICK_S = 0.1  # how often the thread looks for a flush, a return or a renewal to do

__all__ = ["FLUSH_S", "LEASE_S", "Ledger", "Result", "Taken"]


@dataclass(slots=True)
class _Refill:
    """Shares that a take left running low: each counter and the reservation that took."""

    items: Taken


_STOP = object()
_NUDGE = object()


class Ledger:
    def __init__(self, url: str, *, lease_s: float = LEASE_S, flush_s: float = FLUSH_S) -> None:
        self.store = LedgerStore(url, lease_s)
        self.lease_s, self.flush_s = lease_s, flush_s
        self._shares: dict[Key, Share] = {}
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._flushed = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="gearshift-ledger", daemon=True)
        self._thread.start()

    @property
    def transactions(self) -> int:
        """Store transactions committed so far."""
        return self.store.transactions

    def take(self, items: Taken) -> list[int] | None:
        """Reserve from this replica's shares alone: each counter's new total as far as
        this replica knows, or None if a share falls short (then nothing is taken)."""
        now = time.monotonic()
        shares = self._shares
        low: Taken | None = None
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
                if not s.exact and not s.refilling and running_low(s.free, amount * s.scale):
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
        op = Reserve(items, loop.create_future(), loop)
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
        self.store.engine.dispose()

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
            ops = [op for op in batch if isinstance(op, Reserve)]
            refills = [i for op in batch if isinstance(op, _Refill) for i in op.items]
            try:
                self._apply(ops, refills, stop)
            except Exception as exc:  # a bug: fail these requests, keep the thread
                log.exception("usage ledger: %d reservations failed", len(ops))
                for op in ops:
                    op.loop.call_soon_threadsafe(_fail, op.future, StoreUnavailable(str(exc)))
            if stop:
                self.store.reset()
                return

    def _plan(self, ops: list[Reserve], closing: bool) -> tuple[dict[Key, Moves], dict[Key, int]]:
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
                elif s is not None and running_low(s.free, amount * s.scale):
                    # refilled in the same transaction
                    op.low.append((counter, amount * s.rescale(now)))
        return moves, base

    def _apply(self, ops: list[Reserve], refills: Taken, closing: bool) -> None:
        with self._lock:
            moves, base = self._plan(ops, closing)
            # closing gives every free part back: no refill then
            covered = {c.key for op in ops for c, _ in op.low}  # topped up with their op
            wanted = [] if closing else self._wanted(refills, covered)
        turn = Turn([op for op in ops if op.need], wanted, moves, base)
        outcome, error = None, None
        if turn.ops or wanted or moves:
            outcome, error = self.store.run(turn, self._shares)
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

    def _wanted(self, refills: Taken, covered: set[Key]) -> Taken:
        """Under the lock: the refills to ask for, each sized to its share's rate, of the
        shares a take left low that still are (a miss's transaction may have topped them
        up since) and are still leased."""
        now, out = time.monotonic(), []
        for counter, amount in refills:
            s = self._shares.get(counter.key)
            low = s is not None and s.leased and running_low(s.free, amount * s.scale)
            if low and s is not None and counter.key not in covered:
                out.append((counter, amount * s.rescale(now)))
        return out

    def _commit(self, outcome: Outcome) -> None:
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


def _resolve(future: asyncio.Future[Result], result: Any) -> None:
    if not future.done():
        future.set_result(result)


def _fail(future: asyncio.Future[Result], exc: Exception) -> None:
    if not future.done():
        future.set_exception(exc)
