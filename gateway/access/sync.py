"""Each replica's copy of the store's keys and limits, and the store calls of the admin API.

Authenticating never touches the store: keys and limits are held in memory
(``Authenticator``, ``Admission.limits``). Every ``auth.refresh_s`` (0.5 s by default) a
task reads the one-row change counter that every key or limit write bumps; when it moved,
it reloads the live keys and all limits (small tables) and swaps them in. A revoked key
is therefore refused by every replica within ``refresh_s`` plus one reload, at the cost of
one primary-key read per replica per interval. Expiry needs no reload: each cached key
carries its expiry time. If the store is unreachable the last copy stays in force (and a
warning is logged) until it is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError

from gateway.access.admission import Admission, Limits
from gateway.access.ledger import Ledger
from gateway.auth import Authenticator, Principal
from gateway.config import Settings
from gateway.errors import StoreUnavailable
from gateway.store import keys
from gateway.store.database import make_engine

log = logging.getLogger(__name__)
T = TypeVar("T")


class AccessSync:
    def __init__(self, settings: Settings, auth: Authenticator, admission: Admission) -> None:
        self.url = settings.store.url
        self.refresh_s = settings.auth.refresh_s
        self.limits = settings.limits
        self.auth, self.admission = auth, admission
        self.version = -1
        self._engine: Engine | None = None
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="gearshift-access")
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """After the store's schema is ready (the recorder migrates it)."""
        loop = asyncio.get_running_loop()
        self._engine = await loop.run_in_executor(self._thread, make_engine, self.url)
        self.admission.ledger = await loop.run_in_executor(
            self._thread,
            lambda: Ledger(self.url, lease_s=self.limits.lease_s, flush_s=self.limits.flush_s),
        )
        await self.refresh()
        self._task = asyncio.create_task(self._poll())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        ledger, self.admission.ledger = self.admission.ledger, None
        if ledger is not None:
            await asyncio.get_running_loop().run_in_executor(self._thread, ledger.close)
        if self._engine is not None:
            self._engine.dispose()
        self._thread.shutdown(wait=True)

    async def call(self, fn: Callable[[Connection], T]) -> T:
        """Run ``fn`` in one transaction on the store's thread."""
        engine = self._engine
        if engine is None:
            raise StoreUnavailable("the store is not open")

        def run() -> T:
            with engine.begin() as conn:
                return fn(conn)

        try:
            return await asyncio.get_running_loop().run_in_executor(self._thread, run)
        except DBAPIError as exc:
            raise StoreUnavailable(f"the store is unreachable: {exc.orig}") from None

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

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_s)
            try:
                await self.refresh()
            except StoreUnavailable as exc:
                log.warning("keys and limits not refreshed (the last ones stay): %s", exc)


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
