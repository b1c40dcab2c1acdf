"""MCP tools of a request: every field checked, the approval policy, the allowlist, the stream."""

from __future__ import annotations

from typing import Any

import orjson
import pydantic
import pytest
from openai.types.responses import ResponseStreamEvent

from gateway.config import McpSettings
from gateway.errors import InvalidRequest
from gateway.pipeline.responses import mcp_tools
from gateway.pipeline.responses.chat import echo
from gateway.pipeline.responses.output import Frame
from gateway.pipeline.responses.protocol import ResponsesRequest
from gateway.pipeline.responses.stream import StreamTranslator

URL = "https://mcp.example.com/mcp"
EVENTS: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(ResponseStreamEvent)


def mcp(**fields: Any) -> dict[str, Any]:
    return {"type": "mcp", "server_label": "docs", "server_url": URL, **fields}


@pytest.mark.parametrize(
    ("tool", "param"),
    [
        ({"type": "mcp", "server_url": URL}, "tools[0].server_label"),
        (mcp(server_label=""), "tools[0].server_label"),
        (mcp(server_label="a b"), "tools[0].server_label"),
        (mcp(server_label="sandbox"), "tools[0].server_label"),
        (mcp(server_url="ftp://x"), "tools[0].server_url"),
        (mcp(server_url=3), "tools[0].server_url"),
        (mcp(headers=["x"]), "tools[0].headers"),
        (mcp(headers={"x": 1}), "tools[0].headers"),
        (mcp(allowed_tools="search"), "tools[0].allowed_tools"),
        (mcp(allowed_tools=[1]), "tools[0].allowed_tools"),
        (mcp(allowed_tools={"names": ["a"]}), "tools[0].allowed_tools.names"),
        (mcp(allowed_tools={"tool_names": "a"}), "tools[0].allowed_tools.tool_names"),
        (mcp(allowed_tools={"read_only": "yes"}), "tools[0].allowed_tools.read_only"),
        (mcp(require_approval="sometimes"), "tools[0].require_approval"),
        (mcp(require_approval={"maybe": {}}), "tools[0].require_approval.maybe"),
        (mcp(require_approval={"never": ["a"]}), "tools[0].require_approval.never"),
        (mcp(require_approval={"always": {"tool_names": [""]}}),
         "tools[0].require_approval.always.tool_names"),
        (mcp(server_description=1), "tools[0].server_description"),
        (mcp(connector_id="connector_gmail"), "tools[0].connector_id"),
        (mcp(authorization="token"), "tools[0].authorization"),
        (mcp(bogus=1), "tools[0].bogus"),
    ],
)  # fmt: skip
def test_malformed_mcp_tools_name_the_field(tool: dict[str, Any], param: str) -> None:
    request = ResponsesRequest.model_validate({"model": "auto", "input": "x", "tools": [tool]})
    with pytest.raises(InvalidRequest) as err:
        echo(request)
    assert err.value.param == param, err.value.message


def test_two_servers_with_one_label_are_refused() -> None:
    tools = [mcp(), mcp(server_url="https://other.example.com/mcp")]
    request = ResponsesRequest.model_validate({"model": "auto", "input": "x", "tools": tools})
    with pytest.raises(InvalidRequest) as err:
        echo(request)
    assert err.value.param == "tools[1].server_label"


def approval(value: Any) -> dict[str, bool]:
    tool, _ = mcp_tools.parse(mcp(require_approval=value), "tools[0]")
    listed = [
        {"name": "read", "annotations": {"readOnlyHint": True}},
        {"name": "write", "annotations": None},
        {"name": "other"},
    ]
    return {t["name"]: tool.needs_approval(t) for t in listed}


def test_the_approval_policy() -> None:
    assert approval(None) == {"read": True, "write": True, "other": True}  # OpenAI's default
    assert approval("always") == {"read": True, "write": True, "other": True}
    assert approval("never") == {"read": False, "write": False, "other": False}
    assert approval({"never": {"tool_names": ["read"]}}) == {
        "read": False, "write": True, "other": True,
    }  # fmt: skip
    assert approval({"always": {"tool_names": ["write"]}}) == {
        "read": False, "write": True, "other": False,
    }  # fmt: skip
    assert approval({"never": {"read_only": True}, "always": {"tool_names": ["write"]}}) == {
        "read": False, "write": True, "other": True,
    }  # fmt: skip


