"""Send one request to a tier: replica choice, retries before the first byte, fallback.

Nothing reaches the client until ``dispatch`` returns, so everything here may
be retried: connect failures and 5xx answers move to another replica with
exponential backoff; 429 waits for ``Retry-After`` (up to a cap, beyond which
the client gets the 429); a tier with no eligible replica, or whose replicas
all failed, hands a routed (``auto``) request to the other tier. Timeouts are
not retried: the replica may still be working, and a retry would double the
wait. Client errors (4xx) pass through untouched.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from gateway.config import RetrySettings, TimeoutSettings
from gateway.errors import (
    GatewayError,
    NoHealthyReplica,
    UpstreamError,
    UpstreamRateLimited,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from gateway.metrics import Metrics
from gateway.upstream.pool import Replica, TierPool
from gateway.upstream.sse import split_events
from gateway.upstream.transport import JSON_HEADERS, translated
from router.types import Tier

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Attempts:
    """What dispatching one request did; written by ``Dispatcher`` (and by the relay, which
    adds the time it waits on the replica), read once into the request's outcome."""

    tier: Tier  # the tier that served (or last failed) the request
    fallback: bool = False  # the other tier served it
    count: int = 0  # upstream attempts, all tiers
    replica: str | None = None  # the last replica tried
    upstream_s: float = 0.0  # time spent waiting on replicas


@dataclass(slots=True)
class Completed:
    """A whole upstream answer (non-streamed, or a stream refused with an error status)."""

    status: int
    body: bytes
    headers: Mapping[str, str]
    data: Any = None  # ``body`` parsed, once someone has parsed it


@dataclass(slots=True)
class OpenStream:
    """A 200 stream whose first event has arrived; the relay takes it from here."""

    response: aiohttp.ClientResponse
    replica: Replica
    first_events: list[bytes]
    rest: bytes


