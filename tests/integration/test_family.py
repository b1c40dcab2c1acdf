"""The same-family check against running replicas (their /tokenize)."""

from __future__ import annotations

import asyncio

from gateway.config import TierSettings
from gateway.upstream.family_probe import check_replica_family
from router import Tier
from tests.support.fake_upstream import FakeUpstream
from tests.support.servers import serve_in_thread


def check(
    full: FakeUpstream,
    fast: FakeUpstream,
    parsers: tuple[str | None, str | None] = ("hermes", "hermes"),
) -> list[str]:
    with serve_in_thread(full.app) as a, serve_in_thread(fast.app) as b:
        tiers = {
            Tier.FULL: TierSettings(model="m", replicas=[a], tool_call_parser=parsers[0]),
            Tier.FAST: TierSettings(model="m-fast", replicas=[b], tool_call_parser=parsers[1]),
        }
        return asyncio.run(check_replica_family(tiers))


def test_same_family_passes():
    assert check(FakeUpstream(), FakeUpstream()) == []


def test_a_different_tokenizer_is_named():
    other = FakeUpstream()
    other.vocab_shift = 7
    problems = check(FakeUpstream(), other)
    assert any("tokenizer of fast differs" in p for p in problems)


def test_a_different_chat_template_is_named():
    other = FakeUpstream()
    other.template = "<s>{}</s>"
    (problem,) = check(FakeUpstream(), other)
    assert "chat template of fast differs" in problem


def test_different_tool_parsers_are_named():
    (problem,) = check(FakeUpstream(), FakeUpstream(), ("hermes", "mistral"))
    assert "tool-call parsers differ" in problem
