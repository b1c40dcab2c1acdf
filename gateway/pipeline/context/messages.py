"""Operations on a chat request's message list, without I/O: which messages may be
condensed, clipping a tool output, where a span may end, and the condensed layout
(masking is in ``masking``).

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


def lifted(
    messages: Sequence[Message], head: int, cut: int, kept: Sequence[int]
) -> tuple[int, ...]:
    """The user messages of ``messages[head:cut]`` that stay verbatim: ``kept`` (those an
    earlier summary left out) and the latest user message when it lies in the span."""
    user = latest_user(messages)
    found = {i for i in kept if head <= i < cut}
    if user is not None and head <= user < cut:
        found.add(user)
    return tuple(sorted(found))


def layout(
    messages: Sequence[Message], head: int, cut: int, summary: Message | None, kept: Sequence[int]
) -> list[Message]:
    """The condensed conversation: the system messages, then the span's user messages
    that stay verbatim (``kept``, ``lifted``), then the summary (None: the span is
    dropped), then ``messages[cut:]``. A message kept once keeps its place at later steps,
    so the prefix does not change when a newer user message arrives."""
    middle = [summary] if summary is not None else []
    return [*messages[:head], *(messages[i] for i in kept), *middle, *messages[cut:]]


def spanned(
    messages: Sequence[Message], start: int, cut: int, kept: Sequence[int]
) -> list[Message]:
    """The messages a summary of ``messages[start:cut]`` reads: those kept verbatim
    (``lifted``: the latest user message among them) are never summarized."""
    return [m for i, m in enumerate(messages[start:cut], start) if i not in kept]
