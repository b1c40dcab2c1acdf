"""The outcome files' header line: what produced them, read back for the models' records."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from bench.router_outcomes import (
    DEFAULT_OUT,
    SAMPLED_OUT,
    answer,
    check_same_regime,
    collect,
    header,
    load,
)
from bench.router_tasks import Task


def test_header_is_the_first_line_and_not_an_outcome(tmp_path: Path):
    path = tmp_path / "o.jsonl"
    row = {"key": "k", "id": "i", "full": {"score": 1.0}, "fast": {"score": 0.0}}
    path.write_text(
        json.dumps({"models": ["m"], "fast_tier": {"mode": "lossy"}})
        + "\n"
        + json.dumps(row)
        + "\n"
    )
    assert header(path)["fast_tier"] == {"mode": "lossy"}
    assert list(load(path)) == ["k"]
    headless = tmp_path / "h.jsonl"
    headless.write_text(json.dumps(row) + "\n")
    assert header(headless) == {}
    empty = tmp_path / "e.jsonl"
    empty.write_text("")
    assert header(empty) == {}


def test_shipped_outcomes_name_the_fast_tier_they_measured():
    for path in (DEFAULT_OUT, SAMPLED_OUT):
        assert header(path)["fast_tier"]["prune_remove"] == 4


def test_full_from_reuses_the_full_tiers_outcomes_and_asks_only_the_fast_tier(tmp_path: Path):
    """After a change to the fast tier alone, only the fast tier is asked again."""
    asked: list[str] = []

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "full"}, {"id": "fast"}]})

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        asked.append(body["model"])
        if "take 3" in body["messages"][0]["content"] and body["model"] == "fast":
            return web.Response(status=500, text="Internal Server Error")  # a tier's failure
        message = {"role": "assistant", "content": "4" if body["model"] == "fast" else "5"}
        return web.json_response(
            {"choices": [{"message": message}], "usage": {"completion_tokens": 1}}
        )

    def task(n: int) -> Task:
        body = {"messages": [{"role": "user", "content": f"2 + 2, take {n}"}]}
        return Task(f"t{n}", "reasoning_gym", "sum", 1, body, lambda m: m["content"] == "4")

    reused, fresh, failing = task(1), task(2), task(3)
    earlier = tmp_path / "earlier.jsonl"
    full = {"score": 1.0, "tokens": 3, "seconds": 0.5}
    earlier.write_text(
        json.dumps({"samples": 1, "temperature": 0.0})
        + "\n"
        + json.dumps({"key": reused.key, "id": reused.id, "full": full, "fast": {"score": 0}})
        + "\n"
    )

    async def run() -> int:
        app = web.Application()
        app.router.add_get("/v1/models", models)
        app.router.add_post("/v1/chat/completions", chat)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            out = tmp_path / "out.jsonl"
            return await collect(
                f"http://127.0.0.1:{port}", out, [reused, fresh, failing], 2, full_from=earlier
            )
        finally:
            await runner.cleanup()

    assert asyncio.run(run()) == 3
    out = tmp_path / "out.jsonl"
    assert header(out)["full_from"] == "earlier.jsonl"
    rows = load(out)
    assert rows[reused.key]["full"] == full  # taken from the file, not asked
    assert rows[reused.key]["fast"]["score"] == 1.0
    assert rows[fresh.key]["full"]["score"] == 0.0  # not in the file: both tiers asked
    assert sorted(asked) == ["fast", "fast", "fast", "full", "full"]
    # a server error is the tier failing the task, kept with what it said
    assert rows[failing.key]["fast"]["score"] == 0.0
    assert rows[failing.key]["fast"]["error"] == "HTTP 500: Internal Server Error"

    check_same_regime(earlier, 1, 0.7)  # greedy: the temperature option is not used
    with pytest.raises(SystemExit, match=r"not 4 at 0\.7"):
        check_same_regime(earlier, 4, 0.7)
    with pytest.raises(SystemExit, match="no such file"):
        check_same_regime(tmp_path / "missing.jsonl", 1, 0.7)


def test_a_stack_that_is_stopping_ends_the_run_instead_of_scoring_the_tier():
    """A 503 (stopping, no healthy replica) is no outcome of the task; a 500 or 502 is."""
    stopping = Task("t4", "reasoning_gym", "sum", 1, {"messages": []}, lambda m: True)

    async def answer_while_stopping() -> None:
        async def shutting_down(_: web.Request) -> web.Response:
            return web.json_response({"error": {"code": "shutting_down"}}, status=503)

        app = web.Application()
        app.router.add_post("/v1/chat/completions", shutting_down)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        try:
            async with aiohttp.ClientSession() as session:
                url = f"http://127.0.0.1:{runner.addresses[0][1]}"
                await answer(session, url, "fast", stopping)
        finally:
            await runner.cleanup()

    with pytest.raises(RuntimeError, match="HTTP 503"):
        asyncio.run(answer_while_stopping())