def test_the_allowlist_denies_by_default_and_is_per_tenant() -> None:
    tool, _ = mcp_tools.parse(mcp(headers={"Authorization": "Bearer t"}), "tools[0]")
    with pytest.raises(InvalidRequest) as err:
        mcp_tools.target(McpSettings(), "a", tool)
    assert err.value.param == "tools[0].server_url" and URL in err.value.message
    settings = McpSettings.model_validate(
        {"servers": [
            {"label": "x", "url": URL + "/", "tenants": ["a"]},
            {"label": "local", "command": ["python", "-m", "server"], "tenants": ["*"]},
        ]}
    )  # fmt: skip
    found = mcp_tools.target(settings, "a", tool)
    assert (found.url, found.headers, found.label) == (URL, {"Authorization": "Bearer t"}, "docs")
    with pytest.raises(InvalidRequest):
        mcp_tools.target(settings, "b", tool)
    # a stdio server: by label, never by a URL a client could give
    local, _ = mcp_tools.parse({"type": "mcp", "server_label": "local"}, "tools[0]")
    assert mcp_tools.target(settings, "b", local).command == ("python", "-m", "server")
    with pytest.raises(InvalidRequest):
        mcp_tools.target(
            settings, "b", mcp_tools.parse({"type": "mcp", "server_label": "x"}, "t")[0]
        )


def test_a_server_needs_exactly_one_transport() -> None:
    with pytest.raises(pydantic.ValidationError):
        McpSettings.model_validate({"servers": [{"label": "x", "tenants": ["*"]}]})
    with pytest.raises(pydantic.ValidationError):
        McpSettings.model_validate(
            {"servers": [{"label": "x", "url": URL, "command": ["y"], "tenants": ["*"]}]}
        )
    with pytest.raises(pydantic.ValidationError):  # deny by default: tenants must be named
        McpSettings.model_validate({"servers": [{"label": "x", "url": URL, "tenants": []}]})


def test_the_listing_is_offered_through_the_filters() -> None:
    tool, _ = mcp_tools.parse(
        mcp(allowed_tools={"tool_names": ["write"], "read_only": True}, require_approval="never"),
        "tools[0]",
    )
    item = {"tools": [
        {"name": "read", "input_schema": {"type": "object"}, "description": "r",
         "annotations": {"readOnlyHint": True}},
        {"name": "write", "input_schema": {"type": "object"}},
        {"name": "drop", "input_schema": {"type": "object"}},
    ]}  # fmt: skip
    kinds, schemas = mcp_tools.offered(tool, item)
    assert kinds == {"read": "mcp:docs", "write": "mcp:docs"}
    assert [s["function"]["name"] for s in schemas] == ["read", "write"]
    assert mcp_tools.parse_kind("mcp?:docs") == ("docs", True)
    assert mcp_tools.parse_kind("code_interpreter") is None


def test_a_streamed_call_that_needs_approval_is_an_approval_request() -> None:
    r = ResponsesRequest.model_validate({"model": "auto", "input": "hi", "stream": True})
    t = StreamTranslator(Frame.new(r, echo(r), stored=True), {"shout": "mcp?:docs"})
    listing = {"id": "mcpl_1", "type": "mcp_list_tools", "server_label": "docs",
               "tools": [], "error": None}  # fmt: skip
    t.output.append(listing)  # what precedes the first step is told at the start
    call = {"index": 0, "id": "call_1", "type": "function",
            "function": {"name": "shout", "arguments": '{"text":'}}  # fmt: skip
    more = {"index": 0, "function": {"arguments": ' "hi"}'}}
    chunks = [{"tool_calls": [call]}, {"tool_calls": [more]}]
    raw = t.start() + b"".join(
        t.feed(b"data: " + orjson.dumps({"choices": [{"index": 0, "delta": d}]}) + b"\n\n")
        for d in chunks
    )
    t.feed(b"data: [DONE]\n\n")
    closed, answer = t.close_step()
    events = [
        EVENTS.validate_python(orjson.loads(block.split(b"\n")[1][len(b"data: ") :]))
        for block in (raw + closed).split(b"\n\n")[:-1]
    ]
    assert [e.type for e in events] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.mcp_list_tools.completed",
        "response.output_item.done",
        "response.output_item.added", "response.output_item.done",
    ]  # fmt: skip
    request = events[-1].item
    assert request.type == "mcp_approval_request" and request.arguments == '{"text": "hi"}'
    assert events[-1].output_index == 1
    assert [i["type"] for i in answer.items] == ["mcp_approval_request"]  # not the listing
