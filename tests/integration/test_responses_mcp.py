"""MCP tools and human approval on /v1/responses: the official ``openai`` SDK against the
gateway, a scripted fake tier, and a REAL MCP server (the ``mcp`` SDK's MCPServer over
streamable HTTP on 127.0.0.1)."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from sqlalchemy import func, select

from gateway.auth import hash_key
from gateway.store.database import make_engine
from gateway.store.schema import response_items, responses, tool_calls
from tests.integration.conftest import Stack, dead_url
from tests.support.fake_upstream import Behaviour, FakeUpstream
from tests.support.mcp_server import demo_server, hanging_app
from tests.support.servers import serve_in_thread

KEYS = {"a": "gs-key-of-tenant-a", "b": "gs-key-of-tenant-b", "ops": "gs-key-of-the-operator"}
AUTH = {
    "mode": "keys",
    "keys": [
        {"name": f"k{t}", "tenant": t, "sha256": hash_key(k), "admin": t == "ops"}
        for t, k in KEYS.items()
    ],
}


def asks(name: str, arguments: str, call_id: str = "call_1") -> Behaviour:
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    return Behaviour(message={"role": "assistant", "content": None, "tool_calls": [call]})


@pytest.fixture(scope="module")
def mcp_url() -> Iterator[str]:
    with serve_in_thread(demo_server()) as url:
        yield url + "/mcp"


def tool(url: str, **fields: Any) -> Any:
    return {"type": "mcp", "server_label": "demo", "server_url": url, **fields}


def build(make_stack: Any, up: FakeUpstream, urls: list[str], **overrides: Any) -> Stack:
    servers = [{"label": f"s{i}", "url": u, "tenants": ["*"]} for i, u in enumerate(urls)]
    mcp = {"servers": servers, "timeout_s": 5}
    return make_stack([up], responses={"mcp": mcp}, **overrides)


def counts(stack: Stack) -> tuple[int, int]:
    engine = make_engine(stack.store_url)
    try:
        with engine.connect() as conn:
            n = conn.execute(select(func.count()).select_from(responses)).scalar()
            m = conn.execute(select(func.count()).select_from(response_items)).scalar()
            return int(n or 0), int(m or 0)
    finally:
        engine.dispose()


def test_list_then_call_then_the_model_answers(make_stack, mcp_url):
    up = FakeUpstream().then(asks("add", '{"a": 2, "b": 3}'), Behaviour(), Behaviour())
    stack = build(make_stack, up, [mcp_url])
    client = stack.client()
    tools = [tool(mcp_url, require_approval="never", allowed_tools=["add", "boom"])]
    r = client.responses.create(model="full", input="2+3?", tools=tools)
    assert r.status == "completed" and r.output_text == "hello from fake"
    assert [o.type for o in r.output] == ["mcp_list_tools", "mcp_call", "message"]
    listing, call = r.output[0], r.output[1]
    assert listing.type == "mcp_list_tools" and listing.server_label == "demo"
    assert sorted(t.name for t in listing.tools) == ["add", "boom", "shout"]
    assert call.type == "mcp_call" and call.name == "add" and call.output == "5"
    assert call.server_label == "demo" and call.error is None and call.status == "completed"
    first, second = up.requests
    assert sorted(t["function"]["name"] for t in first["tools"]) == ["add", "boom"]  # allowed
    assert second["messages"][-1] == {"role": "tool", "tool_call_id": "call_1", "content": "5"}
    assert r.tools[0].headers is None  # type: ignore[union-attr]  # never echoed

    # the chain's listing is reused: no new mcp_list_tools item
    again = client.responses.create(
        model="full", input="thanks", previous_response_id=r.id, tools=tools
    )
    assert [o.type for o in again.output] == ["message"]
    assert up.requests[2]["messages"][:3] == second["messages"]


def test_tool_choice_forces_a_tool_of_an_mcp_server(make_stack, mcp_url):
    """``{"type": "mcp", "server_label", "name"}`` forces that tool on the first step (the
    chat request names it); without ``name``, some tool (``required``); an unknown label or
    a tool the server does not offer is a 400 before anything is stored."""
    up = FakeUpstream().then(asks("shout", '{"text": "hi"}'), Behaviour(), Behaviour())
    stack = build(make_stack, up, [mcp_url])
    client = stack.client()
    tools = [tool(mcp_url, require_approval="never", allowed_tools=["add", "shout"])]
    forced = {"type": "mcp", "server_label": "demo", "name": "shout"}
    r = client.responses.create(model="full", input="shout hi", tools=tools, tool_choice=forced)
    assert r.status == "completed" and r.tool_choice.model_dump(exclude_none=True) == forced
    assert [o.type for o in r.output] == ["mcp_list_tools", "mcp_call", "message"]
    assert r.output[1].output == "HI"  # type: ignore[union-attr]
    first, second = up.requests
    assert first["tool_choice"] == {"type": "function", "function": {"name": "shout"}}
    assert second["tool_choice"] == "auto"  # forced on the first step only
    client.responses.create(
        model="full", input="any", tools=tools, tool_choice={"type": "mcp", "server_label": "demo"}
    )
    assert up.requests[2]["tool_choice"] == "required"

    before = counts(stack)
    for choice, param in (  # boom: not in allowed_tools
        ({"type": "mcp", "server_label": "demo", "name": "boom"}, "tool_choice.name"),
        ({"type": "mcp", "server_label": "demo", "name": "nope"}, "tool_choice.name"),
        ({"type": "mcp", "server_label": "other", "name": "add"}, "tool_choice.server_label"),
        ({"type": "mcp", "server_label": "demo", "name": 3}, "tool_choice.name"),
        ({"type": "mcp", "server_label": "demo", "tools": []}, "tool_choice.tools"),
    ):
        with pytest.raises(openai.BadRequestError) as err:
            client.responses.create(model="full", input="x", tools=tools, tool_choice=choice)
        assert err.value.body["param"] == param, err.value.body  # type: ignore[index]
    assert counts(stack) == before and len(up.requests) == 3


def test_a_stateless_client_sends_the_calls_back_and_the_server_is_not_listed_again(
    make_stack, mcp_url
):
    """``store: false`` and no ``previous_response_id``: the client keeps the context and
    sends back the output items it got (the SDK's own objects); the model sees the call and
    its result again, the listing it sent stands for the server's, nothing is stored."""
    up = FakeUpstream().then(asks("add", '{"a": 2, "b": 3}'), Behaviour(), Behaviour())
    stack = build(make_stack, up, [mcp_url])
    client = stack.client()
    tools = [tool(mcp_url, require_approval="never", allowed_tools=["add"])]
    first = client.responses.create(model="full", input="2+3?", tools=tools, store=False)
    assert [o.type for o in first.output] == ["mcp_list_tools", "mcp_call", "message"]
    context: list[Any] = [{"role": "user", "content": "2+3?"}, *first.output]
    second = client.responses.create(
        model="full", input=[*context, {"role": "user", "content": "and doubled?"}],
        tools=tools, store=False,
    )  # fmt: skip
    assert [o.type for o in second.output] == ["message"]  # no mcp_list_tools: not listed again
    sent = up.requests[2]
    assert [t["function"]["name"] for t in sent["tools"]] == ["add"]  # from the sent listing
    assert sent["messages"][:3] == up.requests[1]["messages"]  # the call and its result again
    assert sent["messages"][-1] == {"role": "user", "content": "and doubled?"}
    assert counts(stack) == (0, 0)


def test_a_failing_tool_and_a_server_gone_reach_the_model_as_errors(make_stack):
    with serve_in_thread(demo_server()) as base:
        url = base + "/mcp"
        up = FakeUpstream().then(
            asks("boom", '{"reason": "x"}'), Behaviour(), asks("add", '{"a": 1, "b": 1}'),
            Behaviour(),
        )  # fmt: skip
        stack = build(make_stack, up, [url])
        client = stack.client()
        tools = [tool(url, require_approval="never")]
        r = client.responses.create(model="full", input="fail", tools=tools)
    call = r.output[1]
    assert call.type == "mcp_call" and call.status == "failed"
    assert call.output is not None and call.output.startswith("error: tool error: ")
    assert call.error is not None and call.error.type == "mcp_tool_execution_error"
    assert up.requests[1]["messages"][-1]["content"] == call.output
    # the server is gone now; the chain's listing is reused, the call fails, the model hears it
    again = client.responses.create(
        model="full", input="again", previous_response_id=r.id, tools=tools
    )
    assert again.status == "completed"
    gone = again.output[0]
    assert gone.type == "mcp_call" and gone.status == "failed"
    assert gone.output is not None and "error: unavailable: MCP server 'demo' failed" in gone.output
    assert up.requests[3]["messages"][-1]["content"] == gone.output


def test_a_server_down_at_listing_is_a_424_and_nothing_is_stored(make_stack):
    down = dead_url() + "/mcp"
    stack = build(make_stack, FakeUpstream(), [down])
    with pytest.raises(openai.APIStatusError) as err:
        stack.client().responses.create(model="full", input="x", tools=[tool(down)])
    assert err.value.status_code == 424
    assert err.value.body["param"] == "tools[0].server_url"  # type: ignore[index]
    assert "error retrieving tool list from MCP server 'demo'" in err.value.message
    assert counts(stack) == (0, 0)


def test_servers_the_operator_did_not_allow_are_refused(make_stack, mcp_url):
    up = FakeUpstream()
    stack = build(make_stack, up, [])  # an empty allowlist: deny by default
    client = stack.client()
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="full", input="x", tools=[tool(mcp_url)])
    assert err.value.body["param"] == "tools[0].server_url"  # type: ignore[index]
    assert repr(mcp_url) in err.value.message
    # allowed for tenant a only: tenant b is refused the same way
    mcp = {"servers": [{"label": "demo", "url": mcp_url, "tenants": ["a"]}]}
    stack = make_stack([up], responses={"mcp": mcp}, auth=AUTH)
    b = stack.client(api_key=KEYS["b"])
    with pytest.raises(openai.BadRequestError) as err:
        b.responses.create(model="full", input="x", tools=[tool(mcp_url)])
    assert err.value.body["param"] == "tools[0].server_url"  # type: ignore[index]
    assert up.requests == [] and counts(stack) == (0, 0)


