"""Recording through the gateway: what vLLM returned is stored, what the client sees is unchanged.

The fake replica behaves like vLLM for the capture fields (``return_token_ids``,
``logprobs``; two tokens per stream chunk as with speculative decoding); the store
is a real SQLite file. The end-to-end tests repeat the token-id check against vLLM.
"""

from __future__ import annotations

import httpx
import orjson

from tests.integration.conftest import Stack
from tests.support.fake_upstream import Behaviour, FakeUpstream, fake_ids
from tests.support.tools import WEATHER_TOOLS

MESSAGES = [{"role": "user", "content": "hi"}]
TOOLS = WEATHER_TOOLS


def call(stack: Stack, body: dict, headers: dict | None = None) -> httpx.Response:
    r = httpx.post(stack.url + "/v1/chat/completions", json=body, headers=headers or {})
    assert r.status_code == 200, r.text
    return r


def get(stack: Stack, path: str) -> dict:
    r = httpx.get(stack.url + path)
    assert r.status_code == 200, r.text
    return r.json()


def test_non_stream_records_exact_tokens_and_hides_them(make_stack):
    stack = make_stack([FakeUpstream()])
    r = call(stack, {"model": "full", "messages": MESSAGES})
    data = r.json()
    assert data.get("prompt_token_ids") is None  # vLLM's own null: the client did not ask
    assert data["choices"][0].get("token_ids") is None
    assert data["choices"][0]["logprobs"] is None
    step = get(stack, "/v1/steps/" + r.headers["x-gearshift-step-id"])
    assert step["prompt_token_ids"] == list(range(1, 8))
    assert step["completion_token_ids"] == fake_ids(0, 4)
    assert step["logprobs"] == [0.0, -0.1, -0.2, -0.3] or all(
        abs(a - b) < 1e-6 for a, b in zip(step["logprobs"], [0.0, -0.1, -0.2, -0.3], strict=True)
    )
    assert step["tier"] == "full" and step["status"] == 200 and step["seq"] == 0
    assert step["response"]["content"] == "hello from fake"


def test_client_that_asked_keeps_its_logprobs_and_ids(make_stack):
    stack = make_stack([FakeUpstream()])
    r = call(
        stack,
        {"model": "full", "messages": MESSAGES, "logprobs": True, "return_token_ids": True},
    )
    choice = r.json()["choices"][0]
    assert choice["token_ids"] == fake_ids(0, 4)
    assert len(choice["logprobs"]["content"]) == 4


def test_n_choices_become_one_step_each(make_stack):
    stack = make_stack([FakeUpstream()])
    r = call(stack, {"model": "full", "messages": MESSAGES, "n": 3})
    ids = r.headers["x-gearshift-step-id"].split(",")
    assert len(ids) == 3
    steps = [get(stack, "/v1/steps/" + i) for i in ids]
    assert [s["choice_index"] for s in steps] == [0, 1, 2]
    assert [s["completion_token_ids"] for s in steps] == [fake_ids(i, 4) for i in range(3)]


def test_stream_with_several_tokens_per_chunk_is_assembled(make_stack):
    stack = make_stack([FakeUpstream()])
    with httpx.stream(
        "POST",
        stack.url + "/v1/chat/completions",
        json={"model": "full", "messages": MESSAGES, "stream": True},
    ) as r:
        step_id = r.headers["x-gearshift-step-id"]
        body = b"".join(r.iter_bytes())
    events = [orjson.loads(e[5:]) for e in body.split(b"\n\n") if e and e != b"data: [DONE]"]
    assert all(c.get("token_ids") is None for e in events for c in e["choices"])
    assert all(c.get("logprobs") is None for e in events for c in e["choices"])
    assert all(e.get("prompt_token_ids") is None for e in events)
    step = get(stack, "/v1/steps/" + step_id)
    assert step["prompt_token_ids"] == list(range(1, 8))
    assert step["completion_token_ids"] == list(range(100, 110))  # 5 chunks x 2 tokens
    assert len(step["logprobs"]) == 10
    assert step["response"]["content"] == "tok0 tok1 tok2 tok3 tok4 "


def test_steps_chain_into_one_session_without_a_header(make_stack):
    stack = make_stack([FakeUpstream()])
    first = call(stack, {"model": "full", "messages": MESSAGES})
    answer = first.json()["choices"][0]["message"]
    history = [*MESSAGES, answer, {"role": "user", "content": "and then?"}]
    second = call(stack, {"model": "full", "messages": history})
    a = get(stack, "/v1/steps/" + first.headers["x-gearshift-step-id"])
    b = get(stack, "/v1/steps/" + second.headers["x-gearshift-step-id"])
    assert a["session_id"] == b["session_id"]
    assert (a["seq"], b["seq"]) == (0, 1)
    assert b["rewritten"] is False
    other = call(stack, {"model": "full", "messages": [{"role": "user", "content": "new"}]})
    c = get(stack, "/v1/steps/" + other.headers["x-gearshift-step-id"])
    assert c["session_id"] != a["session_id"]


