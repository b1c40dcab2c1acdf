"""The hosted loop's decisions, and a two-step stream validated against the SDK's event types."""

from __future__ import annotations

from typing import Any

import orjson

from gateway.pipeline.responses import hosted
from gateway.pipeline.responses.chat import echo
from gateway.pipeline.responses.loop import LoopState, StepAnswer, decide
from gateway.pipeline.responses.output import Frame, call_item, message_item
from gateway.pipeline.responses.protocol import ResponsesRequest
from gateway.pipeline.responses.stream import StreamTranslator
from gateway.upstream.sse import DONE
from sandbox.protocol import ToolResult
from tests.gateway.pipeline.responses.test_stream import EVENTS, chunk, tool

KINDS = {"run_python": "code_interpreter", "read_file": "sandbox"}


def hosted_call(name: str = "run_python") -> dict[str, Any]:
    item, _ = hosted.claim(call_item("c1", name, '{"code": "1"}'), KINDS, "s")
    return item


def step(*items: dict[str, Any], finish: str | None = "stop") -> StepAnswer:
    return StepAnswer(list(items), finish)


def plan(answer: StepAnswer, **caps: Any) -> tuple[bool, str | None, int, int]:
    args = {"calls": 0, "max_tool_calls": None, "turn": 0, "max_turns": 8, "tokens_left": None}
    d = decide(answer, **(args | caps))
    return d.end, d.reason, len(d.run), len(d.skipped)


def test_no_call_ends_completed_and_a_cut_answer_incomplete():
    assert plan(step(message_item("hi"))) == (True, None, 0, 0)
    assert plan(step(hosted_call(), finish="length")) == (True, "max_output_tokens", 0, 1)


def test_hosted_only_runs_and_goes_on_mixed_runs_and_ends_client_only_ends():
    assert plan(step(hosted_call(), hosted_call("read_file"))) == (False, None, 2, 0)
    mixed = step(hosted_call(), call_item("c2", "get_weather", "{}"))
    assert plan(mixed) == (True, None, 1, 0)
    assert plan(step(call_item("c2", "get_weather", "{}"))) == (True, None, 0, 0)


def test_caps():
    two = step(hosted_call(), hosted_call())
    assert plan(two, max_tool_calls=3, calls=2) == (True, "max_tool_calls", 1, 1)
    assert plan(two, max_tool_calls=2, calls=2) == (True, "max_tool_calls", 0, 2)
    assert plan(two, turn=7) == (True, "max_turns", 2, 0)
    assert plan(two, tokens_left=0) == (True, "max_output_tokens", 2, 0)
    state = LoopState(max_tool_calls=None, max_output_tokens=10, max_turns=8)
    usage = {"input_tokens": 5, "input_tokens_details": {"cached_tokens": 1},
             "output_tokens": 4, "total_tokens": 9}  # fmt: skip
    for _ in range(2):
        state.add(StepAnswer([hosted_call()], "tool_calls", usage))
    assert (state.turns, state.calls, state.tokens_left) == (2, 2, 2)
    assert state.usage is not None and state.usage["total_tokens"] == 18


def result(**fields: Any) -> ToolResult:
    return ToolResult.model_validate({"tool": "run_python", "allowed": True, "rule": "r", "reason": ""} | fields)  # fmt: skip


def test_a_tool_error_is_the_output_text_with_its_class():
    assert hosted.model_text(result(exit_status=0, stdout="42\n")) == ("42\n", True)
    denied = hosted.model_text(result(allowed=False, reason="write_file is not granted"))
    assert denied == ("error: denied: write_file is not granted (rule: r)", False)
    failed = hosted.model_text(result(exit_status=1, stderr="Traceback: boom"))
    assert failed == ("error: exit status 1\nTraceback: boom", False)
    timeout = hosted.model_text(result(exit_status=137, limit="wall_time", stdout="a"))
    assert timeout == ("error: timeout (exit status 137)\na", False)
    fault = hosted.model_text(result(fault="rate_limit", retry_after_s=2.0))
    assert fault[0].startswith("error: rate_limit (retry after 2.0s)") and not fault[1]


def parse(raw: bytes) -> list[Any]:
    events = []
    for block in raw.split(b"\n\n")[:-1]:
        name, data = block.split(b"\n")
        event = EVENTS.validate_python(orjson.loads(data[len(b"data: ") :]))
        assert name == b"event: " + event.type.encode()
        events.append(event)
    return events


def test_a_stream_of_two_steps_with_hosted_calls():
    r = ResponsesRequest.model_validate({"model": "auto", "input": "hi", "stream": True})
    t = StreamTranslator(Frame.new(r, echo(r), stored=True), KINDS, "sess")
    state = LoopState(None, None, 8)
    state.output = t.output
    raw = t.start() + b"".join(t.feed(c) for c in [
        chunk({"tool_calls": [tool(0, '{"code": ', "call_a", "run_python")]}),
        chunk({"tool_calls": [tool(0, '"print(1)"}')]}),
        chunk({"tool_calls": [tool(1, '{"path": "a"}', "call_b", "read_file")]}, "tool_calls"),
        DONE,
    ])  # fmt: skip
    events, answer = t.close_step()
    decision = state.add(answer)
    assert not decision.end and [i["type"] for i in decision.run] == ["code_interpreter_call", "mcp_call"]  # fmt: skip
    assert answer.arguments[decision.run[0]["id"]] == '{"code": "print(1)"}'
    raw += events + t.running(decision.run)
    hosted.settle(decision.run[0], "1\n", ok=True)
    hosted.settle(decision.run[1], "error: denied: no", ok=False)
    raw += t.settled(decision.run)
    raw += b"".join(t.feed(c) for c in [chunk({"content": "one"}, "stop"), DONE])
    events, answer = t.close_step()
    decision = state.add(answer)
    end, response = t.end(decision.status, usage=state.usage, model=state.model)
    seen = parse(raw + events + end)
    assert [e.sequence_number for e in seen] == list(range(len(seen)))
    assert [e.type for e in seen] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.code_interpreter_call.in_progress",
        "response.output_item.added", "response.mcp_call.in_progress",
        "response.mcp_call_arguments.delta",
        "response.code_interpreter_call_code.delta", "response.code_interpreter_call_code.done",
        "response.mcp_call_arguments.done",
        "response.code_interpreter_call.interpreting",
        "response.code_interpreter_call.completed", "response.output_item.done",
        "response.mcp_call.failed", "response.output_item.done",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done",
        "response.completed",
    ]  # fmt: skip
    assert [e.output_index for e in seen if e.type == "response.output_item.added"] == [0, 1, 2]
    final = seen[-1].response
    assert [o.type for o in final.output] == ["code_interpreter_call", "mcp_call", "message"]
    assert final.output[0].code == "print(1)" and final.output[0].outputs[0].logs == "1\n"
    assert final.output[1].error.type == "mcp_tool_execution_error"
    assert response["status"] == "completed" and final.output_text == "one"
