"""PostgreSQL goes away under a running gateway and comes back: no request fails or waits on
it, and every step made during the outage is in the store afterwards (nothing dropped,
nothing dead-lettered). The server is real (its own cluster, stopped with ``pg_ctl``)."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.support.fake_upstream import FakeUpstream
from tests.support.postgres import postgres_cluster

MESSAGES = [{"role": "user", "content": "hi"}]


def _ask(url: str) -> str:
    started = time.monotonic()
    r = httpx.post(url + "/v1/chat/completions", json={"model": "full", "messages": MESSAGES})
    assert r.status_code == 200, r.text
    assert time.monotonic() - started < 5  # the request path never waits for the database
    return r.headers["x-gearshift-step-id"]


def _stored(url: str, step_ids: list[str], timeout: float) -> list[str]:
    """The steps not (yet) readable back after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    missing = list(step_ids)
    while missing and time.monotonic() < deadline:
        r = httpx.get(f"{url}/v1/steps/{missing[0]}", timeout=timeout)
        if r.status_code == 200:
            missing.pop(0)
        else:
            time.sleep(0.2)
    return missing


@pytest.mark.parametrize("mode", ["fast", "immediate"])  # a clean shutdown, and a crash
def test_postgres_outage_loses_no_step(make_stack, tmp_path: Path, mode: str):
    with postgres_cluster() as pg:
        stack = make_stack([FakeUpstream()], store={"url": pg.url})
        before = [_ask(stack.url) for _ in range(5)]
        assert _stored(stack.url, before, 30) == []

        pg.stop(mode)  # every session ends; new connections are refused
        during = [_ask(stack.url) for _ in range(20)]
        time.sleep(1.0)  # the writer meets the outage and starts retrying
        pg.start()

        assert _stored(stack.url, during, 60) == []
        after = [_ask(stack.url) for _ in range(5)]
        assert _stored(stack.url, after, 30) == []
    assert stack.metric("gearshift_recorder_dropped_total", {"reason": "queue_full"}) == 0
    assert not (tmp_path / "dead-letter.jsonl").exists()
