"""Escalation before commit: which fast-tier answers must not reach the client."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.pipeline.escalation import problem
from tests.support.tools import WEATHER_TOOLS

BODY = {
    "model": "auto",
    "messages": [{"role": "user", "content": "weather?"}],
    "tools": WEATHER_TOOLS,
}


def answer(*, content: str | None = "ok", calls: list[Any] | None = None, finish: str = "stop"):
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls is not None:
        message["tool_calls"] = calls
    return {"choices": [{"index": 0, "message": message, "finish_reason": finish}]}


def call(name: str = "get_weather", arguments: str = '{"city": "Oslo"}') -> dict[str, Any]:
    return {"id": "c1", "type": "function", "function": {"name": name, "arguments": arguments}}


def test_a_valid_answer_passes():
    assert problem(BODY, answer()) is None
    assert problem(BODY, answer(content=None, calls=[call()], finish="tool_calls")) is None


def test_an_answer_cut_by_the_token_limit_is_escalated_unless_the_client_set_it():
    assert problem(BODY, answer(finish="length")) == (
        "truncated",
        "the answer was cut by the token limit",
    )
    for limit in ("max_tokens", "max_completion_tokens"):
        assert problem({**BODY, limit: 16}, answer(finish="length")) is None


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "get_weather"}}]
)
def test_a_forced_tool_choice_needs_a_tool_call(choice):
    assert problem({**BODY, "tool_choice": choice}, answer()) == (
        "no_tool_call",
        "a tool call was required and none came",
    )
    assert problem({**BODY, "tool_choice": choice}, answer(calls=[call()])) is None


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        (call(name="get_time"), "tool 'get_time' was not offered"),
        (call(arguments='{"city": '), "arguments are not valid JSON"),
        (call(arguments='{"town": "Oslo"}'), "arguments lacks the required 'city'"),
        (call(arguments='{"city": 3}'), "should be"),
    ],
)
def test_an_invalid_tool_call_is_escalated(bad, why):
    found = problem(BODY, answer(calls=[call(), bad]))
    assert found is not None and found[0] == "invalid_tool_call" and why in found[1]


def test_tool_calls_are_not_checked_when_no_tools_were_offered():
    body = {"model": "auto", "messages": []}
    assert problem(body, answer(calls=[call(name="anything", arguments="not json")])) is None


def test_answers_that_are_not_objects_are_not_judged():
    assert problem(BODY, None) is None and problem(BODY, [1]) is None
    assert (
        problem(BODY, {"choices": ["junk", {"message": "text", "finish_reason": "stop"}]}) is None
    )


def test_a_tool_call_whose_function_is_not_an_object_is_an_invalid_tool_call():
    found = problem(
        BODY, answer(calls=[{"id": "c1", "type": "function", "function": "get_weather"}])
    )
    assert found is not None and found[0] == "invalid_tool_call"
