"""Structural features of one agent step, from the request alone (no tokenizer, no I/O).

What the router needs beyond prompt length: where the step sits in a tool loop, whether
the last tool call failed, whether the step is about code or math (which pruned models
lose first, REFERENCES.md), what the client asked for (structured output, a token budget,
a reasoning effort). Every value is a float so a policy, a classifier or a log can use the
same mapping; ``Decision.features`` carries them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from router.features import estimate_prompt_tokens

CODE = re.compile(
    r"```|\bdef \w+\(|\bclass \w+[:(]|\bimport \w+|#include\b|\bfunction\s*\(|=>|\bSELECT\b.+\bFROM\b",
    re.S,
)
MATH = re.compile(
    r"\\(frac|int|sum|sqrt)|\$[^$]+\$|\b(prove|integral|derivative|equation|theorem)\b|\d\s*[-+*/^]\s*\d",
    re.I,
)
TOOL_ERROR = re.compile(r"^\s*(error|traceback|exception|permission denied)|\"error\"\s*:", re.I)
EFFORT = {"minimal": 0.0, "low": 0.0, "medium": 1.0, "high": 2.0}


def _text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return " ".join(p.get("text") or "" for p in content if isinstance(p, Mapping))
    return ""


def step_features(body: Mapping[str, Any]) -> dict[str, float]:
    messages = body.get("messages")
    msgs = [m for m in messages if isinstance(m, Mapping)] if isinstance(messages, Sequence) else []
    last_user = max((i for i, m in enumerate(msgs) if m.get("role") == "user"), default=-1)
    tail = msgs[last_user + 1 :]
    tool_msgs = [m for m in tail if m.get("role") == "tool"]
    user_text = (
        _text(msgs[last_user].get("content")) if last_user >= 0 else str(body.get("prompt") or "")
    )
    fmt = body.get("response_format")
    choice = body.get("tool_choice")
    limit = body.get("max_completion_tokens") or body.get("max_tokens")
    return {
        "prompt_tokens": float(estimate_prompt_tokens(body)),
        "messages": float(len(msgs)),
        "user_turns": float(sum(1 for m in msgs if m.get("role") == "user")),
        "tools_offered": float(len(body.get("tools") or ())),
        "tool_loop_depth": float(sum(1 for m in tail if m.get("role") == "assistant" and m.get("tool_calls"))),
        "last_tool_error": float(bool(tool_msgs) and bool(TOOL_ERROR.search(_text(tool_msgs[-1].get("content"))))),
        "code": float(bool(CODE.search(user_text))),
        "math": float(bool(MATH.search(user_text))),
        "structured_output": float(isinstance(fmt, Mapping) and fmt.get("type") in ("json_schema", "json_object")),
        "forced_tool": float(choice == "required" or isinstance(choice, Mapping)),
        "max_tokens": float(limit) if isinstance(limit, int) else 0.0,
        "reasoning_effort": EFFORT.get(str(body.get("reasoning_effort")), 0.0),
    }  # fmt: skip
