"""The sandbox answers a Responses request reuses: aged out by the clock, shared while in
flight, never remembered when they failed, bounded (the end-to-end count of sandbox calls:
tests/integration/test_responses_sandbox_approval.py)."""

from __future__ import annotations

import asyncio

import pytest

from gateway.errors import SandboxUnavailable
from gateway.pipeline.responses.sandbox_offers import SandboxOffers, _Remembered


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def asker(calls: list[str], fail: int = 0):
    """A call that counts itself; its first ``fail`` calls fail (the injected fault)."""

    async def ask(name: str) -> str:
        calls.append(name)
        await asyncio.sleep(0.01)
        if len(calls) <= fail:
            raise SandboxUnavailable("tool sandbox: down")
        return f"{name}#{len(calls)}"

    return ask


def test_an_answer_is_reused_until_it_ages_out():
    clock, calls = Clock(), []
    ask = asker(calls)
    cache = _Remembered(1.0, 8, clock)

    async def run() -> list[str]:
        got = [await cache.get("k", lambda: ask("k"))]
        clock.now += 0.9
        got.append(await cache.get("k", lambda: ask("k")))
        clock.now += 0.2  # 1.1 s after the first ask
        got.append(await cache.get("k", lambda: ask("k")))
        return got

    assert asyncio.run(run()) == ["k#1", "k#1", "k#2"]


def test_concurrent_requests_share_one_call_and_a_failure_is_asked_again():
    clock, calls = Clock(), []
    ask = asker(calls, fail=1)
    cache = _Remembered(1.0, 8, clock)

    async def run() -> list[object]:
        both = await asyncio.gather(
            cache.get("k", lambda: ask("k")), cache.get("k", lambda: ask("k")),
            return_exceptions=True,
        )  # fmt: skip
        return [*both, await cache.get("k", lambda: ask("k"))]

    first, second, again = asyncio.run(run())
    assert isinstance(first, SandboxUnavailable) and isinstance(second, SandboxUnavailable)
    assert again == "k#2" and calls == ["k", "k"]  # one call in flight; the failure not kept


def test_entries_are_bounded_least_recently_used_first():
    clock, calls = Clock(), []
    ask = asker(calls)
    cache = _Remembered(60.0, 2, clock)

    async def run() -> None:
        for key in ("a", "b", "a", "c", "a", "b"):
            await cache.get(key, lambda key=key: ask(key))

    asyncio.run(run())
    assert calls == ["a", "b", "c", "b"]  # c pushed b out, a stayed in use
    assert len(cache.entries) == 2


def test_no_sandbox_is_the_gateways_503_and_is_not_remembered():
    offers = SandboxOffers(1.0)

    async def run() -> None:
        for _ in range(2):
            with pytest.raises(SandboxUnavailable, match="not running"):
                await offers.get(None, "acme", "k")

    asyncio.run(run())
    assert not offers._listing.entries and not offers._held.entries
