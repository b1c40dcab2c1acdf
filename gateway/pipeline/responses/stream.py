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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.pipeline.responses.items import new_id
from gateway.pipeline.responses.output import Frame, status_of, usage
from gateway.upstream.sse import DONE


@dataclass(slots=True)
class _Call:
    index: int  # output index
    item: dict[str, Any]
    done: bool = False


@dataclass(slots=True)
class StreamTranslator:
    frame: Frame
    seq: int = 0
    output: list[dict[str, Any]] = field(default_factory=list)
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
        r = self.frame.response("in_progress", [])
        return self.event("response.created", response=r) + self.event(
            "response.in_progress", response=r
        )

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
            item = {
                "id": new_id("fc"), "type": "function_call", "status": "in_progress",
                "call_id": delta.get("id") or new_id("call"), "name": fn.get("name") or "",
                "arguments": "",
            }  # fmt: skip
            call = self.calls[index] = _Call(len(self.output), item)
            self.output.append(item)
            out += self.event("response.output_item.added", output_index=call.index, item=item)
        elif fn.get("name"):
            call.item["name"] += fn["name"]
        args = fn.get("arguments")
        if isinstance(args, str) and args:
            call.item["arguments"] += args
            out += self.event(
                "response.function_call_arguments.delta", item_id=call.item["id"],
                output_index=call.index, delta=args,
            )  # fmt: skip
        return out

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

    def finish(self) -> tuple[bytes, dict[str, Any]]:
        """The closing events, and the final response object (to store)."""
        status, incomplete = status_of(self.finish_reason)
        error = None
        if self.error is not None or not self.ended:
            status, incomplete = "failed", None
            message = (self.error or {}).get("message") or "the stream ended before its end"
            error = {"code": "server_error", "message": str(message)}
        item_status = "completed" if status == "completed" else "incomplete"
        out = b""
        if not self.output and status != "failed":  # an empty answer is still a message
            out += self._open_text()
        out += self._close_text(item_status)
        for call in self.calls.values():
            call.item["status"] = item_status
            out += self.event(
                "response.function_call_arguments.done", item_id=call.item["id"],
                output_index=call.index, arguments=call.item["arguments"],
            )  # fmt: skip
            out += self.event("response.output_item.done", output_index=call.index, item=call.item)
        response = self.frame.response(
            status, self.output, model=self.model, usage=self.usage, error=error,
            incomplete=incomplete,
        )  # fmt: skip
        return out + self.event(f"response.{status}", response=response), response


def _message(ident: str, status: str = "in_progress") -> dict[str, Any]:
    return {
        "id": ident, "type": "message", "role": "assistant", "status": status,
        "content": [_part("")],
    }  # fmt: skip


def _part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": []}
