"""The usage ledger on a real store (SQLite and PostgreSQL): caps hold under concurrent
reservations, a refused request keeps none of its counters, settlements land."""

from __future__ import annotations

import asyncio

from sqlalchemy import select

from gateway.access.ledger import Ledger
from gateway.store.database import make_engine, upgrade
from gateway.store.ledger import Counter
from gateway.store.schema import usage_windows


def rows(url: str) -> dict[tuple[str, str], tuple[int, int]]:
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            found = conn.execute(select(usage_windows)).all()
    finally:
        engine.dispose()
    return {(r.key_name, r.unit): (r.used, r.reserved) for r in found}


def test_concurrent_reservations_never_pass_a_cap(store_url: str):
    upgrade(store_url)
    tenant = Counter("t", "", "2026-12-02", "tokens", 370)
    key = Counter("t", "k", "2026-12-02", "tokens", 10_000)
    requests = Counter("t", "k", "2026-12-02T00:25", "requests", 1_000)

    async def scenario() -> list[object]:
        ledgers = [Ledger(store_url), Ledger(store_url)]  # two replicas' batching threads
        try:
            items = [(requests, 1), (key, 10), (tenant, 10)]
            results = await asyncio.gather(*[ledgers[i % 2].reserve(items) for i in range(100)])
            admitted = [r for r in results if isinstance(r, list)]
            for _ in admitted:  # each used 4 tokens of its 10
                ledgers[0].settle([(requests, 1, 1), (key, 10, 4), (tenant, 10, 4)])
            return results
        finally:
            for ledger in ledgers:
                ledger.close()

    results = asyncio.run(scenario())
    admitted = [r for r in results if isinstance(r, list)]
    assert len(admitted) == 37  # 370 / 10, however the two threads' batches interleaved
    assert {r for r in results if not isinstance(r, list)} == {tenant}
    totals = sorted(r[2] for r in admitted)
    assert totals == list(range(10, 371, 10))  # each saw the tenant's running total
    assert rows(store_url) == {
        ("", "tokens"): (37 * 4, 0),
        ("k", "tokens"): (37 * 4, 0),  # the 63 refused gave back what they took of the key's
        ("k", "requests"): (37, 0),
    }


def test_a_reservation_whose_waiter_left_is_given_back(store_url: str):
    upgrade(store_url)
    counter = Counter("t", "", "2026-12", "tokens", 100)

    async def scenario() -> None:
        ledger = Ledger(store_url)
        try:
            waiting = asyncio.ensure_future(ledger.reserve([(counter, 60)]))
            await asyncio.sleep(0)
            waiting.cancel()  # the client went away while its reservation was in flight
            await asyncio.gather(waiting, return_exceptions=True)
            for _ in range(500):  # its batch commits, then the give-back's
                if rows(store_url).get(("", "tokens")) == (0, 0):
                    break
                await asyncio.sleep(0.01)
            assert rows(store_url) == {("", "tokens"): (0, 0)}
            assert await ledger.reserve([(counter, 60)]) == [60]
        finally:
            ledger.close()

    asyncio.run(scenario())
