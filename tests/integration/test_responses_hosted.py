"""The hosted tool loop of /v1/responses: the official ``openai`` SDK against the gateway,
a scripted fake tier, and a REAL sandbox service (the code runs in bubblewrap)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest
from sqlalchemy import select

from gateway.auth import hash_key
from gateway.store.database import make_engine
from gateway.store.schema import tool_calls
from sandbox.config import GrantConfig, Resources, SandboxConfig
from sandbox.service import create_app
from tests.integration.conftest import Stack
from tests.support.fake_upstream import Behaviour, FakeUpstream
from tests.support.servers import free_port, serve_in_thread

# run_python, read_file and list_dir; no write_file (a denied tool)
GRANT = GrantConfig(
    tools=["run_python", "read_file", "list_dir"],
    read=["*"],
    write=["*"],
    resources=Resources(cpu_s=2, memory_mb=128, pids=32, wall_s=5, output_bytes=4096, file_mb=1),
)
CODE = {"type": "code_interpreter", "container": {"type": "auto"}}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def call(name: str, arguments: str, call_id: str = "call_7") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def asks(*calls: dict[str, Any]) -> Behaviour:
    return Behaviour(message={"role": "assistant", "content": None, "tool_calls": list(calls)})


PYTHON = call("run_python", '{"code": "print(6*7)"}')


@pytest.fixture
def hosted_stack(make_stack, sandbox_root) -> Iterator[Callable[..., Stack]]:
    port = free_port()
    cfg = SandboxConfig(
        token="test-token", root=sandbox_root, host="127.0.0.1", port=port,
        grants_by_tenant={"default": GRANT, "capped": GRANT, "free": GRANT},
    )  # fmt: skip
    with serve_in_thread(create_app(cfg), port=port):

        def build(up: FakeUpstream, **overrides: Any) -> Stack:
            sandbox = {"token": "test-token", "host": "127.0.0.1", "port": port}
            return make_stack([up], sandbox=sandbox, **overrides)

        yield build


def recorded_calls(stack: Stack) -> list[dict[str, Any]]:
    """The recorded tool calls, once everything queued so far is written: steps go to the
    store in the recorder's batches, and a read through the API runs after them (this one
    answers 404; it is its place in the queue that counts)."""
    httpx.get(f"{stack.url}/v1/sessions/after-the-queued-steps")
    engine = make_engine(stack.store_url)
    try:
        with engine.connect() as conn:
            q = select(tool_calls).order_by(tool_calls.c.created_at)
            return [dict(r._mapping) for r in conn.execute(q)]
    finally:
        engine.dispose()


def test_code_interpreter_runs_in_the_sandbox_then_the_model_answers(hosted_stack):
    up = FakeUpstream().then(asks(PYTHON), Behaviour())
    stack = hosted_stack(up)
    client = stack.client()
    r = client.responses.create(
        model="full", input="compute 6*7", tools=[CODE], tool_choice={"type": "code_interpreter"}
    )
    assert r.status == "completed" and r.output_text == "hello from fake"
    ci = r.output[0]
    assert [o.type for o in r.output] == ["code_interpreter_call", "message"]
    assert ci.type == "code_interpreter_call" and ci.code == "print(6*7)"
    assert ci.status == "completed" and ci.container_id == r.id  # the chain's session
    assert ci.outputs is not None and ci.outputs[0].type == "logs"
    assert ci.outputs[0].logs == "42\n"
    assert r.usage is not None and r.usage.output_tokens == 8  # both steps
    # the model saw the sandbox's schema, forced on the first step only
    first, second = up.requests
    assert first["tools"][0]["function"]["name"] == "run_python"
    assert first["tool_choice"] == {"type": "function", "function": {"name": "run_python"}}
    assert second["tool_choice"] == "auto"
    assert second["messages"] == [
        {"role": "user", "content": "compute 6*7"},
        {"role": "assistant", "content": None, "tool_calls": [PYTHON]},
        {"role": "tool", "tool_call_id": "call_7", "content": "42\n"},
    ]
    # stored with the whole loop; the result on the recorded tool call; two steps
    stored = client.responses.retrieve(r.id)
    assert stored.model_dump() == r.model_dump()
    # The steps are recorded as chat steps are, in the recorder's batches: a read through
    # the API sees them (it runs after what was queued before it); the database a moment on.
    session = httpx.get(f"{stack.url}/v1/sessions/{r.id}").json()
    (row,) = recorded_calls(stack)
    assert (row["call_id"], row["tool"], row["status"], row["exit_status"]) == (
        "call_7", "run_python", "ok", 0,
    )  # fmt: skip
    assert row["attestation"]
    assert [s["seq"] for s in session["steps"]] == [0, 1]
    assert [s["rewritten"] for s in session["steps"]] == [False, False]
    assert ("tool_call", "tool_success", 1.0) in [
        (x["scope"], x["name"], x["value"]) for x in session["rewards"]
    ]

    # previous_response_id continues with every item, the hosted call included
    again = client.responses.create(
        model="full", input="and now?", previous_response_id=r.id, tools=[CODE]
    )
    assert again.output_text == "hello from fake"
    assert up.requests[2]["messages"] == [
        *second["messages"],
        {"role": "assistant", "content": "hello from fake"},
        {"role": "user", "content": "and now?"},
    ]
    session = httpx.get(f"{stack.url}/v1/sessions/{r.id}").json()
    assert [s["rewritten"] for s in session["steps"]] == [False, False, False]


def test_max_tool_calls_ends_the_response_incomplete(hosted_stack):
    up = FakeUpstream().then(asks(PYTHON), asks(call("run_python", '{"code": "1"}', "call_8")))
    stack = hosted_stack(up)
    client = stack.client()
    r = client.responses.create(model="full", input="loop", tools=[CODE], max_tool_calls=1)
    assert r.status == "incomplete"
    assert r.incomplete_details is not None and r.incomplete_details.reason == "max_tool_calls"  # type: ignore[comparison-overlap]
    assert [(o.type, o.status) for o in r.output] == [  # type: ignore[union-attr]
        ("code_interpreter_call", "completed"), ("code_interpreter_call", "incomplete"),
    ]  # fmt: skip
    assert len(up.requests) == 2 and len(recorded_calls(stack)) == 2
    assert [c["status"] for c in recorded_calls(stack)] == ["ok", "pending"]  # not run


def test_the_turn_cap_ends_the_response_incomplete(hosted_stack):
    up = FakeUpstream().then(*[asks(PYTHON)] * 3)
    stack = hosted_stack(up, responses={"max_turns": 2})
    r = stack.client().responses.create(model="full", input="loop", tools=[CODE])
    assert r.status == "incomplete" and len(up.requests) == 2
    assert r.incomplete_details is not None and r.incomplete_details.reason == "max_turns"  # type: ignore[comparison-overlap]
    assert [o.type for o in r.output] == ["code_interpreter_call"] * 2


def test_tenant_caps_replace_the_defaults_and_a_request_only_lowers_them(hosted_stack):
    keys, auth = tenant_keys("capped", "free")
    caps = {"max_tool_calls": 3, "tenants": {"capped": {"max_tool_calls": 1},
                                            "free": {"max_turns": 1}}}  # fmt: skip
    two = asks(PYTHON, call("run_python", '{"code": "print(1)"}', "call_8"))
    up = FakeUpstream().then(two, two)
    stack = hosted_stack(up, responses=caps, auth=auth)

    def ask(tenant: str) -> Any:
        client = stack.client(api_key=keys[tenant])
        return client.responses.create(model="full", input="x", tools=[CODE], max_tool_calls=10)

    capped = ask("capped")  # its cap (1) holds over the request's 10
    assert capped.status == "incomplete" and capped.incomplete_details is not None
    assert capped.incomplete_details.reason == "max_tool_calls"  # type: ignore[comparison-overlap]
    assert [o.status for o in capped.output] == ["completed", "incomplete"]  # type: ignore[union-attr]
    free = ask("free")  # the default (3) lets both run; its own max_turns (1) ends it
    assert free.incomplete_details is not None
    assert free.incomplete_details.reason == "max_turns"  # type: ignore[comparison-overlap]
    assert [o.status for o in free.output] == ["completed", "completed"]  # type: ignore[union-attr]
    assert len(up.requests) == 2


def test_a_denied_tool_goes_back_to_the_model_as_its_output(hosted_stack):
    write = call("write_file", '{"path": "a", "content": "x"}')
    up = FakeUpstream().then(asks(write), Behaviour())
    stack = hosted_stack(up)
    tools: Any = [{"type": "sandbox", "name": "write_file"}]
    r = stack.client().responses.create(model="full", input="write", tools=tools)
    assert r.status == "completed" and r.output_text == "hello from fake"
    item = r.output[0]
    assert item.type == "mcp_call" and item.server_label == "sandbox"
    assert item.name == "write_file" and item.status == "failed"
    assert item.output is not None and item.output.startswith("error: denied: ")
    told = up.requests[1]["messages"][-1]
    assert told["role"] == "tool" and told["content"] == item.output
    assert [c["status"] for c in recorded_calls(stack)] == ["denied"]


def test_a_mixed_step_runs_the_hosted_call_and_returns_the_clients(hosted_stack):
    weather = call("get_weather", '{"city": "Paris"}', "call_w")
    up = FakeUpstream().then(asks(PYTHON, weather), Behaviour())
    stack = hosted_stack(up)
    client = stack.client()
    r = client.responses.create(model="full", input="both", tools=[CODE, WEATHER])  # type: ignore[list-item]
    assert r.status == "completed" and len(up.requests) == 1
    assert [o.type for o in r.output] == ["code_interpreter_call", "function_call"]
    fc = r.output[1]
    assert fc.type == "function_call" and fc.call_id == "call_w"
    assert r.output[0].outputs[0].logs == "42\n"  # type: ignore[union-attr,index]
    client.responses.create(
        model="full", previous_response_id=r.id, tools=[CODE, WEATHER],  # type: ignore[list-item]
        input=[{"type": "function_call_output", "call_id": "call_w", "output": "18C"}],
    )  # fmt: skip
    assert up.requests[1]["messages"][1:] == [
        {"role": "assistant", "content": None, "tool_calls": [PYTHON, weather]},
        {"role": "tool", "tool_call_id": "call_7", "content": "42\n"},
        {"role": "tool", "tool_call_id": "call_w", "content": "18C"},
    ]


def test_a_stream_offering_hosted_tools_completes(hosted_stack):
    up = FakeUpstream()
    stack = hosted_stack(up)
    # the fake tier streams text only (no tool call): the two-step stream is a unit test
    events = list(
        stack.client().responses.create(model="full", input="hi", tools=[CODE], stream=True)
    )
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].type == "response.completed"


def test_an_unknown_sandbox_tool_or_a_sandbox_down_is_refused_before_anything(
    make_stack, hosted_stack
):
    up = FakeUpstream()
    stack = hosted_stack(up)
    with pytest.raises(openai.BadRequestError) as err:
        stack.client().responses.create(
            model="full",
            input="x",
            tools=[{"type": "sandbox", "name": "nope"}],  # type: ignore[list-item]
        )
    assert err.value.body["param"] == "tools[0].name"  # type: ignore[index]
    down = make_stack([up], sandbox={"token": "t", "host": "127.0.0.1", "port": free_port()})
    with pytest.raises(openai.InternalServerError) as err2:
        down.client(max_retries=0).responses.create(model="full", input="x", tools=[CODE])
    assert err2.value.status_code == 503 and up.requests == []


def tenant_keys(*tenants: str) -> tuple[dict[str, str], dict[str, Any]]:
    """API keys of ``tenants`` (``gs-key-of-<tenant>``) and the auth section holding them."""
    keys = {t: f"gs-key-of-{t}" for t in tenants}
    auth = {"mode": "keys", "keys": [
        {"name": f"k-{t}", "tenant": t, "sha256": hash_key(k)} for t, k in keys.items()
    ]}  # fmt: skip
    return keys, auth


def wait_for(check: Callable[[], bool], timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_the_wall_cap_stops_a_model_step_in_flight_and_is_per_tenant(make_stack):
    keys, auth = tenant_keys("capped", "free")
    stall_mid = Behaviour(kind="stall_mid", after=2)  # streams two chunks, then hangs
    up = FakeUpstream().then(Behaviour(delay_s=10), stall_mid, Behaviour(delay_s=0.7))
    caps = {"tenants": {"capped": {"max_wall_s": 0.5}}}
    stack = make_stack([up], responses=caps, auth=auth)
    capped = stack.client(api_key=keys["capped"])
    start = time.monotonic()
    r = capped.responses.create(model="full", input="slow")
    assert time.monotonic() - start < 4  # the tier would answer in 10 s, time out in 5
    assert r.status == "incomplete" and r.output == []
    assert r.incomplete_details is not None and r.incomplete_details.reason == "max_wall_s"  # type: ignore[comparison-overlap]
    assert capped.responses.retrieve(r.id).model_dump() == r.model_dump()  # stored
    # streamed, stopped mid-stream: what it streamed stays, closed incomplete
    events = list(capped.responses.create(model="full", input="slow", stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    end = events[-1]
    assert end.type == "response.incomplete"
    assert end.response.incomplete_details.reason == "max_wall_s"  # type: ignore[union-attr,comparison-overlap]
    (message,) = end.response.output
    assert message.type == "message" and message.status == "incomplete"
    assert message.content[0].text == "tok0 tok1 "  # type: ignore[union-attr]
    wait_for(lambda: up.disconnects == 2)  # both tier requests were aborted
    # another tenant has the default: no wall cap
    free = stack.client(api_key=keys["free"]).responses.create(model="full", input="slow")
    assert free.status == "completed" and free.output_text == "hello from fake"


def test_the_wall_cap_ends_the_loop_between_steps(hosted_stack):
    slow = call("run_python", '{"code": "import time; time.sleep(0.8); print(1)"}', "call_s")
    up = FakeUpstream().then(asks(slow, PYTHON), asks(PYTHON))
    stack = hosted_stack(up, responses={"max_wall_s": 0.5})
    r = stack.client().responses.create(
        model="full", input="slow tool", tools=[CODE], parallel_tool_calls=False
    )
    # the call running at the deadline finished (within its own timeout); the next one,
    # one by one, would start after it: not run; no next step
    assert r.status == "incomplete" and len(up.requests) == 1
    assert r.incomplete_details is not None and r.incomplete_details.reason == "max_wall_s"  # type: ignore[comparison-overlap]
    ran, cut = r.output
    assert ran.type == "code_interpreter_call" and ran.status == "completed"
    assert ran.outputs is not None and ran.outputs[0].logs == "1\n"  # type: ignore[union-attr]
    assert cut.type == "code_interpreter_call" and cut.status == "incomplete"
    assert cut.outputs[0].logs == "error: not run: the response reached max_wall_s"  # type: ignore[union-attr,index]


def test_the_token_cap_bounds_each_step_and_ends_the_loop(hosted_stack):
    keys, auth = tenant_keys("capped", "free")
    # each fake step: 7 input + 4 output tokens
    cut = {"id": "c", "object": "chat.completion", "created": 0, "model": "m", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "cut"},
         "finish_reason": "length"}],
        "usage": {"prompt_tokens": 18, "completion_tokens": 8, "total_tokens": 26}}  # fmt: skip
    up = FakeUpstream().then(
        asks(PYTHON), asks(PYTHON),  # capped
        asks(PYTHON), asks(PYTHON), Behaviour("status", status=200, body=cut),  # free
    )  # fmt: skip
    caps = {"max_total_tokens": 15, "tenants": {"free": {"max_total_tokens": 30}}}
    stack = hosted_stack(up, responses=caps, auth=auth)

    def ask(tenant: str) -> Any:
        client = stack.client(api_key=keys[tenant])
        return client.responses.create(model="full", input="x", tools=[CODE])

    small = ask("capped")  # 11 tokens, then 4 left: the second step's max_tokens, then 22
    assert [q["max_tokens"] for q in up.requests] == [15, 4]
    assert small.status == "incomplete" and small.incomplete_details is not None
    assert small.incomplete_details.reason == "max_total_tokens"  # type: ignore[comparison-overlap]
    assert small.usage is not None and small.usage.total_tokens == 22
    assert [o.status for o in small.output] == ["completed", "completed"]  # type: ignore[union-attr]
    # a step cut at what was left of the total: max_total_tokens, not max_output_tokens
    cut_short = ask("free")
    assert [q["max_tokens"] for q in up.requests[2:]] == [30, 19, 8]
    assert cut_short.incomplete_details is not None
    assert cut_short.incomplete_details.reason == "max_total_tokens"  # type: ignore[comparison-overlap]
    assert cut_short.output_text == "cut"