def test_named_session_detects_rewritten_history(make_stack):
    stack = make_stack([FakeUpstream()])
    h = {"x-session-id": "agent-7"}
    first = call(stack, {"model": "full", "messages": MESSAGES}, h)
    answer = first.json()["choices"][0]["message"]
    call(
        stack,
        {"model": "full", "messages": [*MESSAGES, answer, {"role": "user", "content": "more"}]},
        h,
    )
    summary = [{"role": "user", "content": "summary of the above; continue"}]
    third = call(stack, {"model": "full", "messages": summary}, h)
    s = get(stack, "/v1/sessions/agent-7")
    assert [st["seq"] for st in s["steps"]] == [0, 1, 2]
    assert [st["rewritten"] for st in s["steps"]] == [False, False, True]
    assert s["steps"][2]["id"] == third.headers["x-gearshift-step-id"]


def test_tool_calls_results_and_rewards(make_stack):
    tool_call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    message = {"role": "assistant", "content": None, "tool_calls": [tool_call]}
    up = FakeUpstream().then(Behaviour(message=message), Behaviour(message=message))
    stack = make_stack([up])
    h = {"x-session-id": "tools-1"}
    r1 = call(stack, {"model": "full", "messages": MESSAGES, "tools": TOOLS}, h)
    history = [
        *MESSAGES,
        r1.json()["choices"][0]["message"],
        {"role": "tool", "tool_call_id": "call_1", "content": "Error: weather service down"},
    ]
    call(stack, {"model": "full", "messages": history, "tools": TOOLS}, h)  # same call again
    s = get(stack, "/v1/sessions/tools-1")
    names = [(r["scope"], r["name"], r["value"]) for r in s["rewards"]]
    assert ("step", "tool_call_valid", 1.0) in names
    assert ("tool_call", "tool_success", -1.0) in names  # the result read as an error
    assert ("tool_call", "repeated_tool_call", -1.0) in names
    assert len([n for n in names if n[1] == "repeated_tool_call"]) == 1


def test_invalid_tool_arguments_are_penalised(make_stack):
    bad = {
        "id": "c",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"town": 1}'},
    }
    up = FakeUpstream().then(
        Behaviour(message={"role": "assistant", "content": None, "tool_calls": [bad]})
    )
    stack = make_stack([up])
    r = call(
        stack, {"model": "full", "messages": MESSAGES, "tools": TOOLS}, {"x-session-id": "bad"}
    )
    s = get(stack, "/v1/sessions/bad")
    assert {
        "scope": "step",
        "name": "tool_call_valid",
        "value": -1.0,
        "step_id": r.headers["x-gearshift-step-id"],
    } in s["rewards"]


def test_failed_requests_are_recorded_with_their_error(make_stack):
    from tests.support.fake_upstream import status

    up = FakeUpstream().then(status(500), status(500), status(500))
    stack = make_stack([up])
    r = httpx.post(
        stack.url + "/v1/chat/completions",
        json={"model": "full", "messages": MESSAGES},
        headers={"x-session-id": "failing"},
    )
    assert r.status_code == 502
    s = get(stack, "/v1/sessions/failing")
    assert s["steps"][0]["status"] == 502
    assert any(rw["name"] == "failed" and rw["value"] == -1.0 for rw in s["rewards"])


def test_completions_endpoint_records_tokens(make_stack):
    stack = make_stack([FakeUpstream()])
    r = httpx.post(stack.url + "/v1/completions", json={"model": "full", "prompt": "Once"})
    assert r.status_code == 200
    step = get(stack, "/v1/steps/" + r.headers["x-gearshift-step-id"])
    assert step["completion_token_ids"] == fake_ids(0, 4)


def test_recording_on_each_store(make_stack, store_url):
    """The same capture, chaining and tool pairing on SQLite and on a real PostgreSQL."""
    tool_call = {
        "id": "call_9",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
    }
    up = FakeUpstream().then(
        Behaviour(message={"role": "assistant", "content": None, "tool_calls": [tool_call]})
    )
    stack = make_stack([up], store={"url": store_url})
    r1 = call(stack, {"model": "full", "messages": MESSAGES, "tools": TOOLS})
    history = [
        *MESSAGES,
        r1.json()["choices"][0]["message"],
        {"role": "tool", "tool_call_id": "call_9", "content": '{"temp": 3}'},
    ]
    r2 = call(stack, {"model": "full", "messages": history, "tools": TOOLS, "stream": True})
    a = get(stack, "/v1/steps/" + r1.headers["x-gearshift-step-id"])
    b = get(stack, "/v1/steps/" + r2.headers["x-gearshift-step-id"])
    assert a["session_id"] == b["session_id"] and (a["seq"], b["seq"]) == (0, 1)
    assert b["completion_token_ids"] == list(range(100, 110))
    s = get(stack, "/v1/sessions/" + a["session_id"])
    assert ("tool_call", "tool_success", 1.0) in [
        (r["scope"], r["name"], r["value"]) for r in s["rewards"]
    ]
