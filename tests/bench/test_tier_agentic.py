"""The agentic workload's loader and tool-call scorer, its replay against a scripted server,
and the session generator's seeded structure. (The real tiers: tests/e2e/test_tiers_quick.py.)"""

from __future__ import annotations

import json
from pathlib import Path

from bench.agentic_sessions import KINDS, tasks, tool_text
from bench.tier_agentic import DATA, Step, agreement, call_key, load, replay
from bench.tier_speed import Arm
from tests.support.servers import serve_in_thread


def _call(name: str, args: str) -> dict:
    return {"tool_calls": [{"id": "c", "type": "function", "function": {"name": name, "arguments": args}}]}  # fmt: skip


def _rows(tmp_path: Path) -> Path:
    path = tmp_path / "s.jsonl"
    rows = [
        {
            "session": s,
            "step": k,
            "forced": f,
            "request": {
                "model": "full",
                "messages": [{"role": "user", "content": s}],
                "max_tokens": 160,
            },
        }
        for s in ("a", "b", "c")
        for k, f in enumerate(["read_file", None])
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_load_takes_whole_sessions_in_order_and_caps_tokens(tmp_path):
    path = _rows(tmp_path)
    steps = load(path, sessions=2, max_tokens=16)
    assert [(s.session, s.step, s.forced) for s in steps] == [
        ("a", 0, "read_file"), ("a", 1, None), ("b", 0, "read_file"), ("b", 1, None),
    ]  # fmt: skip
    assert all("model" not in s.request and s.request["max_tokens"] == 16 for s in steps)
    assert len(load(path)) == 6 and load(path)[0].request["max_tokens"] == 160


def test_call_key_compares_parsed_arguments():
    assert call_key(_call("f", '{"b": 1, "a": [1, 2]}')) == call_key(
        _call("f", '{"a":[1,2],"b":1}')
    )
    assert call_key(_call("f", '{"a": 1}')) != call_key(_call("g", '{"a": 1}'))
    assert call_key(_call("f", '{"a": 1}')) != call_key(_call("f", '{"a": 10}'))
    assert call_key(_call("f", '{"a": ')) == ("f", '{"a": ')  # not JSON: compared as text
    assert call_key({"content": "hi"}) is None and call_key(None) is None


def test_agreement_scores_tool_steps_by_call_and_free_steps_by_text():
    steps = [Step(s, k, f, {}) for s in "abcd" for k, f in enumerate(["run_python", "read_file", None])]  # fmt: skip
    ref = [_call("run_python", '{"code": "1"}'), _call("read_file", '{"path": "x"}'), {"content": "done"}] * 4  # fmt: skip
    same = [_call("run_python", '{ "code":"1" }'), _call("read_file", '{"path": "x"}'), {"content": "done"}]  # fmt: skip
    other = [_call("run_python", '{"code": "2"}'), {"content": None}, {"content": "done!"}]
    got = agreement(steps, ref, same * 3 + other, boot=500)
    assert got["tool_steps"] == 8 and got["free_steps"] == 4
    assert got["toolcall_agreement"] == 0.75 and got["free_text_identical"] == 0.75
    lo, hi = got["ci"]
    assert 0 <= lo < 0.75 <= hi == 1.0  # sessions resampled: a draw without "d" is 1.0
    assert agreement(steps, ref, ref, boot=100)["ci"] == [1.0, 1.0]


async def _scripted(scope, receive, send):  # "full" and "fast" differ on the second step
    if scope["type"] != "http":
        return
    raw = b""
    while True:
        msg = await receive()
        raw += msg.get("body", b"")
        if not msg.get("more_body"):
            break
    body = json.loads(raw)
    step = len(body["messages"])
    args = '{"path": "a.csv"}' if body["model"] == "full" or step == 1 else '{"path": "b.csv"}'
    message = {"role": "assistant", "content": None, **_call("read_file", args)}
    data = {"choices": [{"index": 0, "message": message}], "usage": {"completion_tokens": 5}}
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json")]})  # fmt: skip
    await send({"type": "http.response.body", "body": json.dumps(data).encode()})


async def test_replay_measures_every_arm_and_scores_against_the_first():
    steps = [
        Step(s, k, "read_file", {"messages": [{"role": "user", "content": "x"}] * (k + 1)})
        for s in ("a", "b")
        for k in range(2)
    ]
    with serve_in_thread(_scripted) as url:
        got = await replay([Arm("full", url, "full"), Arm("fast", url, "fast")], steps, (1, 4), boot=200)  # fmt: skip
    assert got["fast"]["speed"]["c1"]["answers"] == 4 == got["full"]["speed"]["c4"]["answers"]
    assert got["fast"]["speed"]["length_ratio_c1"] == 1.0
    assert got["fast"]["agreement"]["toolcall_agreement"] == 0.5
    assert "agreement" not in got["full"]


def test_sessions_are_seeded_and_cover_every_kind():
    first, again = tasks(12), tasks(12)
    assert first == again and tasks(12, seed=5) != first
    assert {t.kind for _, t in first} == set(KINDS)
    assert all(3 <= len(t.plan) <= 7 and t.files for _, t in first)  # 4 to 8 model steps
    assert len({n for n, _ in first}) == 12


def test_tool_text_is_what_an_agent_feeds_back():
    assert tool_text(200, {"stdout": "ok\n", "stderr": "", "exit_status": 0}) == "ok\n"
    failed = tool_text(200, {"stdout": "", "stderr": "Traceback\n", "exit_status": 1})
    assert failed == "Traceback\n\n[exit status 1]"
    assert tool_text(200, {"output": {"content": "a,b"}}) == '{"content": "a,b"}'
    assert tool_text(403, {"error": {"message": "denied"}}) == "error: denied"
    assert len(tool_text(200, {"stdout": "x" * 10_000, "exit_status": 0})) == 3000


def test_the_stored_sessions_are_replayable():
    """The committed file: whole sessions of every kind, tool steps forced by name, and
    every request a chat body with the sandbox's tools."""
    steps = load(DATA)
    sessions: dict[str, list[Step]] = {}
    for s in steps:
        sessions.setdefault(s.session, []).append(s)
    assert len(sessions) >= 12 and len({s.split("-")[0] for s in sessions}) == 6
    for run in sessions.values():
        assert [s.step for s in run] == list(range(len(run)))
        assert all(s.request["tools"] and s.request["messages"] for s in run)
        for s in run:
            forced = s.request.get("tool_choice")
            assert (forced is None) == (s.forced is None)
            assert forced is None or forced["function"]["name"] == s.forced
    # a session ends early where the model did not make the forced call (it ran to
    # max_tokens); the others run their whole plan of 4 to 8 steps, the last one free
    ended = [r for r in sessions.values() if r[-1].forced is None]
    assert len(ended) >= len(sessions) / 2 and all(4 <= len(r) <= 8 for r in ended)
