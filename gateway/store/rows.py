"""Row helpers shared by the recorder's writer and the store's queries."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.dialects import postgresql, sqlite

from sandbox.protocol import scoped_id


def now_utc(ts: float | None = None) -> datetime:
    return datetime.fromtimestamp(time.time() if ts is None else ts, UTC)


def session_key(tenant: str, external: str) -> str:
    """The session id for a client-named session: stable, and distinct per tenant. It is
    also the name of the session's sandbox workspace (``sandbox.protocol.scoped_id``)."""
    return scoped_id(tenant, external)


def insert_ignore(conn: Connection, table: Any, rows: list[dict[str, Any]]) -> None:
    """INSERT ... ON CONFLICT DO NOTHING on both dialects."""
    if not rows:
        return
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    conn.execute(dialect.insert(table).on_conflict_do_nothing(), rows)
