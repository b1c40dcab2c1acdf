"""Each replica's copy of the store's keys and limits, and the store calls of the admin API.

Authenticating never touches the store: keys and limits are held in memory
(``Authenticator``, ``Admission.limits``). Every ``auth.refresh_s`` (0.5 s by default) a
task reads the one-row change counter that every key or limit write bumps; when it moved,
it reloads the live keys and all limits (small tables) and swaps them in. A revoked key
is therefore refused by every replica within ``refresh_s`` plus one reload, at the cost of
one primary-key read per replica per interval, on the replica's store thread
(``gateway.store.worker``). Expiry needs no reload: each cached key carries its expiry
time. If the store is unreachable the last copy stays in force (and a warning is logged)
until it is back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC
from typing import Any, TypeVar

from sqlalchemy import Connection

from gateway.access.admission import Admission, Limits
from gateway.access.ledger import Ledger
from gateway.auth import Authenticator, Principal
from gateway.config import Settings
from gateway.store import keys
from gateway.store.worker import StoreWorker

T = TypeVar("T")


class AccessSync:
    def __init__(
        self, settings: Settings, auth: Authenticator, admission: Admission, worker: StoreWorker
    ) -> None:
        self.url = settings.store.url
        self.refresh_s = settings.auth.refresh_s
        self.limits = settings.limits
        self.auth, self.admission, self.worker = auth, admission, worker
        self.version = -1
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """After the store's schema is ready (the recorder migrates it) and the worker is
        open."""
        self.admission.ledger = await self.worker.run(
            lambda: Ledger(self.url, lease_s=self.limits.lease_s, flush_s=self.limits.flush_s)
        )
        await self.refresh()
        self._task = self.worker.every(self.refresh_s, self.refresh, "keys and limits")

    async def close(self) -> None:
        await self.worker.cancel(self._task)
        self._task = None
        ledger, self.admission.ledger = self.admission.ledger, None
        if ledger is not None:
            await self.worker.run(ledger.close)

    async def call(self, fn: Callable[[Connection], T]) -> T:
        """Run ``fn`` in one transaction on the store's thread."""
        return await self.worker.call(fn)

    async def refresh(self) -> bool:
        """Reload keys and limits if they changed; whether they did."""
        version = await self.call(keys.version)
        if version == self.version:
            return False
        version, stored, limits = await self.call(_load)
        self.auth.replace_stored(stored)
        self.admission.limits = limits
        self.version = version
        return True


def _load(conn: Connection) -> tuple[int, dict[str, Principal], dict[tuple[str, str], Limits]]:
    version = keys.version(conn)  # first: the rows read after are at least this new
    stored = {row.sha256: _principal(row) for row in keys.live_keys(conn)}
    limits = {
        (r.tenant_id, r.key_name): Limits(
            r.requests_per_minute, r.tokens_per_minute, r.tokens_per_day, r.tokens_per_month,
            r.soft_percent,
        )
        for r in keys.list_limits(conn)
    }  # fmt: skip
    return version, stored, limits


def _principal(row: Any) -> Principal:
    expires = row.expires_at
    if expires is not None and expires.tzinfo is None:  # SQLite keeps no zone: it is UTC
        expires = expires.replace(tzinfo=UTC)
    return Principal(
        row.name, row.tenant_id, bool(row.admin),
        frozenset(row.models) if row.models is not None else None,
        frozenset(row.tools) if row.tools is not None else None,
        expires.timestamp() if expires is not None else None, row.id,
    )  # fmt: skip
