"""The usage ledger on a real store (SQLite and PostgreSQL): caps hold under concurrent
reservations from two replicas, a refused request keeps none of its counters, settlements
land; far from a cap a replica admits from blocks without a store round trip, near it
per request; a replica that dies holding a block under-admits only until its lease ends."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from sqlalchemy import select

from gateway.access.ledger import Ledger
from gateway.store.database import make_engine, upgrade
from gateway.store.ledger import Counter
from gateway.store.schema import usage_leases, usage_windows

ROOT = Path(__file__).resolve().parents[3]


def rows(url: str) -> dict[tuple[str, str], tuple[int, int]]:
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            found = conn.execute(select(usage_windows)).all()
    finally:
        engine.dispose()
    return {(r.key_name, r.unit): (r.used, r.reserved) for r in found}


def leases(url: str) -> list[tuple[str, int]]:
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            return [(r.holder, r.amount) for r in conn.execute(select(usage_leases))]
    finally:
        engine.dispose()


def test_concurrent_reservations_never_pass_a_cap(store_url: str):
    upgrade(store_url)
    tenant = Counter("t", "", "2026-12-02", "tokens", 370)  # near its cap from the start
    key = Counter("t", "k", "2026-12-02", "tokens", 10_000)  # far: taken in blocks
    requests = Counter("t", "k", "2026-12-02T00:25", "requests", 1_000)

    async def scenario() -> list[object]:
        ledgers = [Ledger(store_url), Ledger(store_url)]  # two replicas' batching threads
        try:
            items = [(requests, 1), (key, 10), (tenant, 10)]
            results = await asyncio.gather(*[ledgers[i % 2].reserve(items) for i in range(100)])
            for i, result in enumerate(results):  # each admitted one used 4 tokens of its 10
                if isinstance(result, list):
                    ledgers[i % 2].settle([(requests, 1, 1), (key, 10, 4), (tenant, 10, 4)])
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
    assert rows(store_url) == {  # closing wrote what was spent and gave every block back
        ("", "tokens"): (37 * 4, 0),
        ("k", "tokens"): (37 * 4, 0),  # the 63 refused gave back what they took of the key's
        ("k", "requests"): (37, 0),
    }
    assert leases(store_url) == []


def test_far_from_the_cap_requests_are_admitted_from_blocks(store_url: str):
    upgrade(store_url)
    day = Counter("t", "", "2026-12-02", "tokens", 10**9)
    minute = Counter("t", "", "2026-12-02T00:25", "requests", 10**6)
    items = [(minute, 1), (day, 50)]

    async def scenario() -> None:
        ledger = Ledger(store_url)
        try:
            for _ in range(320):  # one at a time, as at concurrency 1
                assert isinstance(await ledger.reserve(items), list)
                ledger.settle([(minute, 1, 1), (day, 50, 30)])
            # a block is 32 requests' reservations; flushes come every FLUSH_S
            assert ledger.transactions <= 320 // 8, ledger.transactions
            assert rows(store_url)[("", "tokens")][1] > 0  # a block is still leased
            assert [amount for _, amount in leases(store_url)] != []
        finally:
            ledger.close()
        assert rows(store_url) == {("", "tokens"): (320 * 30, 0), ("", "requests"): (320, 0)}
        assert leases(store_url) == []

    asyncio.run(scenario())


def test_a_share_running_low_is_refilled_before_a_request_waits(store_url: str):
    upgrade(store_url)
    day = Counter("t", "", "2026-12-02", "tokens", 10**9)
    minute = Counter("t", "", "2026-12-02T00:25", "requests", 10**6)
    items = [(minute, 1), (day, 50)]

    async def scenario() -> tuple[int, int]:
        ledger = Ledger(store_url, flush_s=60)  # no flush: each transaction is a grant
        try:
            assert isinstance(await ledger.reserve(items), list)  # the first grant: a miss
            ledger.settle([(minute, 1, 1), (day, 50, 50)])
            missed = 0
            for _ in range(150):  # one at a time, the event loop idle in between
                if ledger.take(items) is None:
                    missed += 1
                    assert isinstance(await ledger.reserve(items), list)
                ledger.settle([(minute, 1, 1), (day, 50, 50)])
                await asyncio.sleep(0.01)  # a request's I/O: the thread refills meanwhile
            return missed, ledger.transactions
        finally:
            ledger.close()

    missed, transactions = asyncio.run(scenario())
    assert missed == 0  # every refill landed before the share ran out
    assert 150 // 64 <= transactions <= 150 // 16, transactions  # in blocks, not per request
    assert rows(store_url) == {("", "tokens"): (151 * 50, 0), ("", "requests"): (151, 0)}


def test_a_share_spent_fast_is_refilled_in_bigger_blocks(store_url: str):
    upgrade(store_url)
    minute = Counter("t", "", "2026-12-02T00:25", "requests", 10**6)
    items = [(minute, 1)]

    async def scenario() -> int:
        ledger = Ledger(store_url, flush_s=60)  # no flush: each transaction is a grant
        try:
            for _ in range(1000):  # fast: the thread refills while the loop yields
                if ledger.take(items) is None:  # a miss waits for a transaction
                    assert isinstance(await ledger.reserve(items), list)
                await asyncio.sleep(0)
            ledger.settle([(minute, 1, 1)] * 1000)
            return ledger.transactions
        finally:
            ledger.close()

    transactions = asyncio.run(scenario())
    # blocks of 64 take 1000 / 64 = 15 transactions or more (misses add theirs); doubling
    # blocks, about half that
    assert transactions < 1000 // 64, transactions
    assert rows(store_url) == {("", "requests"): (1000, 0)}


def test_two_replicas_admit_exactly_up_to_the_cap(store_url: str):
    upgrade(store_url)
    cap = 20_000  # blocks while far from it, one reservation at a time near it
    day = Counter("t", "", "2026-12-02", "tokens", cap)

    async def scenario() -> list[object]:
        ledgers = [Ledger(store_url), Ledger(store_url)]
        try:
            out: list[object] = []
            for _ in range(25):  # waves of concurrent requests on both replicas
                wave = [ledgers[i % 2].reserve([(day, 10)]) for i in range(90)]
                out += await asyncio.gather(*wave)
            return out
        finally:
            for ledger in ledgers:
                ledger.close()

    results = asyncio.run(scenario())
    assert sum(isinstance(r, list) for r in results) == cap // 10  # none short, none over
    assert rows(store_url) == {("", "tokens"): (0, cap)}  # still held by their requests...
    assert sum(amount for _, amount in leases(store_url)) == cap  # ...under the two leases


HOLDER = """
import asyncio, sys, time
from gateway.access.ledger import Ledger
from gateway.store.ledger import Counter

