"""The usage ledger: one row per (tenant, key name, window, unit) with what is settled
(``used``) and what admitted requests still hold (``reserved``).

A batch of reservations and settlements (``gateway.access.ledger``) is one transaction
that first takes the write lock on every row it touches, then reads them, decides in
memory, and writes them back:

* PostgreSQL: ``SELECT ... ORDER BY <key> FOR UPDATE`` locks the rows in one order for
  every replica (so their batches queue, never deadlock) and returns their latest
  committed values;
* SQLite: ``BEGIN IMMEDIATE`` takes the database's write lock before the read.

Nobody can change a locked row between the read and the commit, so deciding in memory is
as atomic as a conditional UPDATE per counter, at two statements per batch instead of two
per counter. The statements are plain DBAPI calls on prepared text: building SQLAlchemy
expressions cost more CPU than the database's work here.
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from typing import Any, Literal

Unit = Literal["requests", "tokens"]
BUSY_S = 30.0  # how long SQLite's write lock is waited for
Key = tuple[str, str, str, str]  # tenant, key name, window, unit
COLUMNS = 'tenant_id, key_name, "window", unit'  # WINDOW is a keyword: quoted


@dataclass(frozen=True, slots=True)
class Counter:
    """One capped counter: a tenant's (``key_name`` '') or a key's, in one window."""

    tenant: str
    key_name: str
    window: str  # "2026-12-02T00:25" (minute), "2026-12-02" (day), "2026-12" (month)
    unit: Unit
    cap: int

    @property
    def key(self) -> Key:
        return (self.tenant, self.key_name, self.window, self.unit)


class Statements:
    """The ledger's SQL for one DBAPI driver (its parameter style)."""

    def __init__(self, dialect: str) -> None:
        self.dialect = dialect
        self.mark = "%s" if dialect == "postgresql" else "?"
        m = self.mark
        self.insert = (
            f"INSERT INTO usage_windows ({COLUMNS}, used, reserved) "
            f"VALUES ({m}, {m}, {m}, {m}, 0, 0) ON CONFLICT DO NOTHING"
        )
        self.update = (
            f"UPDATE usage_windows SET used = {m}, reserved = {m} "
            f'WHERE tenant_id = {m} AND key_name = {m} AND "window" = {m} AND unit = {m}'
        )
        self._selects: dict[int, str] = {}

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

    def read(self, cur: Any, keys: list[Key]) -> dict[Key, list[int]]:
        """``[used, reserved]`` of each row, locked until the transaction ends."""
        sql = self._selects.get(len(keys))
        if sql is None:
            rows = ", ".join([f"({self.mark}, {self.mark}, {self.mark}, {self.mark})"] * len(keys))
            lock = " FOR UPDATE" if self.dialect == "postgresql" else ""
            sql = self._selects[len(keys)] = (
                f"SELECT {COLUMNS}, used, reserved FROM usage_windows "
                f"WHERE ({COLUMNS}) IN ({rows}) ORDER BY {COLUMNS}{lock}"
            )
        cur.execute(sql, [part for key in keys for part in key])
        return {(t, k, w, u): [int(used), int(reserved)] for t, k, w, u, used, reserved in cur}

    def write(self, cur: Any, rows: dict[Key, list[int]]) -> None:
        if not rows:
            return
        if self.dialect != "postgresql":  # SQLite's executemany is a loop in C, no round trips
            cur.executemany(
                self.update, [(used, reserved, *key) for key, (used, reserved) in rows.items()]
            )
            return
        # one statement, one round trip (psycopg's executemany costs a pipeline's)
        values = ", ".join(["(%s, %s, %s, %s, %s::bigint, %s::bigint)"] * len(rows))
        cur.execute(
            f"UPDATE usage_windows AS u SET used = v.used, reserved = v.reserved "
            f"FROM (VALUES {values}) AS v(tenant_id, key_name, win, unit, used, reserved) "
            'WHERE u.tenant_id = v.tenant_id AND u.key_name = v.key_name AND u."window" = v.win '
            "AND u.unit = v.unit",
            [part for key, (used, reserved) in rows.items() for part in (*key, used, reserved)],
        )
