"""Budgets and revocation across two gateway processes sharing one store (SQLite and
PostgreSQL): 50 concurrent requests against a budget that allows 10 admit exactly 10, and a
key revoked through one process is refused by the other within a second."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from gateway.cli.main import main
from tests.deploy import processes
from tests.support.fake_upstream import Behaviour, FakeUpstream
from tests.support.servers import serve_in_thread

MAX_TOKENS = 100
ALLOWED = 10
BODY = orjson.dumps(
    {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": MAX_TOKENS}
)
RESERVES = math.ceil(len(BODY) / 4) + MAX_TOKENS  # gateway.access.admission.estimate


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> list[dict[str, Any]]:
    assert main(["--log-level", "warning", "keys", *argv]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines() if line]


@contextlib.contextmanager
def gateway(tmp: Path, name: str, store: str, replica: str) -> Iterator[str]:
    """`gearshift serve` from this checkout on ``store``, once it is ready."""
    config = {
        "auth": {"mode": "keys", "refresh_s": 0.5},
        "tiers": {"full": {"model": "m", "replicas": [replica]}},
        "store": {"url": store, "dead_letter_path": str(tmp / f"{name}.jsonl")},
        "sandbox": {"enabled": False},
        "router": {"calibrate_tokens": False},
    }
    with processes.gateway(tmp, name, config) as served:
        yield served.url


async def burst(urls: list[str], key: str, count: int) -> list[httpx.Response]:
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    limits = httpx.Limits(max_connections=count)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        return await asyncio.gather(
            *[
                client.post(urls[i % 2] + "/v1/chat/completions", content=BODY, headers=headers)
                for i in range(count)
            ]
        )


def test_a_budget_holds_across_two_processes_and_revocation_reaches_both(
    store_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    # Every admitted request waits 2 s upstream: all 50 are decided before any settles, so
    # the budget admits exactly the requests whose reservations fit.
    upstream = FakeUpstream().then(*[Behaviour(delay_s=2.0) for _ in range(60)])
    bot = cli(capsys, "create", "--tenant", "acme", "--name", "bot", "--store", store_url)[0]
    root = cli(capsys, "create", "--tenant", "ops", "--name", "root", "--admin",
               "--store", store_url)[0]  # fmt: skip
    cap = ALLOWED * RESERVES + RESERVES // 2
    cli(capsys, "limits", "set", "acme", "--per-day", str(cap), "--store", store_url)
    with (
        serve_in_thread(upstream.app) as replica,
        gateway(tmp_path, "a", store_url, replica) as a,
        gateway(tmp_path, "b", store_url, replica) as b,
    ):
        answers = asyncio.run(burst([a, b], bot["key"], 50))
        codes = sorted(r.status_code for r in answers)
        assert codes.count(200) == ALLOWED, codes
        refused = [r for r in answers if r.status_code != 200]
        assert {r.json()["error"]["code"] for r in refused} == {"budget_exceeded"}
        assert all(int(r.headers["retry-after"]) >= 1 for r in refused)
        assert {r.status_code for r in refused} == {403}

        usage = _settled(capsys, store_url)
        assert usage["used"] == ALLOWED * 11 <= cap  # the fake's real usage, no overshoot

        headers = {"authorization": f"Bearer {bot['key']}"}
        assert httpx.get(b + "/v1/models", headers=headers).status_code == 200
        revoke = httpx.delete(
            f"{a}/admin/v1/keys/{bot['id']}", headers={"authorization": f"Bearer {root['key']}"}
        )
        assert revoke.status_code == 200, revoke.text
        revoked_at = time.monotonic()
        assert httpx.get(a + "/v1/models", headers=headers).status_code == 401  # at once
        while httpx.get(b + "/v1/models", headers=headers).status_code != 401:
            assert time.monotonic() - revoked_at < 1.0, "process b still accepts a revoked key"
            time.sleep(0.02)


def _settled(capsys: pytest.CaptureFixture[str], store: str) -> dict[str, Any]:
    deadline = time.monotonic() + 10
    while True:
        rows = cli(capsys, "usage", "acme", "--store", store)
        day = [r for r in rows if len(r["window"]) == 10 and r["key_name"] is None]
        if (day and day[0]["reserved"] == 0) or time.monotonic() > deadline:
            return day[0]
        time.sleep(0.1)
