"""Operations on a chat request's message list, without I/O: which messages may be
condensed, masking a tool output, where a span may end, and the condensed layout.

Messages are the client's dicts; nothing here changes them: every function returns new
lists, and a changed message is a new dict.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import orjson

Message = dict[str, Any]
HEAD_ROLES = ("system", "developer")
MASK_MIN_CHARS = 400  # shorter tool outputs cost less than the placeholder that would replace them
SUMMARY_PREFIX = "[Summary of earlier steps of this conversation, written by the gateway"


def text_of(message: Message) -> str:
    """A message's text: its string content, or its text parts joined."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text")) for p in content if isinstance(p, dict) and "text" in p)
    return ""


def head_end(messages: Sequence[Message]) -> int:
    """How many leading system (or developer) messages there are: never condensed."""
    i = 0
    while i < len(messages) and messages[i].get("role") in HEAD_ROLES:
        i += 1
    return i


def latest_user(messages: Sequence[Message]) -> int | None:
    """The index of the latest user message: never condensed."""
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].get("role") == "user":
            return i
    return None


def tool_results(messages: Sequence[Message]) -> list[int]:
    return [i for i, m in enumerate(messages) if m.get("role") == "tool"]


def call_names(messages: Sequence[Message]) -> dict[str, tuple[str, str]]:
    """Tool call id -> (function name, arguments), from the assistants' tool calls."""
    out: dict[str, tuple[str, str]] = {}
    for m in messages:
        for call in m.get("tool_calls") or ():
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict) and isinstance(call.get("id"), str):
                args = fn.get("arguments")
                out[call["id"]] = (str(fn.get("name")), args if isinstance(args, str) else "")
    return out


def placeholder(message: Message, calls: dict[str, tuple[str, str]]) -> str:
    """What replaces a masked tool output: what it was and how to see it again."""
    call_id = message.get("tool_call_id")
    name, args = calls.get(call_id, ("the tool", "")) if isinstance(call_id, str) else ("", "")
    shown = args if len(args) <= 160 else args[:157] + "..."
    what = f"{name}({shown})" if name else "this tool call"
    return (
        f"[output of {what} removed by the gateway to save context: {len(text_of(message))} "
        "characters. Call the tool again with the same arguments if you need it.]"
    )


def maskable(messages: Sequence[Message], keep_last: int) -> list[int]:
    """Tool outputs that masking may replace, oldest first: all but the latest
    ``keep_last``, and only those long enough that a placeholder is shorter."""
    results = tool_results(messages)
    old = results[: max(0, len(results) - keep_last)]
    return [i for i in old if len(text_of(messages[i])) >= MASK_MIN_CHARS]


def masked(messages: Sequence[Message], indexes: Sequence[int]) -> list[Message]:
    """``messages`` with the tool outputs at ``indexes`` replaced by placeholders; the
    tool calls and their ids stay, so the conversation is still well formed."""
    if not indexes:
        return list(messages)
    calls = call_names(messages)
    out = list(messages)
    for i in indexes:
        out[i] = {**messages[i], "content": placeholder(messages[i], calls)}
    return out


def clipped(message: Message, keep_chars: int) -> Message:
    """A tool output cut to its first and last ``keep_chars // 2`` characters."""
    text = text_of(message)
    half = max(1, keep_chars // 2)
    cut = len(text) - 2 * half
    note = f"\n[... {cut} characters cut by the gateway to fit the context budget ...]\n"
    return {**message, "content": text[:half] + note + text[-half:]}


def cuts(messages: Sequence[Message], start: int, keep_recent: int) -> list[int]:
    """Where a summarized span ``messages[start:c]`` may end, nearest first: before a
    message that is not a tool result (a call stays with its results), leaving at least
    ``keep_recent`` messages after it."""
    last = len(messages) - keep_recent
    return [c for c in range(start + 1, last + 1) if messages[c].get("role") != "tool"]


def span_key(span: Sequence[Message]) -> str:
    """A hash of the messages a summary covers: the summary is reused only for them."""
    try:
        data = orjson.dumps(list(span), option=orjson.OPT_SORT_KEYS)
    except (TypeError, orjson.JSONEncodeError):
        data = repr(list(span)).encode()
    return hashlib.sha256(data).hexdigest()


def summary_message(text: str, covered: int) -> Message:
    return {
        "role": "user",
        "content": f"{SUMMARY_PREFIX} from {covered} messages it removed; what is marked DONE "
        f"was done already: do not do it again.]\n{text}",
    }


def layout(
    messages: Sequence[Message], head: int, cut: int, summary: Message | None
) -> list[Message]:
    """The condensed conversation: the system messages, then (when the latest user
    message lay in the span) that message, then the summary (None: the span is dropped),
    then ``messages[cut:]``."""
    user = latest_user(messages)
    lifted = [messages[user]] if user is not None and head <= user < cut else []
    middle = [summary] if summary is not None else []
    return [*messages[:head], *lifted, *middle, *messages[cut:]]


def spanned(messages: Sequence[Message], start: int, cut: int) -> list[Message]:
    """The messages a summary of ``messages[start:cut]`` reads: the latest user message
    is never summarized (it stays, verbatim)."""
    user = latest_user(messages)
    return [m for i, m in enumerate(messages[start:cut], start) if i != user]
