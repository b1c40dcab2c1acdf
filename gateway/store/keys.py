"""API keys and limits in the store: the writes behind ``gearshift keys`` and ``/admin/v1``,
and the reads every replica's cache makes (``gateway.access.keys``).

Only a key's SHA-256 digest is stored; the key itself is returned once, by ``create`` and
``rotate``. Every write bumps the single ``access_changes`` counter in the same
transaction, so a replica that polls it sees a change together with its rows.
"""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, delete, insert, select, update

from gateway.auth import new_key
from gateway.store.queries import NotFound
from gateway.store.rows import insert_ignore, now_utc
from gateway.store.schema import access_changes, api_keys, limits, tenants, usage_windows

NAME = r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$"  # tenants and key names
LIMIT_FIELDS = ("requests_per_minute", "tokens_per_minute", "tokens_per_day", "tokens_per_month")


class KeyExists(Exception):
    """A live key of this name already exists in the tenant (rotate it instead)."""


class BadName(ValueError):
    """A tenant or key name outside ``NAME``."""


def _check(**names: str) -> None:
    for what, value in names.items():
        if not re.match(NAME, value):
            raise BadName(f"{what} {value!r} must be 1-128 letters, digits or ._:@- (not first)")


def version(conn: Connection) -> int:
    return int(conn.execute(select(access_changes.c.version)).scalar_one())


def _changed(conn: Connection) -> None:
    conn.execute(update(access_changes).values(version=access_changes.c.version + 1))


def _seconds(value: datetime) -> float:
    aware = value if value.tzinfo is not None else value.replace(tzinfo=UTC)  # SQLite drops it
    return aware.timestamp()


def _epoch(value: datetime | None) -> int | None:
    return None if value is None else int(_seconds(value))


def key_view(row: Any) -> dict[str, Any]:
    """A key as the admin API and the CLI show it: never its digest."""
    return {
        "id": row.id, "object": "api_key", "tenant": row.tenant_id, "name": row.name,
        "prefix": row.prefix, "admin": row.admin, "models": row.models, "tools": row.tools,
        "created_at": _epoch(row.created_at), "expires_at": _epoch(row.expires_at),
        "revoked_at": _epoch(row.revoked_at), "rotated_to": row.rotated_to,
    }  # fmt: skip


def _live(now: datetime) -> Any:
    c = api_keys.c
    return c.revoked_at.is_(None) & (c.expires_at.is_(None) | (c.expires_at > now))


def get(conn: Connection, key_id: str) -> Any:
    row = conn.execute(select(api_keys).where(api_keys.c.id == key_id)).first()
    if row is None:
        raise NotFound(f"no API key {key_id!r}")
    return row


def create(
    conn: Connection,
    tenant: str,
    name: str,
    *,
    admin: bool = False,
    models: list[str] | None = None,
    tools: list[str] | None = None,
    expires_at: datetime | None = None,
) -> tuple[dict[str, Any], str]:
    """A new key: its view and the key itself (shown once)."""
    _check(tenant=tenant, name=name)
    now = now_utc()
    taken = select(api_keys.c.id).where(
        api_keys.c.tenant_id == tenant, api_keys.c.name == name, _live(now)
    )
    if conn.execute(taken).first() is not None:
        raise KeyExists(f"tenant {tenant!r} already has a live key named {name!r}; rotate it")
    return _insert(conn, tenant, name, admin, models, tools, expires_at, now)


def _insert(
    conn: Connection,
    tenant: str,
    name: str,
    admin: bool,
    models: list[str] | None,
    tools: list[str] | None,
    expires_at: datetime | None,
    now: datetime,
) -> tuple[dict[str, Any], str]:
    insert_ignore(conn, tenants, [{"id": tenant, "created_at": now}])
    key, digest = new_key()
    key_id = "key_" + uuid.uuid4().hex[:24]
    conn.execute(
        insert(api_keys).values(
            id=key_id, tenant_id=tenant, name=name, sha256=digest, prefix=key[:10], admin=admin,
            models=models, tools=tools, created_at=now, expires_at=expires_at,
        )
    )  # fmt: skip
    _changed(conn)
    return key_view(get(conn, key_id)), key


def list_keys(conn: Connection, tenant: str | None = None, *, all_: bool = False) -> list[Any]:
    """Views of the live keys (``all_``: revoked and expired ones too), oldest first."""
    query = select(api_keys).order_by(api_keys.c.created_at, api_keys.c.id)
    if tenant is not None:
        query = query.where(api_keys.c.tenant_id == tenant)
    if not all_:
        query = query.where(_live(now_utc()))
    return [key_view(r) for r in conn.execute(query)]


