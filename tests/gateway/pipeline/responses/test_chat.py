"""A Responses request as a chat request: tools, tool choice, text format, sampling."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.errors import InvalidRequest
from gateway.pipeline.responses.chat import chat_body, echo
from gateway.pipeline.responses.protocol import (
    ResponsesRequest,
    check_names,
    check_supported,
)

TOOL = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}
MESSAGES = [{"role": "user", "content": "hi"}]


def request(**fields: Any) -> ResponsesRequest:
    return ResponsesRequest.model_validate({"model": "auto", "input": "hi", **fields})


def body(**fields: Any) -> dict[str, Any]:
    r = request(**fields)
    return chat_body(r, MESSAGES, echo(r))


def test_plain_request():
    assert body() == {"model": "auto", "messages": MESSAGES}
    assert body(stream=True, max_output_tokens=9, temperature=0, top_p=0.5) == {
        "model": "auto", "messages": MESSAGES, "stream": True,
        "stream_options": {"include_usage": True}, "max_tokens": 9, "temperature": 0,
        "top_p": 0.5,
    }  # fmt: skip


def test_function_tools_and_tool_choice():
    sent = body(tools=[TOOL], tool_choice={"type": "function", "name": "get_weather"},
                parallel_tool_calls=False)  # fmt: skip
    assert sent["tools"] == [
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    ]
    assert sent["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert sent["parallel_tool_calls"] is False
    assert body(tools=[TOOL], tool_choice="required")["tool_choice"] == "required"
    spec = echo(request(tools=[{"type": "function", "name": "f"}]))
    assert spec.tools == [
        {"type": "function", "name": "f", "description": None,
         "parameters": {"type": "object", "properties": {}}, "strict": None},
    ]  # fmt: skip
    assert spec.tool_choice == "auto" and spec.text == {"format": {"type": "text"}}


def test_text_formats():
    assert body(text={"format": {"type": "json_object"}})["response_format"] == {
        "type": "json_object"
    }
    schema = {"type": "object"}
    fmt = {"type": "json_schema", "name": "x", "schema": schema, "description": "d"}
    assert body(text={"format": fmt, "verbosity": "low"})["response_format"] == {
        "type": "json_schema", "json_schema": {"name": "x", "schema": schema, "description": "d"},
    }  # fmt: skip
    assert "response_format" not in body(text={"format": {"type": "text"}})


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": ["f"]}, "tools[0]"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"tools": [{"name": "f"}]}, "tools[0].type"),
        ({"tools": [{"type": "function", "name": "bad name"}]}, "tools[0].name"),
        ({"tools": [{"type": "function", "name": "f", "parameters": "x"}]}, "tools[0].parameters"),
        ({"tools": [{"type": "function", "name": "f", "function": {}}]}, "tools[0].function"),
        ({"tool_choice": "sometimes"}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [TOOL], "tool_choice": {"type": "function", "name": "other"}}, "tool_choice.name"),
        ({"tools": [TOOL], "tool_choice": {"type": "allowed_tools"}}, "tool_choice.type"),
        ({"text": {"format": "json"}}, "text.format"),
        ({"text": {"format": {"type": "yaml"}}}, "text.format.type"),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
        ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {}, "strict": 1}}}, "text.format.strict"),
        ({"text": {"style": "terse"}}, "text.style"),
    ],
)  # fmt: skip
def test_bad_tools_and_formats_name_the_field(fields: dict[str, Any], param: str):
    with pytest.raises(InvalidRequest) as err:
        body(**fields)
    assert err.value.param == param, err.value.message


def test_parameter_names():
    check_names({"model": "m", "input": "x", "reasoning": {}, "truncation": "auto"})
    with pytest.raises(InvalidRequest) as err:
        check_names({"model": "m", "input": "x", "zeta": 1, "alpha": 2})
    assert err.value.param == "alpha" and "'zeta'" in err.value.message
    for name, value in (("prompt", {"id": "p"}), ("conversation", "c")):
        with pytest.raises(InvalidRequest, match="not supported yet") as err:
            check_supported(request(**{name: value}))
        assert err.value.param == name
    check_supported(request(background=True, stream=True))  # a streamed background run
    with pytest.raises(InvalidRequest, match="must be stored") as err:
        check_supported(request(background=True, store=False))
    assert err.value.param == "background"
    check_supported(request(background=True))
    check_supported(request(background=False, reasoning={"effort": "high"}))
