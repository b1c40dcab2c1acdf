"""What a Responses request with hosted tools asks the sandbox before its first model step,
remembered for about a second (``responses.sandbox_cache_s``): the tool listing (``GET /v1/tools``, the same for every
caller) and the tools a principal's grant holds for an approval (``POST /v1/approvals``,
per tenant and API key).

An agent loop sends its requests back to back, and each would otherwise make both loopback
calls again. The sandbox's grants are its own configuration (the gateway hears of no
change), so an entry simply ages out; a stale one is safe: the sandbox checks the grant
again on every call, so a tool held since is refused there, never run unapproved.
Concurrent requests of one principal share one call in flight; a failed call is not
remembered. Entries are bounded (least recently used dropped first).
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from gateway.pipeline.tools import held_for_approval, list_tools
from sandbox.client import SandboxClient

T = TypeVar("T")
MAX_PRINCIPALS = 1024


class _Remembered:
    """Results of one kind of call by key, each for ``ttl_s``, at most ``size`` keys."""

    def __init__(self, ttl_s: float, size: int, clock: Callable[[], float]) -> None:
        self.ttl_s, self.size, self.clock = ttl_s, size, clock
        self.entries: collections.OrderedDict[Any, tuple[float, asyncio.Future[Any]]] = (
            collections.OrderedDict()
        )

    async def get(self, key: Any, ask: Callable[[], Awaitable[T]]) -> T:
        now = self.clock()
        found = self.entries.get(key)
        if found is None or found[0] <= now:
            found = (now + self.ttl_s, asyncio.ensure_future(ask()))
            # read even when every request that waited on it has gone (no "never retrieved")
            found[1].add_done_callback(lambda f: f.cancelled() or f.exception())
            self.entries[key] = found
            while len(self.entries) > self.size:
                self.entries.popitem(last=False)
        self.entries.move_to_end(key)
        future = found[1]
        try:
            result: T = await asyncio.shield(future)
        except BaseException:
            if self.entries.get(key) is found and future.done():
                del self.entries[key]  # a failure is asked again by the next request
            raise
        return result


class SandboxOffers:
    """The sandbox's listing and a principal's held tools, each asked at most once a TTL."""

    def __init__(
        self,
        ttl_s: float,
        size: int = MAX_PRINCIPALS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._listing = _Remembered(ttl_s, 1, clock)
        self._held = _Remembered(ttl_s, size, clock)

    async def get(
        self, sandbox: SandboxClient | None, tenant: str, key: str
    ) -> tuple[list[dict[str, Any]], set[str]]:
        """(the tools' chat schemas, the names held for approval), shared by the requests
        of one TTL: read them, never change them. The gateway's errors (a sandbox that is
        down: 503) as ``gateway.pipeline.tools`` raises them."""
        listed, held = await asyncio.gather(
            self._listing.get(id(sandbox), lambda: list_tools(sandbox)),
            self._held.get(
                (id(sandbox), tenant, key), lambda: held_for_approval(sandbox, tenant, key)
            ),
        )
        return listed, held
