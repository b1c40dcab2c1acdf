"""The replicas of one tier: selection, active health checks and passive failure tracking.

A replica is *eligible* when its last health checks passed (or none has failed
yet) and its circuit breaker lets a request through. Among eligible replicas
the one with the fewest requests in flight wins, ties broken round-robin.
Active checks call ``GET /health`` every ``interval_s``; ``unhealthy_after``
consecutive failures eject a replica; one success re-admits it and closes its
circuit breaker, since the failures it counted predate the recovery.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable, Iterable

import aiohttp

from gateway.config import BreakerSettings, HealthSettings
from gateway.upstream.breaker import CircuitBreaker
from router.types import Tier

log = logging.getLogger(__name__)


class Replica:
    __slots__ = ("breaker", "checked_ok", "health_failures", "healthy", "in_flight", "url")

    def __init__(self, url: str, breaker: CircuitBreaker) -> None:
        self.url = url
        self.breaker = breaker
        self.healthy = True  # optimistic until a check says otherwise
        self.checked_ok = False  # has any active check passed? (readiness)
        self.health_failures = 0
        self.in_flight = 0

    def eligible(self) -> bool:
        return self.healthy and self.breaker.available()

    def __repr__(self) -> str:
        return f"Replica({self.url}, healthy={self.healthy}, breaker={self.breaker.state})"


class TierPool:
    def __init__(
        self,
        tier: Tier,
        model: str,
        urls: Iterable[str],
        breaker: BreakerSettings,
        health: HealthSettings,
        *,
        fallback: bool = True,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.tier = tier
        self.model = model
        self.fallback = fallback  # may requests routed here move to the other tier when it is down?
        kwargs = {"clock": clock} if clock is not None else {}
        self.replicas = [
            Replica(u, CircuitBreaker(breaker.failure_threshold, breaker.reset_after_s, **kwargs))
            for u in urls
        ]
        self._health = health
        self._rr = itertools.count()
        self._task: asyncio.Task[None] | None = None

    # -- selection ---------------------------------------------------------

    def pick(self, exclude: set[Replica] | None = None) -> Replica | None:
        """Choose a replica (and take its breaker slot), or None when none is eligible."""
        best: Replica | None = None
        candidates = [
            r for r in self.replicas if r.eligible() and (not exclude or r not in exclude)
        ]
        if not candidates:
            return None
        start = next(self._rr) % len(candidates)
        for r in candidates[start:] + candidates[:start]:
            if best is None or r.in_flight < best.in_flight:
                best = r
        assert best is not None
        best.breaker.acquire()
        return best

    def available(self) -> bool:
        return any(r.eligible() for r in self.replicas)

    def ready(self) -> bool:
        return any(r.healthy and r.checked_ok for r in self.replicas)

    def status(self) -> list[dict[str, object]]:
        return [
            {
                "url": r.url,
                "healthy": r.healthy,
                "checked": r.checked_ok,
                "breaker": str(r.breaker.state),
                "in_flight": r.in_flight,
            }
            for r in self.replicas
        ]

    # -- active health checks ----------------------------------------------

    async def check_once(self, session: aiohttp.ClientSession) -> None:
        await asyncio.gather(*(self._check(session, r) for r in self.replicas))

    async def _check(self, session: aiohttp.ClientSession, replica: Replica) -> None:
        timeout = aiohttp.ClientTimeout(total=self._health.timeout_s)
        try:
            async with session.get(replica.url + "/health", timeout=timeout) as resp:
                ok = resp.status == 200
        except (aiohttp.ClientError, TimeoutError, OSError):
            ok = False
        if ok:
            if not replica.healthy:
                log.info(
                    "%s replica %s passed its health check; re-admitted", self.tier, replica.url
                )
                # Whatever failed while it was out (a restart, say) is history now.
                replica.breaker.record_success()
            replica.healthy = True
            replica.checked_ok = True
            replica.health_failures = 0
            return
        replica.health_failures += 1
        if replica.healthy and replica.health_failures >= self._health.unhealthy_after:
            replica.healthy = False
            if not replica.checked_ok:  # still starting up: not news
                log.info("%s replica %s is not up yet", self.tier, replica.url)
                return
            log.warning(
                "%s replica %s failed %d health checks; ejected",
                self.tier,
                replica.url,
                replica.health_failures,
            )

    def start_health_checks(self, session: aiohttp.ClientSession) -> None:
        self._task = asyncio.create_task(self._loop(session), name=f"health-{self.tier}")

    async def _loop(self, session: aiohttp.ClientSession) -> None:
        while True:
            await self.check_once(session)
            # Look again within a second while a replica is out, so a restarted
            # server is re-admitted promptly.
            down = any(not r.healthy for r in self.replicas)
            await asyncio.sleep(
                min(1.0, self._health.interval_s) if down else self._health.interval_s
            )

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
