"""bench.mock_upstream's answers: a session's request gets the assistant message its next
request carries, whole or streamed as vLLM streams it; ``--answers canned`` and any other
request get the canned sentence (streamed: 20 numbered words)."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
import pytest

from bench.agent_body import CLOSING, session_answers, session_bodies
from bench.loadgen import body as request_body
from bench.mock_upstream import ANSWER, MockProtocol


def assembled(events: list[dict[str, Any]]) -> tuple[dict[str, Any], str | None]:
    """The streamed message, put together from its deltas, and its finish reason."""
    text, calls, finish = "", {}, None
    for event in events:
        (choice,) = event["choices"] or [{"delta": {}, "finish_reason": None}]
        delta = choice["delta"]
        text += delta.get("content") or ""
        for tc in delta.get("tool_calls") or ():
            slot = calls.setdefault(tc["index"], {"function": {"name": "", "arguments": ""}})
            slot.update({k: tc[k] for k in ("id", "type") if k in tc})
            for key, value in tc.get("function", {}).items():
                slot["function"][key] += value
        finish = choice["finish_reason"] or finish
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message, finish


async def ask(answers: str, payloads: list[bytes]) -> list[bytes]:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: MockProtocol(20, 0.0, 0.0, answers), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with aiohttp.ClientSession() as http:
            out = []
            for data in payloads:
                url = f"http://127.0.0.1:{port}/v1/chat/completions"
                async with http.post(url, data=data) as resp:
                    out.append(await resp.read())
            return out
    finally:
        server.close()


def events(stream: bytes) -> list[dict[str, Any]]:
    lines = [line[6:] for line in stream.split(b"\n") if line.startswith(b"data: {")]
    return [orjson.loads(line) for line in lines]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_each_step_is_answered_with_what_the_next_request_carries(stream: bool):
    bodies = session_bodies(5)
    expected = session_answers(5)
    assert expected[-1] == {"role": "assistant", "content": CLOSING}
    for before, after, answer in zip(bodies, bodies[1:], expected, strict=False):
        assert after["messages"][len(before["messages"])] == answer
    chat = request_body("auto", stream)  # two short messages: not a session's
    got = await ask("session", [request_body("auto", stream, b) for b in bodies] + [chat])
    canned = "".join(f" tok{i}" for i in range(20)) if stream else ANSWER
    for raw, answer in zip(got, [*expected, {"role": "assistant", "content": canned}], strict=True):
        if stream:
            message, finish = assembled(events(raw))
        else:
            (choice,) = orjson.loads(raw)["choices"]
            message, finish = choice["message"], choice["finish_reason"]
        assert message == answer
        assert finish == ("tool_calls" if answer.get("tool_calls") else "stop")


async def test_canned_answers_are_the_same_sentence_for_every_request():
    bodies = session_bodies(1)[:3]
    got = await ask("canned", [request_body("auto", False, b) for b in bodies])
    assert {orjson.loads(raw)["choices"][0]["message"]["content"] for raw in got} == {ANSWER}
    (streamed,) = await ask("canned", [request_body("auto", True, bodies[0])])
    message, finish = assembled(events(streamed))
    assert message["content"] == "".join(f" tok{i}" for i in range(20)) and finish == "stop"
