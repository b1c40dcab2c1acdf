"""Masking a tool output: its placeholder says what was removed, how to get it back,
and carries a short extractive digest of it (errors, named values, paths, identifiers),
so that a masked output keeps the facts an agent asks about later.

A placeholder is a function of the message alone: the same output is masked the same way
on every step, so consecutive steps share their prefix (the engine's prefix cache).
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.pipeline.context.extractive import (
    FACT_KINDS,
    IDENT,
    KEY_VALUE,
    PATH,
    around,
    is_error,
    lines_of,
    spread,
)
from gateway.pipeline.context.messages import Message, text_of, tool_results

MASK_MIN_CHARS = 400  # shorter tool outputs cost less than the placeholder that would replace them
DIGEST_SHARE = 4  # a digest takes at most this fraction (1/4) of the output it stands for
DIGEST_LINE_CHARS = 120  # one kept line at most


def call_names(messages: Sequence[Message]) -> dict[str, str]:
    """Tool call id -> function name, from the assistants' tool calls."""
    out: dict[str, str] = {}
    for m in messages:
        for call in m.get("tool_calls") or ():
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict) and isinstance(call.get("id"), str):
                out[call["id"]] = str(fn.get("name"))
    return out


def digest(text: str, max_chars: int) -> list[str]:
    """The lines of ``text`` worth keeping, at most ``max_chars`` in all, in their order:
    errors and named values (``port = 8080``) first, then lines with a path or an
    identifier; when a kind does not all fit, its lines are spread evenly over the
    output, the first and the last included."""
    kinds: tuple[list[tuple[int, str]], list[tuple[int, str]]] = ([], [])
    seen: set[str] = set()
    for n, line in enumerate(lines_of(text)):
        if is_error(line) or KEY_VALUE.search(line):
            kind = kinds[0]
        elif PATH.search(line) or IDENT.search(line):
            kind = kinds[1]
        else:
            continue
        kept = around(line, *FACT_KINDS)[:DIGEST_LINE_CHARS]
        if kept not in seen:
            seen.add(kept)
            kind.append((n, kept))
    chosen: list[tuple[int, str]] = []
    room = max_chars
    for kind in kinds:
        low, high = 0, len(kind)  # the most lines that fit, spread evenly
        while low < high:
            mid = (low + high + 1) // 2
            if sum(len(ln) + 1 for _, ln in spread(kind, mid)) <= room:
                low = mid
            else:
                high = mid - 1
        picked = spread(kind, low) if low else []
        chosen += picked
        room -= sum(len(ln) + 1 for _, ln in picked)
    return [ln for _, ln in sorted(chosen)]


def placeholder(message: Message, calls: dict[str, str], digest_chars: int) -> str:
    """What replaces a masked tool output: what it was, how to see it again (the call,
    with its arguments, is right before it), and its digest (at most ``digest_chars``,
    and a quarter of the output)."""
    call_id = message.get("tool_call_id")
    name = calls.get(call_id, "tool") if isinstance(call_id, str) else "tool"
    text = text_of(message)
    kept = digest(text, min(digest_chars, len(text) // DIGEST_SHARE)) if digest_chars else []
    removed = f"[{name} output removed by the gateway to save context ({len(text)} characters)"
    if not kept:
        return f"{removed}; call the tool again to see it.]"
    return f"{removed}; call the tool again for all of it. Kept lines:]\n" + "\n".join(kept)


def maskable(messages: Sequence[Message], keep_last: int) -> list[int]:
    """Tool outputs that masking may replace, oldest first: all but the latest
    ``keep_last``, and only those long enough that a placeholder is shorter."""
    results = tool_results(messages)
    old = results[: max(0, len(results) - keep_last)]
    return [i for i in old if len(text_of(messages[i])) >= MASK_MIN_CHARS]


def masked(message: Message, calls: dict[str, str], digest_chars: int) -> Message:
    """``message`` (a tool output) with its placeholder for content; its tool call id
    stays, so the conversation is still well formed."""
    return {**message, "content": placeholder(message, calls, digest_chars)}
