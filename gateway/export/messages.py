"""Message-level exports: OpenAI SFT JSONL, TRL conversational SFT, TRL stepwise supervision.

A linear session becomes one conversation (its last request plus the last
answer); a session whose history was rewritten (summarized, truncated) or that
sampled several answers per call is written step by step, never concatenated.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import orjson

from gateway.export.load import Step, Trajectory, assistant_message


def conversations(t: Trajectory) -> Iterator[tuple[list[dict[str, Any]], list[Step], int]]:
    """(messages, steps that produced its assistant turns, index of the first generated turn)."""
    if t.linear:
        last = t.steps[-1]
        yield [*last.messages, assistant_message(last)], t.steps, len(t.steps[0].messages)
        return
    for s in t.steps:
        yield [*s.messages, assistant_message(s)], [s], len(s.messages)


def _tools(step: Step) -> list[dict[str, Any]]:
    tools = step.request.get("tools")
    return list(tools) if isinstance(tools, list) else []


def openai_sft(t: Trajectory) -> Iterator[dict[str, Any]]:
    for messages, steps, first in conversations(t):
        out = []
        for i, m in enumerate(messages):
            m = dict(m)
            if m.get("role") == "assistant":
                m["weight"] = 1 if i >= first else 0  # train on what this session generated
            out.append(m)
        row: dict[str, Any] = {"messages": out}
        if tools := _tools(steps[-1]):
            row["tools"] = tools
        yield row


def _hf_message(m: dict[str, Any]) -> dict[str, Any]:
    """Hugging Face chat templates want tool-call arguments as objects, not JSON strings."""
    if not m.get("tool_calls"):
        return m
    calls = []
    for tc in m["tool_calls"]:
        fn = dict(tc.get("function") or {})
        if isinstance(fn.get("arguments"), str):
            # A broken call stays as the model wrote it: the trainer should see it.
            with contextlib.suppress(orjson.JSONDecodeError):
                fn["arguments"] = orjson.loads(fn["arguments"])
        calls.append({"type": "function", "function": fn})
    return {**m, "tool_calls": calls}


def trl_sft(t: Trajectory) -> Iterator[dict[str, Any]]:
    for messages, steps, _ in conversations(t):
        yield {
            "messages": [_hf_message(m) for m in messages],
            "tools": _tools(steps[-1]),
            "gearshift": _provenance(t, steps),
        }


def trl_stepwise(t: Trajectory) -> Iterator[dict[str, Any]]:
    """TRL's stepwise supervision: one prompt, the answers step by step, a label per step."""
    first = t.steps[0]
    prompt = "\n".join(
        str(m.get("content") or "") for m in first.messages if m.get("role") in ("system", "user")
    )
    yield {
        "prompt": prompt,
        "completions": [_as_text(assistant_message(s)) for s in t.steps],
        "labels": [s.reward >= 0 for s in t.steps],
        "gearshift": _provenance(t, t.steps),
    }


def _as_text(m: dict[str, Any]) -> str:
    if m.get("tool_calls"):
        return orjson.dumps([tc["function"] for tc in m["tool_calls"]]).decode()
    return str(m.get("content") or "")


def _provenance(t: Trajectory, steps: list[Step]) -> dict[str, Any]:
    """Which tier and model produced each generated turn: what off-policy corrections need."""
    return {
        "session_id": t.session["id"],
        "group": t.group,
        "reward": t.reward,
        "steps": [
            {
                "id": s.id,
                "tier": s.tier,
                "model": s.model,
                "propensity": s.propensity,
                "reward": s.reward,
            }
            for s in steps
        ],
    }
