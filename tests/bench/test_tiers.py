"""bench.tiers' bookkeeping against a scripted OpenAI server: the arms take turns on the same
requests, time per answer and requests/s are what was counted, the ratios are against the full
tier, quality is paired per task with a bootstrap interval, and the int4 packing is GPTQ's.
(The real tiers are measured by the benchmark itself and by tests/e2e/test_tiers_quick.py.)"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from bench.tier_prompts import per_family, repetitive_bodies, split_tasks
from bench.tier_quality import report, retention
from bench.tier_speed import Arm, compare, measure

TOKENS = {"full": 6, "fast": 9}  # completion tokens each arm answers with
DELAY = {"full": 0.04, "fast": 0.02}  # seconds per answer


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, list[str]]]:
    seen: list[str] = []

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append(body["model"])
        assert body["temperature"] == 0
        await asyncio.sleep(DELAY[body["model"]])
        usage = {"completion_tokens": TOKENS[body["model"]]}
        return web.json_response({"choices": [{"message": {"content": "x"}}], "usage": usage})

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


async def test_arms_take_turns_and_the_ratios_are_per_answer(server):
    url, seen = server
    arms = [Arm("full", url, "full"), Arm("fast", url, "fast")]
    bodies = [{"messages": [{"role": "user", "content": f"q{i}"}], "max_tokens": 8} for i in range(8)]  # fmt: skip
    figures = await measure(arms, bodies, concurrencies=(1, 4))

    assert seen[:2] == ["full", "fast"]  # one warm-up request each, unmeasured
    c1 = seen[2 : 2 + 16]
    pairs = [c1[i : i + 2] for i in range(0, 16, 2)]
    assert all(sorted(p) == ["fast", "full"] for p in pairs)
    assert [p[0] for p in pairs[:3]] == ["full", "fast", "full"]  # the order rotates
    assert len(seen) == 2 + 2 * 16 and seen.count("full") == seen.count("fast")

    for name in ("full", "fast"):
        assert figures[name]["c1"]["answers"] == 8 and figures[name]["c4"]["answers"] == 8
        assert figures[name]["c1"]["tokens"] == TOKENS[name]
        assert figures[name]["c1"]["s_per_answer"] >= DELAY[name]
    ratios = compare(figures, "full")["fast"]
    assert ratios["length_ratio_c1"] == pytest.approx(9 / 6)
    # the fast arm answers in half the time: about 2x per answer, more than 1x at c=4
    assert 1.3 < ratios["answer_speedup_c1"] < 2.5
    assert ratios["rps_speedup_c4"] > 1.2
    # tokens/s flatters the arm that writes more: 2x the speed times 1.5x the tokens
    assert ratios["tok_s_speedup_c1"] > ratios["answer_speedup_c1"]


def test_retention_is_paired_and_its_interval_brackets_it():
    pairs = [("a", 1.0, 1.0)] * 30 + [("a", 1.0, 0.0)] * 10 + [("b", 0.0, 1.0)] * 5
    r = report(pairs, boot=500)
    assert r["tasks"] == 45
    assert r["quality_retention"] == pytest.approx(35 / 40, abs=1e-3)
    low, high = r["ci"]
    assert low < r["quality_retention"] < high
    assert r["per_source"]["a"]["quality_retention"] == 0.75
    assert r["per_source"]["b"]["quality_retention"] is None  # the full tier scored nothing
    same = retention([("a", 1.0, 1.0), ("a", 0.0, 0.0)] * 10, boot=200)
    assert same["quality_retention"] == 1.0 and same["ci"] == [1.0, 1.0]
    assert retention([], boot=10)["ci"] is None


def test_speed_and_quality_samples_come_from_one_side_of_the_locked_split():
    test, dev = split_tasks("test"), split_tasks("dev")
    assert not {t.id for t in test} & {t.id for t in dev}
    sample = per_family(test, 2)
    assert {t.id for t in sample} <= {t.id for t in test}
    families = {(t.source, t.category) for t in test}
    assert len(sample) == 2 * len(families)
    assert per_family(test, 2) == sample  # depends on the requests only
    rep = repetitive_bodies(3)
    assert rep == repetitive_bodies(3) and len({json.dumps(b) for b in rep}) == 3


def test_int4_packing_is_gptq_and_round_trips():
    torch = pytest.importorskip("torch")
    from bench.quantize_int4 import GROUP, quantize

    weight = torch.randn(64, 96)  # [out, in], as nn.Linear stores it
    qweight, scales, qzeros, g_idx = quantize(weight)
    assert qweight.shape == (96 // 8, 64) and qweight.dtype == torch.int32
    assert scales.shape == (96 // GROUP, 64) and qzeros.shape == (96 // GROUP, 64 // 8)
    assert g_idx.tolist() == [i // GROUP for i in range(96)]
    nibbles = torch.stack([(qweight >> (4 * i)) & 0xF for i in range(8)], dim=1).view(96, 64)
    restored = (nibbles - 8).float() * scales.float().repeat_interleave(GROUP, dim=0)
    err = (restored - weight.t()).abs()
    assert torch.all(err <= scales.float().repeat_interleave(GROUP, dim=0) / 2 + 1e-3)


def test_a_run_names_the_build_it_measured(tmp_path):
    """Two builds of the same settings differ in speed (docs/fast-tier.md): the run records
    which weights the fast server served, as vLLM's /v1/models names their folder."""
    import hashlib

    from bench.tiers import served_build
    from tests.support.servers import serve_in_thread

    (tmp_path / "model.safetensors").write_bytes(b"weights")
    pruning = {"perplexity": {"full": 26.92, "pruned": 41.6, "healed": 30.4}}
    (tmp_path / "gearshift-prune.json").write_text(json.dumps(pruning))

    async def app(scope, receive, send):  # a minimal ASGI stand-in for vLLM's /v1/models
        if scope["type"] != "http":
            return
        assert scope["path"] == "/v1/models"
        body = json.dumps({"data": [{"id": "fast", "root": str(tmp_path)}]}).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})  # fmt: skip
        await send({"type": "http.response.body", "body": body})

    with serve_in_thread(app) as url:
        build = served_build(url)
    assert build == {
        "model_dir": str(tmp_path),
        "weights_sha256": hashlib.sha256(b"weights").hexdigest()[:12],
        "perplexity": pruning["perplexity"],
    }


