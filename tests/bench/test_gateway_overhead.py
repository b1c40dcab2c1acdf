"""bench.gateway_overhead's parts: the agent-sized body and its growing sessions, the mock's
``/tokenize``, the load generator's sessions, the summary's arithmetic and the stall
probe's report (the run itself: ``python -m bench.gateway_overhead``, in
test_quick.py and docs/benchmarks.md)."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time

import orjson

from bench import stall_probe
from bench.agent_body import agent_body, session_bodies
from bench.gateway_overhead import CONCURRENCY, MODES, cpu_by_process, summarize
from bench.loadgen import requests
from bench.mock_upstream import tokenize
from bench.procs import process_cpu_seconds, tree_cpu_seconds


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
        "gearshift": {"chat": cells_for(1.5, 0.3, 3000, 2), "agent": cells_for(3, 1.2, 900, 9)},
        "gearshift_op": {"chat": cells_for(2, 0.5, 2000, 9), "agent": cells_for(4, 2.0, 500, 30)},
        "litellm": {"chat": cells_for(12, 10, 100, 20), "agent": cells_for(20, 40, 25, 40)},
    }  # fmt: skip
    s = summarize(cells, "on")
    assert s["cpu_ratio_vs_litellm"] == 0.03  # light configuration, chat body
    assert s["cpu_ratio_vs_litellm_recording"] == 0.05
    assert s["cpu_ratio_vs_litellm_agent_body"] == 0.05
    # the agent body without recording, beside it: 1.2 of LiteLLM's 40
    assert s["cpu_ratio_vs_litellm_agent_body_light"] == 0.03
    assert s["cpu_ms_per_req_agent_body_light"] == 1.2 and s["added_p50_ms_agent_body_light"] == 1
    assert s["stream_cpu_ratio_vs_litellm_agent_body_light"] == 0.03
    assert "litellm_cpu_ms_per_req_agent_body_light" not in s  # LiteLLM's: under _agent_body
    assert s["added_p99_ms_recording"] == 1.0  # (2 + 1) - (1 + 1)
    assert s["added_p99_ms_agent_body"] == 2.0  # (4 + 1) - (2 + 1)
    assert s["max_stall_ms"] == 28.0  # agent: 30 - its upstream's p50 of 2
    assert s["stream_max_stall_ms"] == 28.0
    assert s["sustained_rps_agent_body"] == 250 and s["recorder_drain_s_agent_body"] == 1
    assert s["cpu_ms_per_req_by_concurrency"]["gearshift_op/agent"]["plain"][64] == 2.0
    assert "upstream" not in s["cpu_ms_per_req_by_concurrency"]
    without = summarize({k: v for k, v in cells.items() if k != "litellm"}, "on")
    assert "cpu_ratio_vs_litellm_recording" not in without and without["max_stall_ms"] == 28.0


def test_an_agent_session_grows_by_one_tool_call_and_its_result_per_step():
    steps = session_bodies(2)
    assert len(steps) == 15 and steps[-1] == agent_body(2)
    assert [len(s["messages"]) for s in steps] == list(range(2, 31, 2))
    for before, after in itertools.pairwise(steps):
        n = len(before["messages"])
        assert after["messages"][:n] == before["messages"]  # the history is sent again as is
        call, result = after["messages"][n:]
        assert call["role"] == "assistant" and result["role"] == "tool"
        assert result["tool_call_id"] == call["tool_calls"][0]["id"]


def test_the_load_generator_sends_each_session_in_order_under_its_own_id():
    workers = requests("auto", False, {"authorization": "Bearer k"}, None, sessions=True)
    first, second = list(next(workers)), list(next(workers))
    assert len(first) == len(second) == 15
    ids = {h["x-session-id"] for _, h in first} | {h["x-session-id"] for _, h in second}
    assert len(ids) == 2 and all(h["authorization"] == "Bearer k" for _, h in first)
    sizes = [len(orjson.loads(data)["messages"]) for data, _ in first]
    assert sizes == list(range(2, 31, 2))
    assert orjson.loads(first[0][0])["model"] == "auto"
    # concurrent workers, interleaved as at c=16: each keeps its own session's id
    a, b = next(workers), next(workers)
    steps = [(next(a), next(b)) for _ in range(15)]
    assert len({h["x-session-id"] for (_, h), _ in steps}) == 1
    assert len({h["x-session-id"] for _, (_, h) in steps}) == 1
    assert steps[0][0][1]["x-session-id"] != steps[0][1][1]["x-session-id"]
    # without --sessions: the one body, again and again, with no session id
    plain = next(requests("auto", True, {}, None, sessions=False))
    (a, ha), (b, _) = next(plain), next(plain)
    assert a == b and orjson.loads(a)["stream"] is True and "x-session-id" not in ha


def test_the_summary_has_the_growing_session_cells_beside_the_others():
    cells = {
        "upstream": {b: cells_for(1, float("nan"), 5000, 2) for b in ("chat", "agent", "session")},
        "gearshift_op": {"chat": cells_for(2, 0.5, 2000, 9), "agent": cells_for(4, 2.0, 500, 30),
                         "session": cells_for(3, 1.0, 800, 50)},
        "litellm": {b: cells_for(12, 10, 100, 20) for b in ("chat", "agent", "session")},
    }  # fmt: skip
    s = summarize(cells, "on")  # no light configuration in this run (--bodies without chat)
    assert (
        s["mock_answers"] == "session"
        and summarize(cells, "on", "canned")["mock_answers"] == "canned"
    )
    assert s["cpu_ratio_vs_litellm_agent_session"] == 0.1
    assert s["added_p99_ms_agent_session"] == 2.0 and s["added_p50_ms_agent_session"] == 2.0
    assert s["max_stall_ms"] == 49.0 and "cpu_ratio_vs_litellm" not in s
    assert s["cpu_ms_per_req_by_concurrency"]["gearshift_op/session"]["stream"][1] == 1.0


def test_the_stall_probe_sets_events_beside_the_slowest_requests(tmp_path, capsys):
    log = tmp_path / "probe.jsonl"
    events = [
        {"kind": "gc", "t": 100.010, "ms": 30.0, "gen": 2, "collected": 5, "cpu_ms": 29.0},
        {"kind": "lag", "t": 100.005, "ms": 40.0, "cpu_ms": 30.0, "process_cpu_ms": 31.0},
        {"kind": "call", "t": 200.0, "ms": 5.0, "name": "RouteStage.__call__", "cpu_ms": 4.0},
        {"kind": "gc_totals", "t": 300.0, "ms": 0.0, "totals": {"0": [9, 1.5, 3]}},
    ]
    log.write_text("".join(orjson.dumps(e).decode() + "\n" for e in events))
    slow = {"slowest": [[50.0, 100.0, 30], [3.0, 150.0, 2]]}
    out = stall_probe.report(log, {"session": {"plain": {1: slow}}})
    assert out["events"]["gc"] == (1, 30.0)
    assert out["events"]["call:RouteStage.__call__"] == (1, 5.0)
    assert out["slowest_with"] == {"gc": 1, "lag": 1} and out["gc_totals"] == {"0": [9, 1.5, 3]}
    printed = capsys.readouterr().out
    assert "gc(gen 2) 30.0 ms, 29.0 on CPU" in printed and "nothing over thresholds" in printed
    assert stall_probe.during(stall_probe.read(log), 199.999, 2.0) == [events[2]]


def test_the_cpu_split_names_each_child_and_adds_up_to_the_tree():
    burn = "import time\nt = time.process_time() + 0.3\nwhile time.process_time() < t: pass\n"
    burn += "print('ok', flush=True)\ntime.sleep(30)"
    argvs = {  # the role's marker in each command line, as serve and the recorder start them
        "sandbox": [sys.executable, "-c", burn, "-m", "sandbox", "--config", "x"],
        "writer": [sys.executable, "-c", burn, "-m", "gateway.recording.writer_process"],
        "other": [sys.executable, "-c", burn],
    }
    procs = {r: subprocess.Popen(a, stdout=subprocess.PIPE) for r, a in argvs.items()}
    try:
        for proc in procs.values():
            assert proc.stdout is not None and proc.stdout.readline() == b"ok\n"
        time.sleep(0.05)
        split = cpu_by_process(os.getpid())
        assert set(split) == {"gateway", "writer", "sandbox", "other"}
        for role in ("writer", "sandbox", "other"):
            assert split[role] >= 0.25  # its 0.3 s of CPU, at 10 ms ticks
        assert abs(split["gateway"] - process_cpu_seconds(os.getpid())) < 0.05
        assert abs(sum(split.values()) - tree_cpu_seconds(os.getpid())) < 0.05
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()


def test_the_summary_keeps_only_the_modes_that_ran_and_the_split_by_process():
    by_c = {c: cell(3, 4, 50, 1.0, 800) | {"cpu_ms_per_req_by_process": {"gateway": 0.7,
            "writer": 0.3, "sandbox": 0.0, "other": 0.0}} for c in CONCURRENCY}  # fmt: skip
    plain = {"plain": {c: cell(1, 2, 2, float("nan"), 5000) for c in CONCURRENCY}}
    s = summarize(
        {"upstream": {"session": plain}, "gearshift_op": {"session": {"plain": by_c}}}, "on"
    )
    assert (
        s["cpu_ms_per_req_agent_session"] == 1.0 and "stream_cpu_ms_per_req_agent_session" not in s
    )
    assert s["cpu_ms_per_req_by_process"]["session"]["plain"][64]["writer"] == 0.3
