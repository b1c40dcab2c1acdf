"""bench.tiers' speed measurement against a scripted streaming server: both tiers take
turns prompt by prompt and batch by batch, every round measures the same answers, and the
figures it reports are the ones it counted. (The real tiers are measured by the benchmark
itself; this checks the bookkeeping, not a speed.)"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from bench.tiers import FAST, FULL, QUESTIONS, speeds

TOKENS = {FULL: 6, FAST: 9}  # completion tokens each tier streams per answer


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, list[str]]]:
    seen: list[str] = []

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        model = body["model"]
        seen.append(model)
        n = min(TOKENS[model], body["max_tokens"])
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(n):
            event = {"choices": [{"index": 0, "delta": {"content": f"t{i} "}}]}
            await resp.write(f"data: {json.dumps(event)}\n\n".encode())
            await asyncio.sleep(0.001)
        usage = {"choices": [], "usage": {"completion_tokens": n}}
        await resp.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        await runner.cleanup()


async def test_tiers_take_turns_and_every_round_is_reported(server):
    url, seen = server
    async with aiohttp.ClientSession() as session:
        tiers, rounds = await speeds(session, url, max_tokens=32, rounds=2)

    prompts = len(QUESTIONS)
    per_round = 2 * 2 * prompts  # both tiers, each prompt alone and in a batch of four
    sequential = seen[: 2 * prompts]  # the unmeasured warm-up round comes first, the same way
    # concurrency 1: each prompt goes to both tiers back to back, the first alternating
    pairs = [sequential[i : i + 2] for i in range(0, len(sequential), 2)]
    assert all(sorted(p) == [FAST, FULL] for p in pairs)
    assert [p[0] for p in pairs[:4]] == [FULL, FAST, FULL, FAST]
    # each tier got every prompt once per round at c=1 and once per round in batches of four,
    # in the warm-up round and the two measured ones
    assert len(seen) == 3 * per_round and seen.count(FULL) == seen.count(FAST)
    second = seen[per_round : per_round + 2 * prompts]
    assert second[0] == FAST  # the next round starts with the other tier

    assert len(rounds) == 2 and all(set(r) == {"speedup_c1", "speedup_c4"} for r in rounds)
    assert all(r["speedup_c1"] > 0 and r["speedup_c4"] > 0 for r in rounds)
    # one round's answers, as before rounds existed
    assert tiers[FULL]["tokens_c1"] == TOKENS[FULL] * prompts
    assert tiers[FAST]["tokens_c1"] == TOKENS[FAST] * prompts
    assert tiers[FULL]["tok_s_c1"] > 0 and tiers[FAST]["tok_s_c4"] > 0


def test_a_run_names_the_build_it_measured(tmp_path):
    """Two builds of the same settings differ in speed (docs/fast-tier.md): the run records
    which weights the fast server served, as vLLM's /v1/models names their folder."""
    import hashlib

    from bench.tiers import served_build
    from tests.support.servers import serve_in_thread

    (tmp_path / "model.safetensors").write_bytes(b"weights")
    report = {"perplexity": {"full": 26.92, "pruned": 41.6, "healed": 30.4}}
    (tmp_path / "gearshift-prune.json").write_text(json.dumps(report))

    async def models(scope, receive, send):  # a minimal ASGI stand-in for vLLM's /v1/models
        assert scope["path"] == "/v1/models"
        body = json.dumps({"data": [{"id": "fast", "root": str(tmp_path)}]}).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})  # fmt: skip
        await send({"type": "http.response.body", "body": body})

    async def app(scope, receive, send):
        if scope["type"] == "http":
            await models(scope, receive, send)

    with serve_in_thread(app) as url:
        build = served_build(url)
    assert build == {
        "model_dir": str(tmp_path),
        "weights_sha256": hashlib.sha256(b"weights").hexdigest()[:12],
        "perplexity": report["perplexity"],
    }
