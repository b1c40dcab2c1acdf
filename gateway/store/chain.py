"""Hashes that link the steps of a session when the client names none.

An agent resends its whole history at every step. A step's *continuation* hash
covers its request's messages plus the answer it got; the next step's *prefix*
hash covers its messages up to and including the last assistant message. When
they are equal the second step continues the first. Two samples of one prompt
get different answers, hence different continuations, and stay apart.

Messages are reduced to what identifies them (role, text, tool calls, tool call
id) because SDKs re-serialize the assistant message they got back (``refusal:
null``, reordered keys, re-dumped JSON arguments).
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        texts = (p.get("text") for p in content if isinstance(p, dict))
        return "".join(t for t in texts if isinstance(t, str))
    return ""


def canonical_args(arguments: Any) -> str:
    if isinstance(arguments, str):
        try:
            return orjson.dumps(orjson.loads(arguments), option=orjson.OPT_SORT_KEYS).decode()
        except orjson.JSONDecodeError:
            return arguments
    return orjson.dumps(arguments, option=orjson.OPT_SORT_KEYS).decode()


def _canonical(message: Any) -> list[Any]:
    if not isinstance(message, dict):
        return ["?", str(message)]
    calls = [
        [
            (tc.get("function") or {}).get("name"),
            canonical_args((tc.get("function") or {}).get("arguments")),
        ]
        for tc in message.get("tool_calls") or ()
        if isinstance(tc, dict)
    ]
    return [message.get("role"), _text(message.get("content")), calls, message.get("tool_call_id")]


def _digest(canonical: list[list[Any]]) -> str:
    return hashlib.sha256(orjson.dumps(canonical)).hexdigest()


def history_hash(messages: list[Any]) -> str:
    return _digest([_canonical(m) for m in messages])


class History:
    """A request's messages reduced once, for its prefix hash and the continuation hash of
    each of its answers (a request with ``n`` samples has ``n``)."""

    __slots__ = ("_canonical", "_last_assistant", "_prefix")

    def __init__(self, messages: list[Any]) -> None:
        self._canonical = [_canonical(m) for m in messages]
        self._last_assistant = max(
            (i for i, c in enumerate(self._canonical) if c[0] == "assistant"), default=None
        )
        self._prefix: str | None = None

    def prefix(self) -> str | None:
        """Hash of the history up to the last assistant message; None when there is none."""
        last = self._last_assistant
        if last is not None and self._prefix is None:
            self._prefix = _digest(self._canonical[: last + 1])
        return self._prefix

    def continuation(self, answer: dict[str, Any] | None) -> str | None:
        """Hash of the history followed by ``answer``: the next step's prefix hash."""
        if answer is None:
            return None
        return _digest([*self._canonical, _canonical({"role": "assistant", **answer})])


def prefix_hash(messages: Any) -> str | None:
    """Hash of the history up to the last assistant message; None when there is none."""
    return History(messages).prefix() if isinstance(messages, list) else None


def continuation_hash(messages: Any, answer: dict[str, Any] | None) -> str | None:
    if not isinstance(messages, list):
        return None
    return History(messages).continuation(answer)
