"""/v1/responses with the official ``openai`` SDK against the gateway on a real socket.

The tiers are fake replicas (``tests.support.fake_upstream``) so that the model's answers
(text, a function call) can be scripted; the store is a real SQLite file.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import httpx
import openai
import pytest
from sqlalchemy import func, select

from gateway.auth import hash_key
from gateway.config import Settings
from gateway.http.app import create_app
from gateway.store.database import make_engine
from gateway.store.schema import response_items, responses
from tests.integration.conftest import Stack
from tests.support.fake_upstream import Behaviour, FakeUpstream
from tests.support.servers import serve_in_thread

KEYS = {"a": "gs-key-of-tenant-a", "b": "gs-key-of-tenant-b"}
AUTH = {
    "mode": "keys",
    "keys": [{"name": f"k{t}", "tenant": t, "sha256": hash_key(k)} for t, k in KEYS.items()],
}
TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "the weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        }
    ],
}


def rows(stack: Stack) -> tuple[int, int]:
    engine = make_engine(stack.store_url)
    try:
        with engine.connect() as conn:
            count = conn.execute(select(func.count()).select_from(responses)).scalar_one()
            items = conn.execute(select(func.count()).select_from(response_items)).scalar_one()
            return count, items
    finally:
        engine.dispose()


def test_create_retrieve_list_delete(make_stack):
    stack = make_stack([FakeUpstream()])
    client = stack.client()
    r = client.responses.create(
        model="full", input="hi", instructions="be brief", metadata={"run": "7"}
    )
    assert r.id.startswith("resp_") and r.status == "completed"
    assert r.output_text == "hello from fake"
    assert r.usage is not None and (r.usage.input_tokens, r.usage.output_tokens) == (7, 4)
    assert r.model == "model-full" and r.metadata == {"run": "7"} and r.store is True
    got = client.responses.retrieve(r.id)
    assert got.model_dump() == r.model_dump()
    page = client.responses.input_items.list(r.id)
    assert [i.type for i in page.data] == ["message"]
    assert page.data[0].content[0].text == "hi"  # type: ignore[union-attr]
    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(r.id)
    assert rows(stack) == (0, 0)


def test_input_items_are_paginated(make_stack):
    stack = make_stack([FakeUpstream()])
    client = stack.client()
    inputs = [{"role": "user", "content": f"m{i}"} for i in range(5)]
    r = client.responses.create(model="full", input=inputs)  # type: ignore[arg-type]
    first = client.responses.input_items.list(r.id, limit=2, order="asc")
    assert [i.content[0].text for i in first.data] == ["m0", "m1"]  # type: ignore[union-attr]
    assert first.has_more is True
    every = [i.content[0].text for i in client.responses.input_items.list(r.id, limit=2)]  # type: ignore[union-attr]
    assert every == ["m4", "m3", "m2", "m1", "m0"]  # auto-paging, newest first by default


def test_stream_events_in_order(make_stack):
    stack = make_stack([FakeUpstream()])
    client = stack.client()
    events = list(client.responses.create(model="full", input="hi", stream=True))
    kinds = [e.type for e in events]
    assert kinds == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", *["response.output_text.delta"] * 5,
        "response.output_text.done", "response.content_part.done",
        "response.output_item.done", "response.completed",
    ]  # fmt: skip
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response  # type: ignore[union-attr]
    assert final.output_text == "tok0 tok1 tok2 tok3 tok4 "
    assert final.usage is not None and final.usage.output_tokens == 5
    stored = client.responses.retrieve(final.id)
    assert stored.output_text == final.output_text and stored.status == "completed"
    with client.responses.stream(model="full", input="again") as stream:
        texts = [e.delta for e in stream if e.type == "response.output_text.delta"]
        done = stream.get_final_response()
    assert "".join(texts) == done.output_text == "tok0 tok1 tok2 tok3 tok4 "


def test_three_turns_with_a_function_call(make_stack):
    up = FakeUpstream().then(Behaviour(), Behaviour(message=CALL), Behaviour())
    stack = make_stack([up])
    client = stack.client()
    r1 = client.responses.with_raw_response.create(model="full", input="hi")
    one = r1.parse()
    r2 = client.responses.with_raw_response.create(
        model="full", input="weather in Paris?", previous_response_id=one.id, tools=[TOOL]
    )
    two = r2.parse()
    call = two.output[0]
    assert call.type == "function_call" and call.name == "get_weather"
    assert call.call_id == "call_1" and call.arguments == '{"city": "Paris"}'
    r3 = client.responses.with_raw_response.create(
        model="full", previous_response_id=two.id, tools=[TOOL],
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "18C"}],
    )  # fmt: skip
    three = r3.parse()
    assert three.output_text == "hello from fake" and three.previous_response_id == two.id
    assert up.requests[2]["messages"] == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello from fake"},
        {"role": "user", "content": "weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": CALL["tool_calls"]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
    ]
    assert up.requests[2]["tools"][0]["function"]["name"] == "get_weather"
    # the chain is one trajectory session, named after its first response
    steps = [
        httpx.get(f"{stack.url}/v1/steps/{r.headers['x-gearshift-step-id']}").json()
        for r in (r1, r2, r3)
    ]
    assert len({s["session_id"] for s in steps}) == 1
    assert [s["seq"] for s in steps] == [0, 1, 2]
    assert [s["rewritten"] for s in steps] == [False, False, False]
    session = httpx.get(f"{stack.url}/v1/sessions/{one.id}").json()
    assert [s["id"] for s in session["steps"]] == [s["id"] for s in steps]


def test_function_call_output_without_its_call_is_refused(make_stack):
    up = FakeUpstream()
    stack = make_stack([up])
    client = stack.client()
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(
            model="full", input=[{"type": "function_call_output", "call_id": "nope", "output": "x"}]
        )
    assert err.value.body["param"] == "input[0].call_id"  # type: ignore[index]
    assert up.requests == [] and rows(stack) == (0, 0)


def test_store_false_stores_nothing(make_stack):
    stack = make_stack([FakeUpstream()])
    client = stack.client()
    r = client.responses.create(model="full", input="hi", store=False)
    assert r.store is False and r.output_text == "hello from fake"
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="full", input="more", previous_response_id=r.id)
    s = client.responses.create(model="full", input="hi", store=False, stream=True)
    assert list(s)[-1].type == "response.completed"
    assert rows(stack) == (0, 0)


def test_tenants_are_isolated(make_stack):
    stack = make_stack([FakeUpstream()], auth=AUTH)
    a, b = stack.client(api_key=KEYS["a"]), stack.client(api_key=KEYS["b"])
    r = a.responses.create(model="full", input="secret")
    for attempt in (
        lambda: b.responses.retrieve(r.id),
        lambda: b.responses.delete(r.id),
        lambda: b.responses.input_items.list(r.id),
        lambda: b.responses.create(model="full", input="x", previous_response_id=r.id),
    ):
        with pytest.raises(openai.NotFoundError) as err:
            attempt()
        assert err.value.body["type"] == "invalid_request_error"  # type: ignore[index]
    assert a.responses.retrieve(r.id).output_text == "hello from fake"
    with pytest.raises(openai.AuthenticationError):
        stack.client(api_key="wrong").responses.retrieve(r.id)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "full", "input": "x", "frobnicate": 1}, "frobnicate"),
        ({"model": "full", "input": "x", "background": True, "store": False}, "background"),
        ({"model": "full", "input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"model": "full", "input": "x", "tools": [{"type": "mcp", "server_label": "s"}]}, "tools[0].server_url"),  # not allowlisted
        ({"model": "full", "input": "x", "tools": [{"type": "shell"}]}, "tools[0].type"),
        ({"model": "full", "input": "x", "tool_choice": {"type": "mcp"}}, "tool_choice.server_label"),
        ({"model": "full", "input": "x", "tool_choice": {"type": "allowed_tools"}}, "tool_choice.type"),
        ({"model": "full", "input": "x", "conversation": "conv_1"}, "conversation"),
        ({"model": "full", "input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
        ({"model": "full", "input": [{"type": "reasoning", "summary": []}]}, "input[0].type"),
        ({"model": "full", "input": "x", "temperature": "hot"}, "temperature"),
        ({"model": "full", "input": "x", "text": {"format": {"type": "json_schema"}}}, "text.format.name"),
        ({"model": "nope", "input": "x"}, "model"),
        ({"input": "x"}, "model"),
    ],
)  # fmt: skip
def test_bad_requests_name_the_parameter(make_stack, body: dict[str, Any], param: str):
    up = FakeUpstream()
    stack = make_stack([up])
    r = httpx.post(stack.url + "/v1/responses", json=body)
    assert r.status_code in (400, 404), r.text
    assert r.json()["error"]["param"] == param
    assert up.requests == [] and rows(stack) == (0, 0)


def test_accepted_but_unused_parameters_and_json_schema(make_stack):
    up = FakeUpstream()
    stack = make_stack([up])
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    r = stack.client().responses.create(
        model="full", input="x", reasoning={"effort": "low"}, truncation="disabled",
        max_output_tokens=32, temperature=0.5, top_p=0.9, parallel_tool_calls=False,
        text={"format": {"type": "json_schema", "name": "out", "schema": schema, "strict": True}},
    )  # fmt: skip
    assert r.status == "completed" and r.text is not None
    sent = up.requests[0]
    assert sent["response_format"] == {
        "type": "json_schema", "json_schema": {"name": "out", "schema": schema, "strict": True},
    }  # fmt: skip
    assert (sent["max_tokens"], sent["temperature"], sent["top_p"]) == (32, 0.5, 0.9)
    assert "reasoning" not in sent and "parallel_tool_calls" not in sent  # no tools: not sent


def test_responses_survive_a_restart(tmp_path):
    up = FakeUpstream()
    with contextlib.ExitStack() as outer:
        upstream = outer.enter_context(serve_in_thread(up.app))
        config: dict[str, Any] = {
            "tiers": {"full": {"model": "model-full", "replicas": [upstream]}},
            "router": {"policy": "length_threshold", "calibrate_tokens": False},
            "store": {"url": f"sqlite:///{tmp_path}/trajectories.db"},
        }

        def client(url: str) -> openai.OpenAI:
            return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)

        with serve_in_thread(create_app(Settings(**config))) as url:
            first = client(url).responses.create(model="full", input="remember me")
        with serve_in_thread(create_app(Settings(**config))) as url:
            again = client(url)
            assert again.responses.retrieve(first.id).output_text == "hello from fake"
            again.responses.create(model="full", input="and?", previous_response_id=first.id)
        assert [m["content"] for m in up.requests[1]["messages"]] == [
            "remember me", "hello from fake", "and?",
        ]  # fmt: skip


def test_a_client_that_leaves_cancels_the_step_and_stores_nothing(make_stack):
    up = FakeUpstream().then(Behaviour("stall"))
    stack = make_stack([up])
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(stack.url + "/v1/responses", json={"model": "full", "input": "hi"}, timeout=0.5)
    deadline = time.monotonic() + 5
    while up.disconnects == 0:  # the gateway hung up on the replica: vLLM stops working
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert rows(stack) == (0, 0)


def test_a_named_session_holds_the_chain(make_stack):
    stack = make_stack([FakeUpstream()])
    client = stack.client(default_headers={"x-session-id": "ep-9"})
    one = client.responses.create(model="full", input="hi")
    client.responses.create(model="full", input="more", previous_response_id=one.id)
    session = httpx.get(f"{stack.url}/v1/sessions/ep-9").json()
    assert [s["seq"] for s in session["steps"]] == [0, 1]


def test_without_recording_responses_are_served_not_stored(make_stack):
    stack = make_stack([FakeUpstream()], store={"enabled": False})
    client = stack.client()
    r = client.responses.create(model="full", input="hi")
    assert r.output_text == "hello from fake" and r.store is False
    with pytest.raises(openai.InternalServerError) as err:  # 503: the store is off
        client.responses.retrieve(r.id)
    assert err.value.status_code == 503


def test_a_stream_cut_mid_way_ends_failed_and_is_stored_so(make_stack):
    stack = make_stack([FakeUpstream().then(Behaviour("cut", after=2))])
    client = stack.client()
    events = list(client.responses.create(model="full", input="hi", stream=True))
    assert events[-1].type == "response.failed"
    failed = events[-1].response  # type: ignore[union-attr]
    assert failed.error is not None and "before [DONE]" in failed.error.message
    assert client.responses.retrieve(failed.id).status == "failed"