def parse_retry_after(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None  # HTTP-date form: treat as unknown and back off normally


def upstream_message(body: bytes) -> str:
    try:
        data = orjson.loads(body)
        msg = data["error"]["message"] if "error" in data else data.get("message")
        if isinstance(msg, str):
            return msg[:500]
    except (orjson.JSONDecodeError, TypeError, KeyError, AttributeError):
        pass
    return body[:200].decode(errors="replace")


class Dispatcher:
    def __init__(
        self,
        pools: Mapping[Tier, TierPool],
        session: aiohttp.ClientSession,
        timeouts: TimeoutSettings,
        retries: RetrySettings,
        metrics: Metrics,
        sleep: Callable[[float], Any] = asyncio.sleep,
    ) -> None:
        self.pools = pools
        self._session = session
        self._timeouts = timeouts
        self._retries = retries
        self._metrics = metrics
        self._sleep = sleep

    def _backoff(self, attempt: int) -> float:
        r = self._retries
        delay: float = min(r.backoff_max_s, r.backoff_base_s * 2.0**attempt)
        return delay * (0.5 + random.random() / 2)

    async def dispatch(
        self,
        payload: Callable[[str], bytes],
        path: str,
        stream: bool,
        attempts: Attempts,
        *,
        allow_fallback: bool,
        request_id: str = "",
    ) -> Completed | OpenStream:
        """Send to ``attempts.tier`` (then, when allowed, the other tier); ``payload(model)``
        is the body for a tier serving ``model``."""
        first = attempts.tier
        order = [first]
        if allow_fallback and self.pools[first].fallback and first.other in self.pools:
            order.append(first.other)
        for i, tier in enumerate(order):
            pool = self.pools[tier]
            attempts.tier, attempts.fallback = tier, i > 0
            try:
                return await self._call_tier(attempts, pool, path, payload(pool.model), stream)
            except (UpstreamRateLimited, UpstreamTimeout):
                raise  # the tier is up; moving the load elsewhere is the client's call
            except (NoHealthyReplica, UpstreamError) as exc:
                if i == len(order) - 1:
                    raise
                log.warning(
                    "tier %s down for request %s (%s); falling back to %s",
                    tier,
                    request_id,
                    exc.message,
                    order[i + 1],
                )
                self._metrics.fallbacks.labels(tier, order[i + 1]).inc()
        raise AssertionError("unreachable")

    async def _call_tier(
        self, attempts: Attempts, pool: TierPool, path: str, payload: bytes, stream: bool
    ) -> Completed | OpenStream:
        tried: set[Replica] = set()
        last: GatewayError = NoHealthyReplica(f"tier {pool.tier} has no healthy replica")
        tries = self._retries.attempts
        for attempt in range(tries):
            replica = pool.pick(tried) or pool.pick()
            if replica is None:
                raise last
            tried.add(replica)
            attempts.count += 1
            attempts.replica = replica.url
            final = attempt == tries - 1
            try:
                result = await self._attempt(attempts, replica, path, payload, stream)
            except asyncio.CancelledError:  # the client left: no verdict on the replica
                replica.breaker.release()
                raise
            except UpstreamTimeout:
                replica.breaker.record_failure()
                self._metrics.upstream_errors.labels(pool.tier, "timeout").inc()
                raise
            except UpstreamError as exc:  # unreachable, dropped, invalid HTTP
                replica.breaker.record_failure()
                self._metrics.upstream_errors.labels(pool.tier, "connect").inc()
                last = exc
                if not final:
                    self._metrics.retries.labels(pool.tier, "connect").inc()
                    await self._wait(attempts, self._backoff(attempt))
                continue
            if isinstance(result, OpenStream) or result.status < 429 or 429 < result.status < 500:
                replica.breaker.record_success()
                return result
            if result.status == 429:
                replica.breaker.release()  # overload is not a replica fault
                self._metrics.upstream_errors.labels(pool.tier, "429").inc()
                delay = parse_retry_after(result.headers.get("retry-after"))
                headers = (
                    {"retry-after": result.headers["retry-after"]}
                    if "retry-after" in result.headers
                    else {}
                )
                last = UpstreamRateLimited(
                    f"tier {pool.tier} is rate limited: {upstream_message(result.body)}",
                    headers=headers,
                )
                wait = self._backoff(attempt) if delay is None else delay
                if final or wait > self._retries.max_retry_after_s:
                    raise last
                self._metrics.retries.labels(pool.tier, "429").inc()
                await self._wait(attempts, wait)
                continue
            replica.breaker.record_failure()
            self._metrics.upstream_errors.labels(pool.tier, "5xx").inc()
            last = UpstreamError(
                f"replica {replica.url} returned {result.status}: {upstream_message(result.body)}"
            )
            if not final:
                self._metrics.retries.labels(pool.tier, "5xx").inc()
                await self._wait(attempts, self._backoff(attempt))
        raise last

    async def _wait(self, attempts: Attempts, seconds: float) -> None:
        """Back off before the next attempt; the wait is the replicas', not the gateway's
        (it counts in ``upstream_s``, so overhead figures exclude it)."""
        started = time.perf_counter()
        try:
            await self._sleep(seconds)
        finally:
            attempts.upstream_s += time.perf_counter() - started

    async def _attempt(
        self, attempts: Attempts, replica: Replica, path: str, payload: bytes, stream: bool
    ) -> Completed | OpenStream:
        started = time.perf_counter()
        replica.in_flight += 1
        resp: aiohttp.ClientResponse | None = None
        try:
            with translated(replica.url):
                async with asyncio.timeout(self._timeouts.first_byte_s):
                    resp = await self._session.post(
                        replica.url + path, data=payload, headers=JSON_HEADERS
                    )
                    if not stream or resp.status != 200:
                        body = await resp.read()
                        replica.in_flight -= 1
                        return Completed(resp.status, body, resp.headers)
                    events, rest = await self._first_events(resp)
            return OpenStream(resp, replica, events, rest)  # the relay now owns in_flight
        except BaseException:
            replica.in_flight -= 1
            if resp is not None:
                resp.close()  # never reuse a connection left mid-answer
            raise
        finally:
            attempts.upstream_s += time.perf_counter() - started

    async def _first_events(self, resp: aiohttp.ClientResponse) -> tuple[list[bytes], bytes]:
        buf = b""
        async for chunk in resp.content.iter_any():
            buf += chunk
            events, buf = split_events(buf)
            if events:
                return events, buf
        raise UpstreamUnreachable("replica closed the stream before its first event")
