"""Escalation before commit: a fast-tier answer that fails validation is re-run on the full
tier before anything reaches the client.

Checked for routed (``model: "auto"``), non-streamed answers of the fast tier: every tool
call must name an offered tool and carry arguments that parse and match its JSON schema; a
forced tool choice must produce a tool call; and the answer must not be cut by the token
limit unless the client set that limit itself. Streamed answers are not checked (their
first bytes are already the client's).
"""

from __future__ import annotations

from typing import Any

from sandbox.toolschema import check_call, tool_schemas


def problem(body: dict[str, Any], data: Any) -> tuple[str, str] | None:
    """(kind, why) when the answer should not reach the client, else None."""
    if not isinstance(data, dict):
        return None
    schemas = tool_schemas(body.get("tools"))
    choice = body.get("tool_choice")
    forced = choice == "required" or isinstance(choice, dict)
    client_limit = (
        body.get("max_tokens") is not None or body.get("max_completion_tokens") is not None
    )
    choices = data.get("choices")
    for c in choices if isinstance(choices, list) else ():
        if not isinstance(c, dict):
            continue
        message = c.get("message") or {}
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        calls = calls if isinstance(calls, list) else []
        if c.get("finish_reason") == "length" and not client_limit:
            return "truncated", "the answer was cut by the token limit"
        if forced and not calls:
            return "no_tool_call", "a tool call was required and none came"
        for call in calls:
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict):
                return "invalid_tool_call", "a tool call has no function object"
            why = check_call(str(fn.get("name") or ""), str(fn.get("arguments") or ""), schemas)
            if why is not None and schemas:
                return "invalid_tool_call", why
    return None
