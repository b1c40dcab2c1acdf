"""The usage ledger: one row per (tenant, key name, window, unit) with what is settled
(``used``) and what is held (``reserved``), and one lease row per replica holding part of
a counter (``usage_leases``: how much, until when).

Everything a replica holds in ``reserved`` is its lease on that counter: budget it took in
a block to admit from locally, and the reservations of its requests in flight. A replica
renews its leases while it holds them; one that dies stops renewing, and when a
reservation would be refused, its expired leases are taken back first.

A transaction of the ledger (``gateway.access.grants``) first takes the write lock on
every row it touches, then reads them with this replica's lease on each, decides in
memory, and writes them back:

* PostgreSQL: ``SELECT ... ORDER BY <key> FOR UPDATE OF w`` locks the rows in one order
  for every replica (so their transactions queue, never deadlock) and returns their latest
  committed values; a lease row is only written under its counter's lock;
* SQLite: ``BEGIN IMMEDIATE`` takes the database's write lock before the read.

Nobody can change a locked row between the read and the commit, so deciding in memory is
as atomic as a conditional UPDATE per counter. The statements are plain DBAPI calls on
prepared text: building SQLAlchemy expressions cost more CPU than the database's work here.
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass, field
from typing import Any, Literal

Unit = Literal["requests", "tokens"]
BUSY_S = 30.0  # how long SQLite's write lock is waited for
Key = tuple[str, str, str, str]  # tenant, key name, window, unit
COLUMNS = 'tenant_id, key_name, "window", unit'  # WINDOW is a keyword: quoted
W_COLUMNS = 'w.tenant_id, w.key_name, w."window", w.unit'
SAME_KEY = 'tenant_id = {m} AND key_name = {m} AND "window" = {m} AND unit = {m}'


@dataclass(frozen=True, slots=True)
class Counter:
    """One capped counter: a tenant's (``key_name`` '') or a key's, in one window."""

    tenant: str
    key_name: str
    window: str  # "2026-12-02T00:25" (minute), "2026-12-02" (day), "2026-12" (month)
    unit: Unit
    cap: int
    key: Key = field(init=False, repr=False, compare=False)  # the row's, built once

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", (self.tenant, self.key_name, self.window, self.unit))


@dataclass(slots=True)
class Row:
    """A counter as read under its lock, and this replica's lease on it (0: none)."""

    used: int
    reserved: int
    leased: int


class Statements:
    """The ledger's SQL for one DBAPI driver (its parameter style)."""

    def __init__(self, dialect: str) -> None:
        self.dialect = dialect
        self.mark = m = "%s" if dialect == "postgresql" else "?"
        key = SAME_KEY.format(m=m)
        self.insert = (
            f"INSERT INTO usage_windows ({COLUMNS}, used, reserved) "
            f"VALUES ({m}, {m}, {m}, {m}, 0, 0) ON CONFLICT DO NOTHING"
        )
        self.update = f"UPDATE usage_windows SET used = {m}, reserved = {m} WHERE {key}"
        self.drop_lease = f"DELETE FROM usage_leases WHERE {key} AND holder = {m}"
        self.reclaim = (
            f"DELETE FROM usage_leases WHERE {key} AND holder <> {m} AND expires_ms < {m} "
            "RETURNING amount"
        )
        self._selects: dict[int, str] = {}
        self._leases: dict[int, str] = {}

    def begin(self, cur: Any) -> None:
        """Start the transaction. SQLite: take the write lock, polling every millisecond
        while another connection (the recorder's writer) holds it. SQLite's own busy
        handler backs off to 100 ms sleeps, which under load cost more than the lock is
        held; the ledger's connection therefore has ``busy_timeout=0``."""
        if self.dialect != "sqlite":  # psycopg begins on the first statement
            return
        deadline = time.monotonic() + BUSY_S
        while True:
            try:
                cur.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.001)

    def ensure(self, cur: Any, keys: list[Key]) -> None:
        """Create the rows not there yet (a no-op for existing ones)."""
        cur.executemany(self.insert, keys)

    def read(self, cur: Any, keys: list[Key], holder: str) -> dict[Key, Row]:
        """Each row, with ``holder``'s lease on it, locked until the transaction ends."""
        sql = self._selects.get(len(keys))
        if sql is None:
            m = self.mark
            rows = ", ".join([f"({m}, {m}, {m}, {m})"] * len(keys))
            lock = " FOR UPDATE OF w" if self.dialect == "postgresql" else ""
            sql = self._selects[len(keys)] = (
                f"SELECT {W_COLUMNS}, w.used, w.reserved, l.amount FROM usage_windows AS w "
                "LEFT JOIN usage_leases AS l ON l.tenant_id = w.tenant_id "
                'AND l.key_name = w.key_name AND l."window" = w."window" AND l.unit = w.unit '
                f"AND l.holder = {m} WHERE ({W_COLUMNS}) IN ({rows}) ORDER BY {W_COLUMNS}{lock}"
            )
        cur.execute(sql, [holder, *[part for key in keys for part in key]])
        return {
            (t, k, w, u): Row(int(used), int(reserved), int(leased or 0))
            for t, k, w, u, used, reserved, leased in cur
        }

    def take_back(self, cur: Any, key: Key, holder: str, now_ms: int) -> int:
        """Delete other holders' leases on ``key`` that ended before ``now_ms``; what they
        held (to leave ``reserved``)."""
        cur.execute(self.reclaim, [*key, holder, now_ms])
        return sum(int(amount) for (amount,) in cur.fetchall())

    def write(self, cur: Any, rows: dict[Key, Row]) -> None:
        if not rows:
            return
        if self.dialect != "postgresql":  # SQLite's executemany is a loop in C, no round trips
            cur.executemany(self.update, [(r.used, r.reserved, *key) for key, r in rows.items()])
            return
        # one statement, one round trip (psycopg's executemany costs a pipeline's)
        values = ", ".join(["(%s, %s, %s, %s, %s::bigint, %s::bigint)"] * len(rows))
        cur.execute(
            f"UPDATE usage_windows AS u SET used = v.used, reserved = v.reserved "
            f"FROM (VALUES {values}) AS v(tenant_id, key_name, win, unit, used, reserved) "
            'WHERE u.tenant_id = v.tenant_id AND u.key_name = v.key_name AND u."window" = v.win '
            "AND u.unit = v.unit",
            [part for key, r in rows.items() for part in (*key, r.used, r.reserved)],
        )

    def lease(self, cur: Any, leases: dict[Key, int], holder: str, expires_ms: int) -> None:
        """Set ``holder``'s leases: an amount, until ``expires_ms``; an amount 0 deletes."""
        gone = [(*key, holder) for key, amount in leases.items() if amount == 0]
        kept = [(*key, holder, amount, expires_ms) for key, amount in leases.items() if amount]
        if gone:
            cur.executemany(self.drop_lease, gone)
        if not kept:
            return
        sql = self._leases.get(len(kept))
        if sql is None:
            m = self.mark
            values = ", ".join([f"({m}, {m}, {m}, {m}, {m}, {m}, {m})"] * len(kept))
            sql = self._leases[len(kept)] = (
                f"INSERT INTO usage_leases ({COLUMNS}, holder, amount, expires_ms) "
                f"VALUES {values} ON CONFLICT ({COLUMNS}, holder) DO UPDATE SET "
                "amount = excluded.amount, expires_ms = excluded.expires_ms"
            )
        cur.execute(sql, [part for row in kept for part in row])
