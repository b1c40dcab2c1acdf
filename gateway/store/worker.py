"""One thread and one engine for a replica's small store work: the change-counter polls that
keep its copies of keys, limits, routing versions and kill switches current, and the admin
API's writes.

Each of those copies used to open its own engine, thread and poll loop. They share this one
now: the work is a primary-key read per interval and an occasional reload or write, so one
thread serves it, and a replica holds one such connection instead of one per copy. The
usage ledger keeps its own thread (it runs transactions on the request path and must not
queue behind a reload).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError

from gateway.errors import StoreUnavailable
from gateway.store.database import make_engine

log = logging.getLogger(__name__)
T = TypeVar("T")


class StoreWorker:
    def __init__(self, url: str) -> None:
        self.url = url
        self._engine: Engine | None = None
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="gearshift-store")
        self._polls: list[asyncio.Task[None]] = []

    async def open(self) -> None:
        """After the store's schema is ready (the recorder migrates it)."""
        if self._engine is None:
            loop = asyncio.get_running_loop()
            self._engine = await loop.run_in_executor(self._thread, make_engine, self.url)

    async def run(self, fn: Callable[[], T]) -> T:
        """``fn()`` on the store's thread (for work that opens its own objects on it)."""
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn)

    async def call(self, fn: Callable[[Connection], T], *, write: bool = True) -> T:
        """``fn(conn)`` in one transaction on the store's thread (``write=False``: a plain
        connection, for reads that need no transaction of their own)."""
        engine = self._engine
        if engine is None:
            raise StoreUnavailable("the store is not open")

        def go() -> T:
            with engine.begin() if write else engine.connect() as conn:
                return fn(conn)

        try:
            return await self.run(go)
        except DBAPIError as exc:
            raise StoreUnavailable(f"the store is unreachable: {exc.orig}") from None

    def every(
        self, interval_s: float, refresh: Callable[[], Awaitable[object]], what: str
    ) -> asyncio.Task[None]:
        """Run ``refresh`` every ``interval_s`` until cancelled or closed; a failure is
        logged and the last copy of ``what`` stays in force."""

        async def poll() -> None:
            while True:
                await asyncio.sleep(interval_s)
                try:
                    await refresh()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # the store away, a version that no longer builds
                    log.warning("%s not refreshed (the last copy stays): %s", what, exc)

        task = asyncio.create_task(poll(), name=f"store-poll: {what}")
        self._polls.append(task)
        return task

    @staticmethod
    async def cancel(task: asyncio.Task[None] | None) -> None:
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def close(self) -> None:
        for task in self._polls:
            await self.cancel(task)
        self._polls.clear()
        if self._engine is not None:
            engine, self._engine = self._engine, None
            await self.run(engine.dispose)
        self._thread.shutdown(wait=True)
