"""Chat chunks re-told as Responses events: order, sequence numbers, the SDK's own types."""

from __future__ import annotations

from typing import Any

import orjson
import pydantic
from openai.types.responses import ResponseStreamEvent

from gateway.pipeline.responses.chat import echo
from gateway.pipeline.responses.output import Frame
from gateway.pipeline.responses.protocol import ResponsesRequest
from gateway.pipeline.responses.stream import StreamTranslator
from gateway.upstream.sse import DONE

EVENTS: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(ResponseStreamEvent)


def translator() -> StreamTranslator:
    r = ResponsesRequest.model_validate({"model": "auto", "input": "hi", "stream": True})
    return StreamTranslator(Frame.new(r, echo(r), stored=True))


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **top: Any) -> bytes:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return b"data: " + orjson.dumps({"model": "m", "choices": choices, **top}) + b"\n\n"


def tool(
    index: int, args: str, call_id: str | None = None, name: str | None = None
) -> dict[str, Any]:
    fn: dict[str, Any] = {"arguments": args}
    if name:
        fn["name"] = name
    return {"index": index, "id": call_id, "type": "function" if call_id else None, "function": fn}


def run(t: StreamTranslator, chunks: list[bytes]) -> tuple[list[Any], dict[str, Any]]:
    raw = t.start() + b"".join(t.feed(c) for c in chunks)
    end, response = t.finish()
    events = []
    for block in (raw + end).split(b"\n\n")[:-1]:
        name, data = block.split(b"\n")
        event = EVENTS.validate_python(orjson.loads(data[len(b"data: ") :]))
        assert name == b"event: " + event.type.encode()
        events.append(event)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    return events, response


def test_text_then_two_tool_calls():
    t = translator()
    events, response = run(t, [
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": "let me "}), chunk({"content": "check"}),
        chunk({"tool_calls": [tool(0, "", "call_a", "get_weather")]}),
        chunk({"tool_calls": [tool(0, '{"city": ')]}), chunk({"tool_calls": [tool(0, '"Paris"}')]}),
        chunk({"tool_calls": [tool(1, "{}", "call_b", "get_time")]}, "tool_calls"),
        chunk(usage={"prompt_tokens": 3, "completion_tokens": 9}), DONE,
    ])  # fmt: skip
    assert [e.type for e in events] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.completed",
    ]  # fmt: skip
    assert events[6].text == "let me check"
    assert [e.output_index for e in events if e.type == "response.output_item.added"] == [0, 1, 2]
    assert response["status"] == "completed" and response["model"] == "m"
    assert response["usage"]["total_tokens"] == 12
    out = response["output"]
    assert [o["type"] for o in out] == ["message", "function_call", "function_call"]
    assert (out[1]["call_id"], out[1]["name"], out[1]["arguments"]) == (
        "call_a", "get_weather", '{"city": "Paris"}',
    )  # fmt: skip
    assert events[-1].response.output[2].name == "get_time"


def test_cut_on_the_token_limit_is_incomplete():
    events, response = run(translator(), [chunk({"content": "ab"}, "length"), DONE])
    assert events[-1].type == "response.incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert response["output"][0]["status"] == "incomplete"


def test_a_mid_stream_error_fails_the_response():
    error = b'data: {"error": {"message": "replica dropped", "type": "upstream_error"}}\n\n'
    events, response = run(translator(), [chunk({"content": "ab"}), error, DONE])
    assert events[-1].type == "response.failed"
    assert response["error"] == {"code": "server_error", "message": "replica dropped"}


def test_an_empty_answer_is_one_empty_message():
    events, response = run(translator(), [chunk({"content": ""}, "stop"), DONE])
    assert [e.type for e in events][2:] == [
        "response.output_item.added", "response.content_part.added",
        "response.output_text.done", "response.content_part.done",
        "response.output_item.done", "response.completed",
    ]  # fmt: skip
    assert response["output"][0]["content"][0]["text"] == ""


def test_noise_is_ignored():
    t = translator()
    assert t.feed(b": keep-alive\n\n") == b"" and t.feed(b"data: [1]\n\n") == b""
    assert t.feed(b"data: {not json\n\n") == b"" and not t.ended