def revoke(conn: Connection, key_id: str) -> dict[str, Any]:
    row = get(conn, key_id)
    if row.revoked_at is None:
        conn.execute(update(api_keys).where(api_keys.c.id == key_id).values(revoked_at=now_utc()))
        _changed(conn)
    return key_view(get(conn, key_id))


def expire(conn: Connection, key_id: str, at: datetime | None) -> dict[str, Any]:
    """Set (or with None, clear) when a key stops working."""
    get(conn, key_id)
    conn.execute(update(api_keys).where(api_keys.c.id == key_id).values(expires_at=at))
    _changed(conn)
    return key_view(get(conn, key_id))


def rotate(conn: Connection, key_id: str, grace_s: float) -> tuple[dict[str, Any], str]:
    """A new key with the old one's tenant, name and scopes (so its limits and budgets go
    on); the old one works ``grace_s`` longer (0: revoked now)."""
    old = get(conn, key_id)
    now = now_utc()
    ends = old.expires_at
    if old.revoked_at is not None or (ends is not None and _seconds(ends) <= now.timestamp()):
        raise NotFound(f"API key {key_id!r} is revoked or expired; create a new one")
    view, key = _insert(
        conn, old.tenant_id, old.name, old.admin, old.models, old.tools, old.expires_at, now
    )
    values: dict[str, Any] = {"rotated_to": view["id"]}
    if grace_s <= 0:
        values["revoked_at"] = now
    else:
        until = now + timedelta(seconds=grace_s)
        values["expires_at"] = until if ends is None or _seconds(ends) > until.timestamp() else ends
    conn.execute(update(api_keys).where(api_keys.c.id == key_id).values(**values))
    return view, key


def live_keys(conn: Connection) -> list[Any]:
    """Every key that may still authenticate, digest included (for the replicas' cache)."""
    return list(conn.execute(select(api_keys).where(_live(now_utc()))))


def set_limits(
    conn: Connection, tenant: str, key_name: str, values: dict[str, int | None], soft_percent: int
) -> dict[str, Any]:
    """Replace the limits of a tenant (``key_name`` '') or of one key name in it."""
    _check(tenant=tenant, **({"key name": key_name} if key_name else {}))
    insert_ignore(conn, tenants, [{"id": tenant, "created_at": now_utc()}])
    where = (limits.c.tenant_id == tenant) & (limits.c.key_name == key_name)
    conn.execute(delete(limits).where(where))
    row = {f: values.get(f) for f in LIMIT_FIELDS}
    conn.execute(
        insert(limits).values(tenant_id=tenant, key_name=key_name, soft_percent=soft_percent, **row)
    )
    _changed(conn)
    return limit_view(conn.execute(select(limits).where(where)).one())


def delete_limits(conn: Connection, tenant: str, key_name: str) -> dict[str, Any]:
    where = (limits.c.tenant_id == tenant) & (limits.c.key_name == key_name)
    if conn.execute(delete(limits).where(where)).rowcount == 0:
        raise NotFound(f"no limits for tenant {tenant!r}, key {key_name!r}")
    _changed(conn)
    return {"tenant": tenant, "key_name": key_name, "deleted": True}


def limit_view(row: Any) -> dict[str, Any]:
    out = {"object": "limits", "tenant": row.tenant_id, "key_name": row.key_name or None}
    return out | {f: getattr(row, f) for f in LIMIT_FIELDS} | {"soft_percent": row.soft_percent}


def list_limits(conn: Connection, tenant: str | None = None) -> list[Any]:
    query = select(limits).order_by(limits.c.tenant_id, limits.c.key_name)
    if tenant is not None:
        query = query.where(limits.c.tenant_id == tenant)
    return list(conn.execute(query))


def usage(conn: Connection, tenant: str, windows: list[str]) -> list[dict[str, Any]]:
    """The tenant's counters in the given windows (``gateway.access.windows``)."""
    query = (
        select(usage_windows)
        .where(usage_windows.c.tenant_id == tenant, usage_windows.c.window.in_(windows))
        .order_by(usage_windows.c.key_name, usage_windows.c.window, usage_windows.c.unit)
    )
    return [
        {"key_name": r.key_name or None, "window": r.window, "unit": r.unit, "used": r.used,
         "reserved": r.reserved}
        for r in conn.execute(query)
    ]  # fmt: skip
