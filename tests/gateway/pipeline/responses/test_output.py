"""A chat answer as output items and a response object the ``openai`` SDK validates."""

from __future__ import annotations

from typing import Any

from openai.types.responses import Response

from gateway.pipeline.responses.chat import echo
from gateway.pipeline.responses.output import Frame, answer_items, status_of, usage
from gateway.pipeline.responses.protocol import ResponsesRequest

CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}


def frame(**fields: Any) -> Frame:
    r = ResponsesRequest.model_validate({"model": "auto", "input": "hi", **fields})
    return Frame.new(r, echo(r), stored=True)


def test_text_answer():
    (item,) = answer_items({"role": "assistant", "content": "hello"}, "stop")
    assert item["type"] == "message" and item["status"] == "completed"
    assert item["content"] == [{"type": "output_text", "text": "hello", "annotations": []}]


def test_tool_calls_answer():
    second = {**CALL, "id": None, "function": {"name": "g", "arguments": "{}"}}
    items = answer_items(
        {"role": "assistant", "content": None, "tool_calls": [CALL, second]}, "tool_calls"
    )
    assert [i["type"] for i in items] == ["function_call", "function_call"]
    assert (items[0]["call_id"], items[0]["name"], items[0]["arguments"]) == (
        "call_1",
        "f",
        '{"a": 1}',
    )
    assert items[1]["call_id"].startswith("call_")  # minted when the server gave none
    mixed = answer_items(
        {"role": "assistant", "content": "let me look", "tool_calls": [CALL]}, "tool_calls"
    )
    assert [i["type"] for i in mixed] == ["message", "function_call"]


def test_empty_and_cut_answers():
    (empty,) = answer_items({"role": "assistant", "content": None}, "stop")
    assert empty["content"][0]["text"] == ""
    (cut,) = answer_items({"role": "assistant", "content": "abc"}, "length")
    assert cut["status"] == "incomplete"
    assert status_of("length") == ("incomplete", {"reason": "max_output_tokens"})
    assert status_of("stop") == ("completed", None)


def test_usage():
    assert usage({"prompt_tokens": 7, "completion_tokens": 4, "total_tokens": 11}) == {
        "input_tokens": 7, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": 4, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 11,
    }  # fmt: skip
    assert usage(None) is None


def test_the_response_object_validates_as_the_sdks_type():
    f = frame(
        tools=[{"type": "function", "name": "f"}], tool_choice={"type": "function", "name": "f"},
        metadata={"k": "v"}, instructions="be brief", max_output_tokens=5,
        text={"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
    )  # fmt: skip
    output = answer_items({"role": "assistant", "content": "hi", "tool_calls": [CALL]}, "stop")
    body = f.response("completed", output, model="m", usage=usage({"prompt_tokens": 1}))
    r = Response.model_validate(body)  # strict shapes, unlike the SDK's lenient construct
    assert r.id == f.id and r.output_text == "hi" and r.model == "m"
    assert r.output[1].type == "function_call"
    failed = f.response("failed", [], error={"code": "server_error", "message": "boom"})
    assert Response.model_validate(failed).error is not None
    assert f.response("in_progress", [])["completed_at"] is None
