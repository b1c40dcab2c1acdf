"""Summaries on the fast tier through the real dispatcher, and the extractive fallback when
that tier fails, stalls or answers nonsense (the stand-in replica injects the faults)."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from gateway.config import BreakerSettings, HealthSettings, RetrySettings, TimeoutSettings
from gateway.metrics import Metrics
from gateway.pipeline.context.summary import INSTRUCTIONS, Summarizer, _fitted, transcript
from gateway.upstream.dispatch import Dispatcher
from gateway.upstream.pool import TierPool
from router import Tier
from router.tokens import DEFAULT
from tests.gateway.pipeline.context.agent import chat, session
from tests.support.fake_upstream import Behaviour, FakeUpstream, status
from tests.support.servers import serve_in_thread

SPAN = session(6)[1:]


def summarize(fake: FakeUpstream, timeout_s: float = 5.0) -> tuple[str, str, float]:
    async def go() -> tuple[str, str, float]:
        with serve_in_thread(fake.app) as url:
            pool = TierPool(Tier.FAST, "model-fast", [url], BreakerSettings(), HealthSettings())
            async with aiohttp.ClientSession() as http:
                dispatcher = Dispatcher(
                    {Tier.FAST: pool}, http, TimeoutSettings(), RetrySettings(attempts=1),
                    Metrics(),
                )  # fmt: skip
                summarizer = Summarizer(
                    dispatcher, "model-fast", use_fast=True, max_tokens=400,
                    timeout_s=timeout_s, input_tokens=2000,
                )  # fmt: skip
                started = time.perf_counter()
                text, by = await summarizer(SPAN, "Facts and values learned:\n- port 8443")
                return text, by, time.perf_counter() - started

    return asyncio.run(go())


def test_the_fast_tier_writes_the_summary_from_instructions_and_a_transcript():
    fake = FakeUpstream("fast").then(
        Behaviour(message={"role": "assistant", "content": "Task:\n- fix tests"})
    )
    text, by, _ = summarize(fake)
    assert (text, by) == ("Task:\n- fix tests", "fast")
    (sent,) = fake.requests
    assert sent["model"] == "model-fast" and sent["messages"][0]["content"] == INSTRUCTIONS
    user = sent["messages"][1]["content"]
    assert "port 8443" in user and "checksum 1005" in user and "run_shell" in user


@pytest.mark.parametrize(
    "fault",
    [
        status(500),
        status(400, message="prompt too long"),
        Behaviour(message={"role": "assistant", "content": "   "}),
    ],
    ids=["500", "400", "empty"],
)
def test_a_failed_summary_falls_back_to_the_extractive_one(fault):
    text, by, _ = summarize(FakeUpstream("fast").then(fault))
    assert by == "extractive"
    assert "port 8443" in text and "checksum 1000" in text


def test_a_summary_that_takes_too_long_falls_back_in_time():
    fake = FakeUpstream("fast").then(Behaviour("stall"))
    text, by, took = summarize(fake, timeout_s=0.5)
    assert by == "extractive" and "checksum 1000" in text
    assert took < 3.0


def test_no_fast_tier_means_extractive_without_a_call():
    summarizer = Summarizer(
        None, None, use_fast=True, max_tokens=400, timeout_s=1, input_tokens=2000
    )  # fmt: skip
    text, by = asyncio.run(summarizer(SPAN, None))
    assert by == "extractive" and "checksum 1003" in text


def test_the_transcript_keeps_the_latest_messages_within_its_size():
    long = session(40)[1:]
    text = transcript(long, "earlier", 3000)
    assert len(text) <= 3000 + 100
    assert "checksum 1039" in text and "checksum 1000" not in text


def test_the_summary_request_fits_the_fast_tiers_window_whatever_the_text():
    dense = chat(40)  # "x x x": a token every two characters
    messages = _fitted(dense[1:], None, DEFAULT, 1500)
    assert DEFAULT.estimate({"messages": messages}) <= 1500
    assert "Which orders did we discuss?" in messages[1]["content"]  # the latest kept