def test_approve_runs_the_call_and_deny_tells_the_model(make_stack, mcp_url):
    up = FakeUpstream().then(
        asks("shout", '{"text": "hi"}'), Behaviour(), asks("shout", '{"text": "no"}', "call_2"),
        Behaviour(),
    )  # fmt: skip
    stack = build(make_stack, up, [mcp_url])
    client = stack.client()
    tools = [tool(mcp_url)]  # require_approval defaults to "always"
    r = client.responses.create(model="full", input="shout hi", tools=tools)
    assert r.status == "completed" and len(up.requests) == 1
    assert [o.type for o in r.output] == ["mcp_list_tools", "mcp_approval_request"]
    request = r.output[1]
    assert request.type == "mcp_approval_request" and request.name == "shout"
    assert request.arguments == '{"text": "hi"}' and request.server_label == "demo"

    ok = client.responses.create(
        model="full", previous_response_id=r.id, tools=tools,
        input=[{"type": "mcp_approval_response", "approval_request_id": request.id,
                "approve": True}],
    )  # fmt: skip
    assert [o.type for o in ok.output] == ["mcp_call", "message"]
    call = ok.output[0]
    assert call.type == "mcp_call" and call.output == "HI"
    assert call.approval_request_id == request.id
    assert up.requests[1]["messages"][1:] == [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "shout", "arguments": '{"text": "hi"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "HI"},
    ]  # fmt: skip
    # the decision and its approver are stored with the response's input items
    (answer,) = client.responses.input_items.list(ok.id).data
    assert answer.type == "mcp_approval_response"
    assert answer.model_dump()["approver"] == "client:anonymous"

    # the next call is denied: the model is told so, nothing runs
    asked = client.responses.create(
        model="full", input="shout no", previous_response_id=ok.id, tools=tools
    )
    denied_request = asked.output[-1]
    assert denied_request.type == "mcp_approval_request"
    no = client.responses.create(
        model="full", previous_response_id=asked.id, tools=tools,
        input=[{"type": "mcp_approval_response", "approval_request_id": denied_request.id,
                "approve": False, "reason": "too loud"}],
    )  # fmt: skip
    denied = no.output[0]
    assert denied.type == "mcp_call" and denied.status == "failed"
    assert denied.output == (
        "error: denied: the call was not approved (by client:anonymous): too loud"
    )
    assert up.requests[3]["messages"][-1] == {
        "role": "tool", "tool_call_id": "call_2", "content": denied.output,
    }  # fmt: skip
    # both results are on the trajectory's recorded tool calls, as sandbox runs are
    httpx.get(f"{stack.url}/v1/sessions/after-the-queued-steps")  # after the queued steps
    engine = make_engine(stack.store_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                select(tool_calls.c.call_id, tool_calls.c.status, tool_calls.c.result).order_by(
                    tool_calls.c.call_id
                )
            ).all()
    finally:
        engine.dispose()
    assert [tuple(r) for r in rows] == [
        ("call_1", "ok", "HI"), ("call_2", "denied", denied.output),
    ]  # fmt: skip


