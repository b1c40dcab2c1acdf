"""bench.gateway_overhead's parts: the agent-sized body, the mock's ``/tokenize``, and the
summary's arithmetic (the run itself: ``python -m bench.gateway_overhead``, in
test_quick.py and docs/benchmarks.md)."""

from __future__ import annotations

import orjson

from bench.agent_body import agent_body
from bench.gateway_overhead import CONCURRENCY, MODES, summarize
from bench.mock_upstream import tokenize


def test_the_agent_body_is_a_deterministic_tool_loop_of_about_39_kb():
    body = agent_body()
    assert body == agent_body() and agent_body(1) != body
    assert 37_000 <= len(orjson.dumps(body)) <= 41_000
    messages = body["messages"]
    assert len(messages) == 30 and len(body["tools"]) == 8
    assert [m["role"] for m in messages[:2]] == ["system", "user"]
    assert [m["role"] for m in messages[2:]] == ["assistant", "tool"] * 14
    for call, result in zip(messages[2::2], messages[3::2], strict=True):
        assert call["tool_calls"][0]["id"] == result["tool_call_id"]
        orjson.loads(call["tool_calls"][0]["function"]["arguments"])
        assert 1400 <= len(result["content"].encode()) <= 2000
    names = {t["function"]["name"] for t in body["tools"]}
    assert {c["tool_calls"][0]["function"]["name"] for c in messages[2::2]} <= names


def test_the_mock_tokenizes_like_vllm_and_alike_for_every_model():
    full = orjson.loads(tokenize(b'{"model": "mock-full", "prompt": "hello there"}'))
    fast = orjson.loads(tokenize(b'{"prompt": "hello there", "model": "mock-fast"}'))
    assert set(full) == {"count", "max_model_len", "tokens", "token_strs"}
    assert full == fast and full["count"] == len(full["tokens"]) > 0
    other = orjson.loads(tokenize(b'{"model": "mock-full", "prompt": "goodbye"}'))
    assert other["tokens"] != full["tokens"]


def cell(p50: float, p99: float, top: float, cpu: float, rps: float) -> dict[str, float]:
    return {"p50_ms": p50, "p99_ms": p99, "max_ms": top, "cpu_ms_per_req": cpu, "rps": rps,
            "sustained_rps": rps / 2, "drain_s": 1.0, "errors": 0}  # fmt: skip


def cells_for(p50: float, cpu: float, rps: float, top: float) -> dict[str, dict[int, dict]]:
    return {mode: {c: cell(p50, p50 + 1, top, cpu, rps) for c in CONCURRENCY} for mode in MODES}


def test_the_summary_compares_each_body_with_its_own_baseline():
    cells = {
        "upstream": {"chat": cells_for(1, float("nan"), 5000, 2),
                     "agent": cells_for(2, float("nan"), 3000, 3)},
        "gearshift": {"chat": cells_for(1.5, 0.3, 3000, 2)},
        "gearshift_op": {"chat": cells_for(2, 0.5, 2000, 9), "agent": cells_for(4, 2.0, 500, 30)},
        "litellm": {"chat": cells_for(12, 10, 100, 20), "agent": cells_for(20, 40, 25, 40)},
    }  # fmt: skip
    s = summarize(cells, "on")
    assert s["cpu_ratio_vs_litellm"] == 0.03  # light configuration, chat body
    assert s["cpu_ratio_vs_litellm_recording"] == 0.05
    assert s["cpu_ratio_vs_litellm_agent_body"] == 0.05
    assert s["added_p99_ms_recording"] == 1.0  # (2 + 1) - (1 + 1)
    assert s["added_p99_ms_agent_body"] == 2.0  # (4 + 1) - (2 + 1)
    assert s["max_stall_ms"] == 28.0  # agent: 30 - its upstream's p50 of 2
    assert s["stream_max_stall_ms"] == 28.0
    assert s["sustained_rps_agent_body"] == 250 and s["recorder_drain_s_agent_body"] == 1
    assert s["cpu_ms_per_req_by_concurrency"]["gearshift_op/agent"]["plain"][64] == 2.0
    assert "upstream" not in s["cpu_ms_per_req_by_concurrency"]
    without = summarize({k: v for k, v in cells.items() if k != "litellm"}, "on")
    assert "cpu_ratio_vs_litellm_recording" not in without and without["max_stall_ms"] == 28.0
