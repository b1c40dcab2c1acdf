"""Input items: every malformed item is a 400 naming its field; good ones become messages."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.errors import InvalidRequest
from gateway.pipeline.responses.items import normalize_input, to_messages


def fc(call_id: str = "call_1", **extra: Any) -> dict[str, Any]:
    return {"type": "function_call", "call_id": call_id, "name": "f", "arguments": "{}", **extra}


def out(call_id: str = "call_1", output: Any = "ok") -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": output}


@pytest.mark.parametrize(
    ("value", "param"),
    [
        ([], "input"),
        (["hi"], "input[0]"),
        ([{"type": "bogus"}], "input[0].type"),
        ([{"type": "reasoning", "summary": []}], "input[0].type"),
        ([{"type": "item_reference", "id": "msg_1"}], "input[0].type"),
        ([{"type": "mcp_approval_response", "approve": True}], "input[0].approval_request_id"),
        ([{"type": "mcp_approval_response", "approval_request_id": 3, "approve": True}], "input[0].approval_request_id"),
        ([{"type": "mcp_approval_response", "approval_request_id": "r"}], "input[0].approve"),
        ([{"type": "mcp_approval_response", "approval_request_id": "r", "approve": "yes"}], "input[0].approve"),
        ([{"type": "mcp_approval_response", "approval_request_id": "r", "approve": True, "reason": 1}], "input[0].reason"),
        ([{"type": "mcp_approval_response", "approval_request_id": "r", "approve": True, "by": "me"}], "input[0].by"),
        ([{"type": "mcp_approval_request", "id": "r", "name": "f"}], "input[0].type"),
        ([{"role": "user", "content": "x", "name": "bob"}], "input[0].name"),
        ([{"role": "user", "content": "x", "id": 7}], "input[0].id"),
        ([{"role": "user", "content": "x", "id": "a" * 65}], "input[0].id"),
        ([{"role": "user", "content": "x", "id": "m"}, {"role": "user", "content": "y", "id": "m"}], "input[1].id"),
        ([{"content": "x"}], "input[0].role"),
        ([{"role": "tool", "content": "x"}], "input[0].role"),
        ([{"role": "user"}], "input[0].content"),
        ([{"role": "user", "content": 3}], "input[0].content"),
        ([{"role": "user", "content": ["x"]}], "input[0].content[0]"),
        ([{"role": "user", "content": [{"type": "output_text", "text": "x"}]}], "input[0].content[0].type"),
        ([{"role": "assistant", "content": [{"type": "input_text", "text": "x"}]}], "input[0].content[0].type"),
        ([{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}], "input[0].content[0].type"),
        ([{"role": "user", "content": [{"type": "input_text", "text": 1}]}], "input[0].content[0].text"),
        ([{"role": "user", "content": [{"type": "input_text"}]}], "input[0].content[0].text"),
        ([{"role": "user", "content": [{"type": "input_text", "text": "x", "lang": "fr"}]}], "input[0].content[0].lang"),
        ([{"role": "assistant", "content": [{"type": "refusal"}]}], "input[0].content[0].refusal"),
        ([fc(call_id="")], "input[0].call_id"),
        ([{"type": "function_call", "name": "f", "arguments": "{}"}], "input[0].call_id"),
        ([fc(name=None)], "input[0].name"),
        ([fc(arguments={"a": 1})], "input[0].arguments"),
        ([fc(), out(output=3)], "input[1].output"),
        ([fc(), out(output=[{"type": "input_image"}])], "input[1].output[0].type"),
        ([fc(), out(output=[{"type": "input_text", "text": None}])], "input[1].output[0].text"),
        ([out("nope")], "input[0].call_id"),
        ([{"role": "user", "content": "x"}, fc()], "input"),  # a call with no output
    ],
)  # fmt: skip
def test_malformed_items_name_the_field(value: list[Any], param: str):
    with pytest.raises(InvalidRequest) as err:
        to_messages([], normalize_input(value), None)
    assert err.value.param == param, err.value.message
    assert err.value.status == 400


def test_an_item_already_in_the_chain_is_refused():
    history = normalize_input([{"role": "user", "content": "x", "id": "msg_1"}])
    with pytest.raises(InvalidRequest) as err:
        normalize_input([{"role": "user", "content": "again", "id": "msg_1"}], ["msg_1"])
    assert err.value.param == "input[0].id"
    assert history[0]["id"] == "msg_1"


def test_a_string_is_one_user_message_with_an_id():
    (item,) = normalize_input("hi")
    assert item["id"].startswith("msg_") and item["status"] == "completed"
    assert item["content"] == [{"type": "input_text", "text": "hi"}]
    assert to_messages([], [item], "be brief") == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
    ]


def test_sdk_shaped_items_round_trip():
    """What a client sends back from ``response.output`` (ids, status, annotations)."""
    items = normalize_input(
        [
            {"role": "developer", "content": "rules"},
            {"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
            {"id": "msg_x", "type": "message", "role": "assistant", "status": "completed",
             "content": [{"type": "output_text", "text": "thinking", "annotations": []}]},
            fc("call_1", id="fc_1", status="completed"),
            fc("call_2"),
            out("call_1", [{"type": "input_text", "text": "1"}, {"type": "input_text", "text": "8C"}]),
            out("call_2", "rain"),
            {"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]},
        ]
    )  # fmt: skip
    assert [i["id"] for i in items][2:4] == ["msg_x", "fc_1"]
    calls = [
        {"id": c, "type": "function", "function": {"name": "f", "arguments": "{}"}}
        for c in ("call_1", "call_2")
    ]
    assert to_messages(items[:2], items[2:], None) == [
        {"role": "developer", "content": "rules"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": "thinking", "tool_calls": calls},
        {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
        {"role": "tool", "tool_call_id": "call_2", "content": "rain"},
        {"role": "assistant", "content": "no"},
    ]


def test_a_call_from_the_chain_is_answered_by_this_request():
    history = normalize_input([{"role": "user", "content": "go"}, fc("call_9")])
    with pytest.raises(InvalidRequest) as err:
        to_messages(history, normalize_input("forgot the output"), None)
    assert err.value.param == "input" and "previous_response_id" in err.value.message
    messages = to_messages(history, normalize_input([out("call_9")]), None)
    assert messages[-1] == {"role": "tool", "tool_call_id": "call_9", "content": "ok"}
    assert messages[1] == {
        "role": "assistant", "content": None,
        "tool_calls": [{"id": "call_9", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
    }  # fmt: skip
