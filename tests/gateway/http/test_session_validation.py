"""A named session's history is validated once; the answers stay those of a whole validation."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gateway.errors import InvalidRequest
from gateway.http.body import checked
from gateway.http.protocol import REQUESTS
from gateway.http.session_validation import SessionValidator

CHAT = REQUESTS["chat"]

TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {}}}]
SESSION = ("tenant-a", "s1")


def step(n: int, **extra: Any) -> dict[str, Any]:
    """An agent's request after ``n`` tool calls: system, user, then call + result pairs."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": "Fix the build."},
    ]
    for i in range(n):
        call = {"id": f"c{i}", "type": "function",
                "function": {"name": "read_file", "arguments": f'{{"path": "f{i}.py"}}'}}  # fmt: skip
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{i}", "content": f"contents of f{i}.py"},
        ]
    return {"model": "auto", "messages": messages, "tools": TOOLS, **extra}


def check(v: SessionValidator, body: dict[str, Any], session: tuple[str, str] | None = SESSION):
    v.validate(body, CHAT, session, 1000)


def error_of(fn: Any) -> tuple[str, str | None]:
    with pytest.raises(InvalidRequest) as caught:
        fn()
    return caught.value.message, caught.value.param


def test_a_growing_session_validates_only_its_new_messages():
    v = SessionValidator()
    check(v, step(0))
    check(v, step(1))
    assert v.skipped == 2  # step 1 repeats step 0's two messages
    check(v, step(2))
    assert v.skipped == 2 + 4


def test_an_invalid_new_message_gets_the_whole_bodys_error():
    v = SessionValidator()
    check(v, step(3))
    bad = step(4)
    bad["messages"][-1]["content"] = 7  # a number where text belongs
    expected = error_of(lambda: checked(bad, CHAT))
    assert error_of(lambda: check(v, bad)) == expected
    assert expected[1] is not None and "9" in expected[1]  # names the message's own index


def test_other_fields_are_validated_at_every_step():
    v = SessionValidator()
    check(v, step(2))
    bad = step(3, temperature="hot")
    assert error_of(lambda: check(v, bad)) == error_of(lambda: checked(bad, CHAT))


def test_a_changed_prefix_is_validated_again():
    v = SessionValidator()
    check(v, step(3))
    edited = step(4)
    edited["messages"][1]["content"] = ["not", "parts"]  # history rewritten, now invalid
    assert error_of(lambda: check(v, edited)) == error_of(lambda: checked(edited, CHAT))
    skipped = v.skipped
    compacted = step(4)
    del compacted["messages"][2:6]  # a client that compacted its history: valid, checked whole
    check(v, compacted)
    assert v.skipped == skipped


def test_changed_tools_are_validated_again():
    v = SessionValidator()
    check(v, step(2))
    bad = step(3)
    bad["tools"] = [{"type": "function", "function": {"name": "bad name!"}}]
    assert error_of(lambda: check(v, bad)) == error_of(lambda: checked(bad, CHAT))


def test_a_resent_request_stays_valid():
    v = SessionValidator()
    check(v, step(2))
    check(v, copy.deepcopy(step(2)))
    assert v.skipped == 6


def test_sessions_of_other_tenants_are_apart():
    v = SessionValidator()
    check(v, step(2), ("tenant-a", "s1"))
    check(v, step(3), ("tenant-b", "s1"))  # same session id, another tenant: whole
    assert v.skipped == 0
    check(v, step(3), ("tenant-a", "s1"))
    assert v.skipped == 6


def test_unnamed_requests_are_not_remembered():
    v = SessionValidator()
    check(v, step(2), None)
    check(v, step(3), None)
    assert v.skipped == 0 and len(v) == 0


def test_memory_is_bounded_by_sessions_and_bytes():
    v = SessionValidator(max_sessions=3, max_bytes=10_000)
    for i in range(5):
        v.validate(step(1), CHAT, ("t", f"s{i}"), 1000)
    assert len(v) == 3 and v.bytes == 3000
    v.validate(step(1), CHAT, ("t", "big"), 9_500)
    assert len(v) == 1 and v.bytes == 9_500  # the older ones made room
    v.validate(step(1), CHAT, ("t", "huge"), 20_000)  # over the bound alone
    assert len(v) == 1 and v.bytes == 9_500
    v.validate(step(1), CHAT, ("t", "big"), 20_000)  # grew past it: forgotten
    assert len(v) == 0 and v.bytes == 0


def test_no_validator_of_a_chat_request_looks_across_its_fields():
    """What makes validating only the new messages exact: the request and its messages and
    tools are plain shapes, with no validator function anywhere in their schema (one could
    compare one message with another, or tool_choice with tools). Adding one must revisit
    gateway/http/session_validation.py."""

    def functions(schema: Any) -> list[str]:
        if isinstance(schema, dict):
            own = [schema["type"]] if str(schema.get("type", "")).startswith("function") else []
            return own + [f for v in schema.values() for f in functions(v)]
        if isinstance(schema, list):
            return [f for v in schema for f in functions(v)]
        return []

    schema = CHAT.core_schema
    assert "typed-dict" in str(schema)  # the walk sees the shapes
    assert functions(schema) == []


def test_the_history_is_written_once_for_the_payload():
    import orjson

    v = SessionValidator()
    body = step(2)
    encoded = v.validate(body, CHAT, SESSION, 1000)
    assert encoded == {"messages": orjson.dumps(body["messages"]), "tools": orjson.dumps(TOOLS)}
    assert v.validate(step(2), CHAT, None, 1000) == {}  # unnamed: nothing


def test_a_history_written_otherwise_is_validated_whole():
    """Equal by ``==`` is not enough: keys in another order are another text."""
    v = SessionValidator()
    check(v, step(2))
    reordered = step(3)
    reordered["messages"][0] = {"content": "You are an agent.", "role": "system"}
    check(v, reordered)
    assert v.skipped == 0
    check(v, step(4))  # the reordered one was remembered; this history differs from it
    assert v.skipped == 0


def test_a_body_too_deep_to_write_is_validated_whole_and_not_remembered():
    deep: Any = 1
    for _ in range(300):
        deep = [deep]
    v = SessionValidator()
    check(v, step(1))
    body = step(2)
    body["messages"][0]["x_deep"] = deep  # an extra field: valid
    assert v.validate(body, CHAT, SESSION, 1000) == {}
    assert len(v) == 0 and v.bytes == 0 and v.skipped == 0