def test_wrong_approval_answers_are_400s_naming_the_field_and_store_nothing(make_stack, mcp_url):
    up = FakeUpstream().then(asks("shout", '{"text": "hi"}'))
    stack = build(make_stack, up, [mcp_url])
    client = stack.client()
    tools = [tool(mcp_url)]
    r = client.responses.create(model="full", input="shout", tools=tools)
    rid = r.output[1].id

    def answer(request_id: str, **kw: Any) -> dict[str, Any]:
        return {"type": "mcp_approval_response", "approval_request_id": request_id,
                "approve": True, **kw}  # fmt: skip

    before = counts(stack)
    cases: list[tuple[dict[str, Any], str]] = [
        ({"input": [answer(rid)]}, "previous_response_id"),  # no chain
        ({"previous_response_id": r.id, "input": [answer("mcpr_unknown")]},
         "input[0].approval_request_id"),
        ({"previous_response_id": r.id, "input": [answer(rid), answer(rid)]},
         "input[1].approval_request_id"),
        ({"previous_response_id": r.id, "input": "go on"}, "input"),  # left unanswered
        ({"previous_response_id": r.id, "input": [answer(rid)], "tools": []},
         "input[0].approval_request_id"),  # approving a server the request does not offer
        ({"previous_response_id": r.id, "input": [answer(rid, approve="yes")]},
         "input[0].approve"),
    ]  # fmt: skip
    for body, param in cases:
        with pytest.raises(openai.BadRequestError) as err:
            client.responses.create(model="full", **{"tools": tools, **body})
        assert err.value.body["param"] == param, (param, err.value.message)  # type: ignore[index]
    assert counts(stack) == before and len(up.requests) == 1
    # answered once; a second answer along the chain is a duplicate
    done = client.responses.create(
        model="full", previous_response_id=r.id, tools=tools, input=[answer(rid)]
    )
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(
            model="full", previous_response_id=done.id, tools=tools, input=[answer(rid)]
        )
    assert err.value.body["param"] == "input[0].approval_request_id"  # type: ignore[index]
    assert "already" in err.value.message


