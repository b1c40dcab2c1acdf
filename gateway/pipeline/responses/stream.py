"""Chat completion chunks, as the relay sends them, re-told as Responses stream events.

The order is the one the ``openai`` SDK's ``responses.stream`` accumulates::

    response.created, response.in_progress,
    (message)  output_item.added, content_part.added, output_text.delta..., output_text.done,
               content_part.done, output_item.done
    (call)     output_item.added, function_call_arguments.delta..., .done, output_item.done
    response.completed | response.incomplete | response.failed

each with a ``sequence_number`` counting from 0. The message item is closed when the first
tool call starts (its text is final then); calls are closed at the end, in order. An error
event from the relay (the tier failed mid-stream) makes the response ``failed``.

A response of several model steps (the hosted loop) is one stream: each step is fed, then
closed (``close_step``); a call of a hosted tool is told as its own item::

    (code_interpreter)  output_item.added, code_interpreter_call.in_progress, ...step ends...
                        code_interpreter_call_code.delta, code_interpreter_call_code.done,
                        code_interpreter_call.interpreting, ...it runs...,
                        code_interpreter_call.completed, output_item.done
    (other sandbox)     output_item.added (mcp_call), mcp_call.in_progress,
                        mcp_call_arguments.delta..., mcp_call_arguments.done,
                        ...it runs..., mcp_call.completed | .failed, output_item.done

then the next step's events; sequence numbers and output indexes go on across steps, and
one ``response.completed`` / ``.incomplete`` / ``.failed`` ends it (``end``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.pipeline.responses import hosted, mcp_tools
from gateway.pipeline.responses.items import new_id
from gateway.pipeline.responses.loop import StepAnswer
from gateway.pipeline.responses.output import Frame, status_of, usage
from gateway.upstream.sse import DONE


@dataclass(slots=True)
class _Call:
    index: int  # output index
    item: dict[str, Any]
    hosted: bool = False
    arguments: str = ""  # a hosted call's arguments, as they come


@dataclass(slots=True)
class StreamTranslator:
    frame: Frame
    kinds: dict[str, str] = field(default_factory=dict)  # hosted tools: kind by function name
    container: str = ""  # the hosted calls' container_id (the chain's session)
    seq: int = 0
    output: list[dict[str, Any]] = field(default_factory=list)
    step_start: int = 0  # output index of this step's first item
    text: int | None = None  # output index of the open message item
    calls: dict[int, _Call] = field(default_factory=dict)  # by the chat tool-call index
    finish_reason: str | None = None
    model: str | None = None
    usage: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    ended: bool = False  # [DONE] or an error event arrived

    def event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"

    def start(self) -> bytes:
        """The stream's first events; items already in ``output`` (the MCP listings and
        approved calls that precede the first step) are told whole."""
        r = self.frame.response("in_progress", [])
        out = self.event("response.created", response=r) + self.event(
            "response.in_progress", response=r
        )
        for index, item in enumerate(self.output):
            out += self.event("response.output_item.added", output_index=index, item=item)
            where = {"item_id": item["id"], "output_index": index}
            if item["type"] == "mcp_list_tools":
                out += self.event("response.mcp_list_tools.completed", **where)
            elif item["type"] == "mcp_call":
                end = "completed" if item["status"] == "completed" else "failed"
                out += self.event(f"response.mcp_call.{end}", **where)
            out += self.event("response.output_item.done", output_index=index, item=item)
        self.step_start = len(self.output)
        return out

    def feed(self, raw: bytes) -> bytes:
        """One chat SSE event (``data: {...}\\n\\n``) in, the Responses events it makes out."""
        if raw == DONE:
            self.ended = True
            return b""
        if not raw.startswith(b"data: "):
            return b""  # comments, keep-alives
        try:
            chunk = orjson.loads(raw[6:])
        except orjson.JSONDecodeError:
            return b""
        if not isinstance(chunk, dict):
            return b""
        if isinstance(chunk.get("error"), dict):
            self.error, self.ended = chunk["error"], True
            return b""
        if isinstance(chunk.get("model"), str):
            self.model = chunk["model"]
        if chunk.get("usage"):
            self.usage = usage(chunk["usage"])
        out = b""
        for choice in chunk.get("choices") or ():
            if isinstance(choice, dict) and choice.get("index", 0) == 0:
                out += self._choice(choice)
        return out

    def _choice(self, choice: dict[str, Any]) -> bytes:
        if choice.get("finish_reason"):
            self.finish_reason = choice["finish_reason"]
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return b""
        out = b""
        text = delta.get("content")
        if isinstance(text, str) and text:
            out += self._text(text)
        for call in delta.get("tool_calls") or ():
            if isinstance(call, dict):
                out += self._call(call)
        return out

    def _text(self, text: str) -> bytes:
        out = self._open_text() if self.text is None else b""
        assert self.text is not None
        item = self.output[self.text]
        item["content"][0]["text"] += text
        return out + self.event(
            "response.output_text.delta", item_id=item["id"], output_index=self.text,
            content_index=0, delta=text, logprobs=[],
        )  # fmt: skip

    def _open_text(self) -> bytes:
        item = _message(new_id("msg"))
        self.text = len(self.output)
        self.output.append(item)
        added = {**item, "content": []}
        return self.event(
            "response.output_item.added", output_index=self.text, item=added
        ) + self.event(
            "response.content_part.added", item_id=item["id"], output_index=self.text,
            content_index=0, part=_part(""),
        )  # fmt: skip

    def _call(self, delta: dict[str, Any]) -> bytes:
        out = b""
        index = delta.get("index", 0)
        fn: dict[str, Any] = delta.get("function") or {}
        if not isinstance(fn, dict):
            fn = {}
        call = self.calls.get(index)
        if call is None:
            out += self._close_text()
            call = self.calls[index] = self._new_call(delta.get("id"), fn.get("name") or "")
            self.output.append(call.item)
            out += self.event("response.output_item.added", output_index=call.index, item=call.item)
            if call.hosted:
                kind = "code_interpreter_call" if _is_code(call.item) else "mcp_call"
                out += self.event(f"response.{kind}.in_progress", **_where(call))
        elif fn.get("name") and not call.hosted:
            call.item["name"] += fn["name"]
        args = fn.get("arguments")
        if isinstance(args, str) and args:
            out += self._arguments(call, args)
        return out

    def _new_call(self, call_id: str | None, name: str) -> _Call:
        call_id = call_id or new_id("call")
        kind = self.kinds.get(name)
        if kind is not None and _waits(kind):  # not run: it waits for approval
            return _Call(len(self.output), hosted.new_item(kind, name, call_id, self.container))
        if kind is not None:  # a hosted tool: the gateway runs it
            return _Call(
                len(self.output), hosted.new_item(kind, name, call_id, self.container), True
            )
        item = {
            "id": new_id("fc"), "type": "function_call", "status": "in_progress",
            "call_id": call_id, "name": name, "arguments": "",
        }  # fmt: skip
        return _Call(len(self.output), item)

    def _arguments(self, call: _Call, args: str) -> bytes:
        if call.item["type"] == "mcp_approval_request":  # told whole when the step ends
            call.item["arguments"] += args
            return b""
        if not call.hosted:
            call.item["arguments"] += args
            kind = "function_call_arguments"
        else:
            call.arguments += args
            if _is_code(call.item):
                return b""  # the code is told whole when the step ends
            kind = "mcp_call_arguments"
        return self.event(f"response.{kind}.delta", **_where(call), delta=args)

    def _close_text(self, status: str = "completed") -> bytes:
        if self.text is None:
            return b""
        index, item = self.text, self.output[self.text]
        self.text = None
        item["status"] = status
        text = item["content"][0]["text"]
        common = {"item_id": item["id"], "output_index": index, "content_index": 0}
        return (
            self.event("response.output_text.done", **common, text=text, logprobs=[])
            + self.event("response.content_part.done", **common, part=_part(text))
            + self.event("response.output_item.done", output_index=index, item=item)
        )

    def close_step(self) -> tuple[bytes, StepAnswer]:
        """Close this step's items (a hosted call's item stays open until it has run) and
        start the next step."""
        failed = self.error is not None or not self.ended
        cut = status_of(self.finish_reason)[1] is not None
        item_status = "incomplete" if failed or cut else "completed"
        out = b""
        if len(self.output) == self.step_start and not failed:  # an empty answer: a message
            out += self._open_text()
        out += self._close_text(item_status)
        arguments: dict[str, str] = {}
        for call in self.calls.values():
            out += self._close_call(call, item_status)
            if call.hosted:
                arguments[call.item["id"]] = call.arguments
        error = None
        if failed:
            message = (self.error or {}).get("message") or "the stream ended before its end"
            error = {"code": "server_error", "message": str(message)}
        answer = StepAnswer(
            self.output[self.step_start :], self.finish_reason, self.usage, self.model,
            arguments, error,
        )  # fmt: skip
        self.step_start, self.text, self.calls = len(self.output), None, {}
        self.finish_reason = self.usage = self.error = None
        self.ended = False
        return out, answer

    def _close_call(self, call: _Call, status: str) -> bytes:
        where = _where(call)
        if call.item["type"] == "mcp_approval_request":
            return self.event("response.output_item.done", output_index=call.index, item=call.item)
        if not call.hosted:
            call.item["status"] = status
            return self.event(
                "response.function_call_arguments.done",
                **where,
                arguments=call.item["arguments"],
            ) + self.event("response.output_item.done", output_index=call.index, item=call.item)
        hosted.set_arguments(call.item, call.arguments)
        if not _is_code(call.item):
            return self.event(
                "response.mcp_call_arguments.done", **where, arguments=call.item["arguments"]
            )
        code = call.item["code"]
        out = self.event("response.code_interpreter_call_code.delta", **where, delta=code)
        return out + self.event("response.code_interpreter_call_code.done", **where, code=code)

    def running(self, items: list[dict[str, Any]]) -> bytes:
        """Hosted calls about to run."""
        return b"".join(
            self.event("response.code_interpreter_call.interpreting", **self._at(item))
            for item in items
            if item["type"] == "code_interpreter_call"
        )

    def settled(self, items: list[dict[str, Any]]) -> bytes:
        """Hosted calls that have run (or never will: ``incomplete``), their items closed."""
        out = b""
        for item in items:
            where = self._at(item)
            if item["status"] != "incomplete":
                if item["type"] == "code_interpreter_call":
                    out += self.event("response.code_interpreter_call.completed", **where)
                else:
                    end = "completed" if item["status"] == "completed" else "failed"
                    out += self.event(f"response.mcp_call.{end}", **where)
            out += self.event(
                "response.output_item.done", output_index=where["output_index"], item=item
            )
        return out

    def _at(self, item: dict[str, Any]) -> dict[str, Any]:
        index = next(i for i, o in enumerate(self.output) if o is item)
        return {"item_id": item["id"], "output_index": index}

    def end(
        self, status: str, *, usage: dict[str, Any] | None = None, model: str | None = None,
        error: dict[str, Any] | None = None, incomplete: dict[str, Any] | None = None,
    ) -> tuple[bytes, dict[str, Any]]:  # fmt: skip
        """The last event, and the final response object (to store)."""
        response = self.frame.response(
            status, self.output, model=model, usage=usage, error=error, incomplete=incomplete
        )
        return self.event(f"response.{status}", response=response), response

    def finish(self) -> tuple[bytes, dict[str, Any]]:
        """A one-step response's closing events and final response object."""
        out, answer = self.close_step()
        status, incomplete = status_of(answer.finish_reason)
        if answer.error is not None:
            status, incomplete = "failed", None
        end, response = self.end(
            status, usage=answer.usage, model=answer.model, error=answer.error,
            incomplete=incomplete,
        )  # fmt: skip
        return out + end, response


def _waits(kind: str) -> bool:
    server = mcp_tools.parse_kind(kind)
    return server is not None and server[1]


def _is_code(item: dict[str, Any]) -> bool:
    return bool(item["type"] == "code_interpreter_call")


def _where(call: _Call) -> dict[str, Any]:
    return {"item_id": call.item["id"], "output_index": call.index}


def _message(ident: str, status: str = "in_progress") -> dict[str, Any]:
    return {
        "id": ident, "type": "message", "role": "assistant", "status": status,
        "content": [_part("")],
    }  # fmt: skip


def _part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": []}
