"""Hosted-call items sent back as input (stateless continuation): each malformed field is a
400 naming it; good ones replay as the call the model made and the output it was told."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.errors import InvalidRequest
from gateway.pipeline.responses.items import normalize_input, to_messages

CI: dict[str, Any] = {
    "type": "code_interpreter_call", "id": "ci_1", "status": "completed", "code": "print(6*7)",
    "container_id": "resp_1", "outputs": [{"type": "logs", "logs": "42\n"}], "call_id": "call_1",
}  # fmt: skip
MCP: dict[str, Any] = {
    "type": "mcp_call", "id": "mcp_1", "status": "completed", "server_label": "demo",
    "name": "add", "arguments": '{"a": 2, "b": 3}', "output": "5", "error": None,
    "approval_request_id": None, "call_id": "call_2",
}  # fmt: skip
LISTING: dict[str, Any] = {
    "type": "mcp_list_tools", "id": "mcpl_1", "server_label": "demo", "error": None,
    "tools": [{"name": "add", "description": "Add.", "annotations": None,
               "input_schema": {"type": "object", "properties": {}}}],
}  # fmt: skip
ASKED = {"role": "user", "content": "compute"}


def with_(item: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {k: v for k, v in {**item, **changes}.items() if v is not ...}


def test_a_stateless_client_replays_the_hosted_calls_it_was_given():
    items = normalize_input([ASKED, LISTING, CI, MCP, {"role": "user", "content": "and now?"}])
    assert [i["type"] for i in items] == ["message", "mcp_list_tools", "code_interpreter_call",
                                          "mcp_call", "message"]  # fmt: skip
    assert items[2] == {**CI, "arguments": None}  # the shape the gateway writes
    assert items[3] == MCP
    messages = to_messages([], items, None)
    assert messages == [
        {"role": "user", "content": "compute"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "run_python", "arguments": '{"code":"print(6*7)"}'}},
            {"id": "call_2", "type": "function",
             "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}},
        ]},
        {"role": "tool", "tool_call_id": "call_1", "content": "42\n"},
        {"role": "tool", "tool_call_id": "call_2", "content": "5"},
        {"role": "user", "content": "and now?"},
    ]  # fmt: skip


def test_a_call_whose_approval_request_is_not_in_the_chain_is_told_as_any_other():
    approved = with_(MCP, approval_request_id="mcpr_gone")
    messages = to_messages([], normalize_input([ASKED, approved]), None)
    assert messages[-1] == {"role": "tool", "tool_call_id": "call_2", "content": "5"}


def test_a_call_cannot_settle_an_approval_request_of_the_chain():
    with pytest.raises(InvalidRequest) as err:
        normalize_input([with_(MCP, approval_request_id="mcpr_1")], ["mcpr_1"])
    assert err.value.param == "input[0].approval_request_id"


@pytest.mark.parametrize(
    ("item", "param"),
    [
        (with_(CI, code=3), "input[0].code"),
        (with_(CI, outputs="42"), "input[0].outputs"),
        (with_(CI, outputs=[{"type": "files"}]), "input[0].outputs[0].type"),
        (with_(CI, outputs=[{"type": "logs", "logs": 1}]), "input[0].outputs[0].logs"),
        (with_(CI, outputs=[{"type": "logs", "logs": "", "x": 1}]), "input[0].outputs[0].x"),
        (with_(CI, status="done"), "input[0].status"),
        (with_(CI, shell="bash"), "input[0].shell"),
        (with_(CI, id=""), "input[0].id"),
        (with_(MCP, server_label=None), "input[0].server_label"),
        (with_(MCP, name=""), "input[0].name"),
        (with_(MCP, arguments={"a": 1}), "input[0].arguments"),
        (with_(MCP, output=5), "input[0].output"),
        (with_(MCP, error=["x"]), "input[0].error"),
        (with_(MCP, approval_request_id=""), "input[0].approval_request_id"),
        (with_(LISTING, tools="add"), "input[0].tools"),
        (with_(LISTING, tools=["add"]), "input[0].tools[0]"),
        (with_(LISTING, tools=[{"name": "add"}]), "input[0].tools[0].input_schema"),
        (with_(LISTING, tools=[{"name": "", "input_schema": {}}]), "input[0].tools[0].name"),
        (with_(LISTING, tools=[{"name": "a", "input_schema": {}, "x": 1}]), "input[0].tools[0].x"),
        (with_(LISTING, tools=[{"input_schema": {}}] * 1001), "input[0].tools"),
        (with_(LISTING, server_label=...), "input[0].server_label"),
    ],
)  # fmt: skip
def test_malformed_hosted_items_name_the_field(item: dict[str, Any], param: str):
    with pytest.raises(InvalidRequest) as err:
        normalize_input([item])
    assert err.value.param == param, err.value.message
    assert err.value.status == 400


def test_an_approval_request_is_not_taken_as_input():
    request = {"type": "mcp_approval_request", "id": "mcpr_1", "server_label": "demo",
               "name": "add", "arguments": "{}"}  # fmt: skip
    with pytest.raises(InvalidRequest, match="not supported yet") as err:
        normalize_input([request])
    assert err.value.param == "input[0].type"
