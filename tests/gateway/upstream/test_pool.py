from __future__ import annotations

from gateway.config import BreakerSettings, HealthSettings
from gateway.upstream.pool import TierPool
from router import Tier


def pool(n: int, threshold: int = 1) -> TierPool:
    return TierPool(
        Tier.FULL,
        "m",
        [f"http://r{i}" for i in range(n)],
        BreakerSettings(failure_threshold=threshold, reset_after_s=60),
        HealthSettings(),
    )


def test_least_in_flight_wins():
    p = pool(3)
    p.replicas[0].in_flight = 2
    p.replicas[1].in_flight = 0
    p.replicas[2].in_flight = 1
    assert p.pick() is p.replicas[1]


def test_ties_rotate():
    p = pool(3)
    assert {p.pick().url for _ in range(6)} == {"http://r0", "http://r1", "http://r2"}


def test_excluded_unhealthy_and_open_replicas_are_skipped():
    p = pool(3)
    p.replicas[0].healthy = False
    p.replicas[1].breaker.record_failure()  # threshold 1: open
    assert p.pick() is p.replicas[2]
    assert p.pick(exclude={p.replicas[2]}) is None
    assert p.available()


def test_no_replica_means_unavailable_and_not_ready():
    p = pool(1)
    p.replicas[0].healthy = False
    assert p.pick() is None and not p.available() and not p.ready()


def test_ready_needs_a_passed_check():
    p = pool(1)
    assert not p.ready()
    p.replicas[0].checked_ok = True
    assert p.ready()
    assert p.status() == [
        {"url": "http://r0", "healthy": True, "checked": True, "breaker": "closed", "in_flight": 0}
    ]


async def test_readmission_closes_the_breaker():
    import aiohttp

    from tests.support.fake_upstream import FakeUpstream
    from tests.support.servers import serve_in_thread

    upstream = FakeUpstream()
    with serve_in_thread(upstream.app) as url:
        p = TierPool(
            Tier.FULL,
            "m",
            [url],
            BreakerSettings(failure_threshold=1, reset_after_s=60),
            HealthSettings(unhealthy_after=1),
        )
        replica = p.replicas[0]
        async with aiohttp.ClientSession() as session:
            upstream.healthy = False
            replica.breaker.record_failure()
            await p.check_once(session)
            assert not replica.healthy and not replica.eligible()
            upstream.healthy = True
            await p.check_once(session)
            assert replica.healthy and replica.checked_ok and replica.eligible()


async def test_a_healthy_replica_keeps_its_open_breaker():
    import aiohttp

    from tests.support.fake_upstream import FakeUpstream
    from tests.support.servers import serve_in_thread

    upstream = FakeUpstream()
    with serve_in_thread(upstream.app) as url:
        p = TierPool(
            Tier.FULL,
            "m",
            [url],
            BreakerSettings(failure_threshold=1, reset_after_s=60),
            HealthSettings(),
        )
        p.replicas[0].breaker.record_failure()
        async with aiohttp.ClientSession() as session:
            await p.check_once(session)
        assert not p.replicas[0].eligible()  # /health passing does not excuse failing requests
