"""``sql_query`` through a broker: the broker holds the database's location, opens it
read-only, lets only the configured statement classes through, and caps rows and time.

SQLite databases are opened with ``mode=ro`` and an authorizer that denies every action
but reading, so a write cannot happen even through a statement the class check missed
(``WITH ... INSERT``, ``ATTACH``, ``PRAGMA``).
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
import time
from pathlib import Path
from typing import Any

from sandbox.errors import QueryRefused

READ_ACTIONS = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION}
FIRST_WORD = re.compile(r"^\s*(?:--[^\n]*\n\s*|/\*.*?\*/\s*)*([A-Za-z]+)", re.S)
MAX_ROWS = 1000


def _authorizer(action: int, *_: Any) -> int:
    return sqlite3.SQLITE_OK if action in READ_ACTIONS else sqlite3.SQLITE_DENY


def _run(path: Path, sql: str, classes: tuple[str, ...], wall_s: float) -> dict[str, Any]:
    m = FIRST_WORD.match(sql)
    kind = m.group(1).lower() if m else ""
    if kind not in classes:
        raise QueryRefused(
            f"{kind or 'this'} statements are not allowed (allowed: {', '.join(classes)})"
        )
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1.0)
    try:
        conn.set_authorizer(_authorizer)
        deadline = time.monotonic() + wall_s
        conn.set_progress_handler(lambda: int(time.monotonic() > deadline), 10_000)
        try:
            cur = conn.execute(sql)
            rows = cur.fetchmany(MAX_ROWS + 1)
        except sqlite3.DatabaseError as exc:
            if "not authorized" in str(exc) or "readonly" in str(exc):
                raise QueryRefused(f"refused by the read-only broker: {exc}") from None
            raise
        columns = [d[0] for d in cur.description or ()]
        return {
            "columns": columns,
            "rows": [[_cell(v) for v in r] for r in rows[:MAX_ROWS]],
            "truncated": len(rows) > MAX_ROWS,
        }
    finally:
        conn.close()


def _cell(value: Any) -> Any:
    """BLOBs as SQL hex literals: results travel as JSON."""
    return f"x'{value.hex()}'" if isinstance(value, bytes) else value


async def query(path: Path, sql: str, classes: tuple[str, ...], wall_s: float) -> dict[str, Any]:
    return await asyncio.to_thread(_run, path, sql, classes, wall_s)