ledger = Ledger(sys.argv[1], lease_s=float(sys.argv[2]))
day = Counter("t", "", "2026-12-02", "tokens", 10_000)
print(asyncio.run(ledger.reserve([(day, 10)])), flush=True)
time.sleep(600)
"""


def test_a_dead_replicas_block_comes_back_when_its_lease_ends(store_url: str):
    upgrade(store_url)
    day = Counter("t", "", "2026-12-02", "tokens", 10_000)
    lease_s = 3.0
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, store_url, str(lease_s)],
        stdout=subprocess.PIPE, text=True, cwd=ROOT, start_new_session=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "[10]"
        held = rows(store_url)[("", "tokens")][1]
        assert held > 10  # it took a block, not just its reservation
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # dies holding it: nothing given back
        proc.wait()
    died = time.monotonic()

    async def scenario() -> None:
        ledger = Ledger(store_url)
        try:
            want = [(day, 10_000 - 10)]  # fits only once the dead replica's block is back
            assert await ledger.reserve(want) == day  # its lease still runs: refused
            while not isinstance(await ledger.reserve(want), list):
                assert time.monotonic() - died < lease_s + 5, "the lease never ended"
                await asyncio.sleep(0.2)
            assert time.monotonic() - died >= lease_s - 1.0  # not before the lease ended
        finally:
            ledger.close()

    asyncio.run(scenario())
    # all of the dead replica's lease came back, its own request's 10 too (it died with it)
    assert rows(store_url) == {("", "tokens"): (0, 10_000 - 10)}


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


def test_settled_usage_reaches_the_store_every_flush_s(store_url: str):
    """`limits.flush_s` is how stale the other replicas' view of spent usage can be."""
    upgrade(store_url)
    day = Counter("t", "", "2026-12-02", "tokens", 10**9)

    async def spent_after(flush_s: float, wait_s: float) -> int:
        ledger = Ledger(store_url, lease_s=max(30.0, 8 * flush_s), flush_s=flush_s)
        before = rows(store_url).get(("", "tokens"), (0, 0))[0]
        try:
            assert isinstance(await ledger.reserve([(day, 50)]), list)
            ledger.settle([(day, 50, 30)])
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline and rows(store_url)[("", "tokens")][0] == before:
                await asyncio.sleep(0.05)
            return rows(store_url)[("", "tokens")][0]
        finally:
            ledger.close()

    assert asyncio.run(spent_after(60.0, 1.5)) == 0  # written only at close
    assert rows(store_url)[("", "tokens")][0] == 30
    assert asyncio.run(spent_after(0.2, 10.0)) == 60  # a flush came while it was open