def test_a_run_ends_with_the_headline_json(capsys):
    """The whole command against a scripted server: speed and quality (every answer "x"),
    then quality alone, which once lost its results for want of a speed entry."""
    from bench.tiers import main
    from tests.support.servers import serve_in_thread

    async def app(scope, receive, send):  # every model answers "x" in 6 tokens
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        body = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": "x"}}],
                           "usage": {"completion_tokens": 6}}).encode()  # fmt: skip
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})  # fmt: skip
        await send({"type": "http.response.body", "body": body})

    with serve_in_thread(app) as url:
        arms = ["--arm", f"full={url}", "--arm", f"fast={url}", "--quick"]
        both = main(arms)
        alone = main(
            [*arms, "--speed-per-family", "0", "--repetitive", "0", "--agentic-sessions", "0"]
        )
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last == alone
    assert both["headline"] == "fast" and both["answer_speedup_c1"] > 0
    assert both["length_ratio_c1"] == 1.0 and both["rps_speedup_c4"] > 0
    # --quick's agentic cell: the first step of two sessions, concurrency 1 only
    assert both["arms"]["fast"]["agentic_toolcall"]["tool_steps"] == 2
    assert both["agentic_toolcall_agreement"] == 1.0 and both["agentic_rps_speedup_c4"] is None
    for result in (both, alone):
        greedy = result["arms"]["fast"]["quality"]["greedy"]
        # the same answers on both arms: BFCL's irrelevance task is right (no tool called)
        assert greedy["tasks"] == 3 and greedy["full"] == greedy["candidate"] == round(1 / 3, 4)
        assert result["quality_retention"] == 1.0 == result["quality_retention_ci_low"]
    assert "speed" not in alone["arms"]["fast"]
