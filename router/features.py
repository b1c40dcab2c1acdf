"""Cheap request features computed on the request path.

Token counts here are estimates (characters / 4, the usual rule of thumb for
English BPE vocabularies); they cost a pass over the message strings and no
tokenizer call, which keeps a decision in microseconds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

CHARS_PER_TOKEN = 4


def _content_chars(content: object) -> int:
    if isinstance(content, str):
        return len(content)
    if isinstance(content, Sequence):
        total = 0
        for part in content:
            if isinstance(part, Mapping):
                text = part.get("text")
                if isinstance(text, str):
                    total += len(text)
        return total
    return 0


def prompt_chars(body: Mapping[str, Any]) -> int:
    """Characters of prompt text in a chat (``messages``) or completions (``prompt``) body."""
    messages = body.get("messages")
    if isinstance(messages, Sequence):
        total = 0
        for message in messages:
            if isinstance(message, Mapping):
                total += _content_chars(message.get("content"))
        return total
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return len(prompt)
    if isinstance(prompt, Sequence):
        return sum(len(p) if isinstance(p, str) else CHARS_PER_TOKEN for p in prompt)
    return 0


def estimate_prompt_tokens(body: Mapping[str, Any]) -> int:
    return prompt_chars(body) // CHARS_PER_TOKEN
