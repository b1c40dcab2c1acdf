"""A chat answer as Responses output: output items, status, usage, the response object.

The assistant message becomes a ``message`` item (its text as one ``output_text`` part)
when it has text or no tool calls, followed by one ``function_call`` item per tool call,
in order. ``finish_reason: length`` makes the response ``incomplete``
(``max_output_tokens``), as ``content_filter`` does (``content_filter``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from gateway.pipeline.responses.chat import Echo
from gateway.pipeline.responses.items import new_id
from gateway.pipeline.responses.protocol import ResponsesRequest

INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}


def message_item(text: str, status: str = "completed", ident: str | None = None) -> dict[str, Any]:
    return {
        "id": ident or new_id("msg"), "type": "message", "role": "assistant", "status": status,
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }  # fmt: skip


def call_item(
    call_id: str | None, name: str, arguments: str, ident: str | None = None
) -> dict[str, Any]:
    return {
        "id": ident or new_id("fc"), "type": "function_call", "status": "completed",
        "call_id": call_id or new_id("call"), "name": name, "arguments": arguments,
    }  # fmt: skip


def answer_items(message: dict[str, Any], finish_reason: str | None) -> list[dict[str, Any]]:
    """The output items of one chat choice's assistant message."""
    content = message.get("content")
    if isinstance(content, list):  # content parts, as some servers answer
        content = "".join(p.get("text") or "" for p in content if isinstance(p, dict))
    calls = [c for c in message.get("tool_calls") or () if isinstance(c, dict)]
    items: list[dict[str, Any]] = []
    if (isinstance(content, str) and content) or not calls:
        status = "incomplete" if finish_reason in INCOMPLETE else "completed"
        items.append(message_item(content if isinstance(content, str) else "", status))
    for call in calls:
        fn = call.get("function") or {}
        items.append(
            call_item(call.get("id"), str(fn.get("name") or ""), str(fn.get("arguments") or ""))
        )
    return items


def status_of(finish_reason: str | None) -> tuple[str, dict[str, Any] | None]:
    reason = INCOMPLETE.get(finish_reason or "")
    return ("incomplete", {"reason": reason}) if reason else ("completed", None)


def usage(chat: Any) -> dict[str, Any] | None:
    """Chat usage (prompt/completion tokens) as Responses usage (input/output tokens)."""
    if not isinstance(chat, dict):
        return None
    prompt, completion = _int(chat.get("prompt_tokens")), _int(chat.get("completion_tokens"))
    details = chat.get("prompt_tokens_details")
    cached = _int(details.get("cached_tokens")) if isinstance(details, dict) else 0
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


@dataclass(frozen=True, slots=True)
class Frame:
    """Everything the response object says that is known before the model answers."""

    id: str
    request: ResponsesRequest
    spec: Echo
    stored: bool
    created_at: int

    @classmethod
    def new(cls, request: ResponsesRequest, spec: Echo, stored: bool) -> Frame:
        return cls(new_id("resp"), request, spec, stored, int(time.time()))

    def response(
        self,
        status: str,
        output: list[dict[str, Any]],
        *,
        model: str | None = None,
        usage: dict[str, Any] | None = None,
        error: dict[str, Any] | None = None,
        incomplete: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        r = self.request
        done = status in ("completed", "incomplete", "failed")
        return {
            "id": self.id, "object": "response", "created_at": self.created_at,
            "status": status, "completed_at": int(time.time()) if done else None,
            "background": r.background is True, "error": error, "incomplete_details": incomplete,
            "instructions": r.instructions, "max_output_tokens": r.max_output_tokens,
            "max_tool_calls": r.max_tool_calls, "model": model or r.model, "output": output,
            "parallel_tool_calls": r.parallel_tool_calls is not False,
            "previous_response_id": r.previous_response_id, "reasoning": None,
            "store": self.stored, "temperature": r.temperature, "text": self.spec.text,
            "tool_choice": self.spec.tool_choice, "tools": self.spec.tools, "top_p": r.top_p,
            "truncation": r.truncation or "disabled", "usage": usage, "user": r.user, "metadata": r.metadata or {},
        }  # fmt: skip
