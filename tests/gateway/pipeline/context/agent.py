"""Agent conversations of chosen sizes, for the context tests."""

from __future__ import annotations

import json
from typing import Any

SYSTEM = {"role": "system", "content": "You are a coding agent. Use the tools."}
TASK = {"role": "user", "content": "Find why tests/test_orders.py fails and fix it."}


def output(i: int, chars: int) -> str:
    """A tool output with a value worth remembering on its first line."""
    head = f"step {i}: wrote src/module_{i}.py, checksum {1000 + i}\n"
    return head + ("lorem ipsum dolor sit amet " * (chars // 27 + 1))[: max(0, chars - len(head))]


def step(i: int, chars: int) -> list[dict[str, Any]]:
    """One tool-loop step: the assistant's call, then its result."""
    call = {
        "id": f"call_{i}",
        "type": "function",
        "function": {"name": "run_shell", "arguments": json.dumps({"cmd": f"cat part_{i}.txt"})},
    }
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": f"call_{i}", "content": output(i, chars)},
    ]


def session(steps: int, chars: int = 2000, system: bool = True) -> list[dict[str, Any]]:
    msgs = [SYSTEM] if system else []
    msgs.append(TASK)
    for i in range(steps):
        msgs += step(i, chars)
    return msgs


def chat(turns: int, chars: int = 1500) -> list[dict[str, Any]]:
    """A conversation without tools: user and assistant turns of ``chars`` characters."""
    msgs: list[dict[str, Any]] = [SYSTEM]
    for i in range(turns):
        msgs.append(
            {"role": "user", "content": f"Question {i}: order {4000 + i}? " + "x " * (chars // 2)}
        )
        msgs.append(
            {
                "role": "assistant",
                "content": f"Order {4000 + i} shipped to Oslo. " + "y " * (chars // 2),
            }
        )
    msgs.append({"role": "user", "content": "Which orders did we discuss?"})
    return msgs