def test_operators_answer_approvals_and_tenants_stay_isolated(make_stack, mcp_url):
    up = FakeUpstream().then(asks("shout", '{"text": "ops"}'), Behaviour())
    mcp = {"servers": [{"label": "demo", "url": mcp_url, "tenants": ["a", "b"]}]}
    stack = make_stack([up], responses={"mcp": mcp}, auth=AUTH)
    a, b = stack.client(api_key=KEYS["a"]), stack.client(api_key=KEYS["b"])
    tools = [tool(mcp_url)]
    r = a.responses.create(model="full", input="shout", tools=tools)
    rid = r.output[1].id

    # tenant b can neither continue a's response nor answer a's request in its own chain
    with pytest.raises(openai.NotFoundError):
        b.responses.create(
            model="full", previous_response_id=r.id, tools=tools,
            input=[{"type": "mcp_approval_response", "approval_request_id": rid, "approve": True}],
        )  # fmt: skip
    own = b.responses.create(model="full", input="hi", tools=[tool(mcp_url)])
    with pytest.raises(openai.BadRequestError) as err:
        b.responses.create(
            model="full", previous_response_id=own.id, tools=tools,
            input=[{"type": "mcp_approval_response", "approval_request_id": rid, "approve": True}],
        )  # fmt: skip
    assert err.value.body["param"] == "input[0].approval_request_id"  # type: ignore[index]

    admin = f"{stack.url}/admin/v1/approvals"
    ops = {"authorization": f"Bearer {KEYS['ops']}"}
    forbidden = httpx.get(admin, headers={"authorization": f"Bearer {KEYS['a']}"})
    assert forbidden.status_code == 403 and forbidden.json()["error"]["type"] == "permission_error"
    listed = httpx.get(admin, headers=ops, params={"tenant": "a"}).json()["data"]
    assert [(x["id"], x["tenant"], x["response_id"], x["name"]) for x in listed] == [
        (rid, "a", r.id, "shout")
    ]
    assert httpx.get(admin, headers=ops, params={"tenant": "b"}).json()["data"] == []
    bad = httpx.post(f"{admin}/{rid}", headers=ops, json={"approve": "sure"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "approve"
    assert httpx.post(f"{admin}/mcpr_nope", headers=ops, json={"approve": True}).status_code == 404
    decided = httpx.post(f"{admin}/{rid}", headers=ops, json={"approve": True, "reason": "ok"})
    assert decided.status_code == 200, decided.text
    assert decided.json()["decision"]["approver"] == "operator:kops"
    again = httpx.post(f"{admin}/{rid}", headers=ops, json={"approve": False})
    assert again.status_code == 400 and again.json()["error"]["param"] == "approval_request_id"
    assert httpx.get(admin, headers=ops).json()["data"] == []

    # the client continues without an answer of its own: the operator's applies
    ran = a.responses.create(model="full", input="go on", previous_response_id=r.id, tools=tools)
    call = ran.output[0]
    assert call.type == "mcp_call" and call.output == "OPS" and call.approval_request_id == rid
    # and answering it too is a duplicate
    with pytest.raises(openai.BadRequestError):
        a.responses.create(
            model="full", previous_response_id=r.id, tools=tools,
            input=[{"type": "mcp_approval_response", "approval_request_id": rid, "approve": True}],
        )  # fmt: skip


def test_a_stdio_server_the_operator_configured_is_used_by_label(make_stack):
    up = FakeUpstream().then(asks("shout", '{"text": "local"}'), Behaviour())
    command = [sys.executable, "-m", "tests.support.mcp_server"]
    mcp = {"servers": [{"label": "local", "command": command, "tenants": ["*"]}], "timeout_s": 20}
    stack = make_stack([up], responses={"mcp": mcp})
    tools: Any = [{"type": "mcp", "server_label": "local", "require_approval": "never"}]
    r = stack.client().responses.create(model="full", input="shout", tools=tools)
    assert [o.type for o in r.output] == ["mcp_list_tools", "mcp_call", "message"]
    assert r.output[1].output == "LOCAL"  # type: ignore[union-attr]


def test_a_server_that_never_answers_times_out(make_stack):
    with serve_in_thread(hanging_app()) as base:
        mcp = {"servers": [{"label": "slow", "url": base + "/mcp", "tenants": ["*"]}],
               "timeout_s": 1}  # fmt: skip
        stack = make_stack([FakeUpstream()], responses={"mcp": mcp})
        started = time.monotonic()
        with pytest.raises(openai.APIStatusError) as err:
            stack.client().responses.create(model="full", input="x", tools=[tool(base + "/mcp")])
        assert time.monotonic() - started < 5
    assert err.value.status_code == 424 and "no answer within 1s" in err.value.message


def test_a_stream_tells_the_listing_first(make_stack, mcp_url):
    stack = build(make_stack, FakeUpstream(), [mcp_url])
    tools = [tool(mcp_url, require_approval="never")]
    with stack.client().responses.stream(model="full", input="hi", tools=tools) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_response()
    assert kinds[:5] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.mcp_list_tools.completed", "response.output_item.done",
    ]  # fmt: skip
    assert kinds[-1] == "response.completed"
    assert [o.type for o in final.output] == ["mcp_list_tools", "message"]
    stored = stack.client().responses.retrieve(final.id)
    assert [o.type for o in stored.output] == ["mcp_list_tools", "message"]


def test_an_approved_call_is_kept_when_the_first_step_is_refused(make_stack, mcp_url):
    """The approved call runs before the first model step; a refused step (here a kill
    switch, as a budget or a tier that is down would) fails the response, which is stored
    with the call: it ran once, the chain goes on from it, nothing runs it again."""
    up = FakeUpstream().then(
        asks("shout", '{"text": "hi"}'), asks("shout", '{"text": "yo"}', "call_2"), Behaviour()
    )  # fmt: skip
    stack = build(make_stack, up, [mcp_url])
    client = stack.client()
    tools = [tool(mcp_url)]

    def tier_off(active: bool) -> None:
        body = {"kind": "tier_off", "target": "full", "active": active, "reason": "drill"}
        r = httpx.post(stack.url + "/admin/v1/kill-switches", json=body)
        assert r.status_code == 200, r.text

    def approve(response: Any) -> list[dict[str, Any]]:
        rid = response.output[-1].id
        return [{"type": "mcp_approval_response", "approval_request_id": rid, "approve": True}]

    asked = client.responses.create(model="full", input="shout hi", tools=tools)
    tier_off(True)
    refused = client.responses.create(
        model="full", previous_response_id=asked.id, tools=tools, input=approve(asked)
    )
    assert refused.status == "failed" and "switched off" in refused.error.message
    (call,) = refused.output
    assert call.type == "mcp_call" and call.output == "HI"
    assert client.responses.retrieve(refused.id).output[0].output == "HI"  # stored
    assert len(up.requests) == 1  # the refused step never reached the tier
    # streamed: the refusal becomes the stream's response.failed, stored the same way
    with pytest.raises(openai.InternalServerError):  # no call ran first: passed on as is
        client.responses.create(
            model="full", input="shout yo", tools=tools, previous_response_id=refused.id
        )
    tier_off(False)
    asked2 = client.responses.create(
        model="full", input="shout yo", tools=tools, previous_response_id=refused.id
    )
    assert asked2.output[-1].type == "mcp_approval_request"
    tier_off(True)
    events = list(
        client.responses.create(
            model="full", previous_response_id=asked2.id, tools=tools, input=approve(asked2),
            stream=True,
        )
    )  # fmt: skip
    assert [e.type for e in events][:2] == ["response.created", "response.in_progress"]
    assert events[-1].type == "response.failed"
    streamed = client.responses.retrieve(events[-1].response.id)
    assert streamed.status == "failed" and streamed.output[0].output == "YO"
    tier_off(False)
    # going on from the failed response: the model sees the call's result; no answer is
    # needed and none is accepted again; the call does not run again
    again = client.responses.create(
        model="full", input="go on", tools=tools, previous_response_id=streamed.id
    )
    assert again.status == "completed" and [o.type for o in again.output] == ["message"]
    assert {"role": "tool", "tool_call_id": "call_2", "content": "YO"} in up.requests[-1][
        "messages"
    ]
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(
            model="full", previous_response_id=streamed.id, tools=tools, input=approve(asked2)
        )
    assert "already" in err.value.message
