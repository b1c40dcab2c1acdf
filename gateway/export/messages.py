"""Message-level exports: OpenAI SFT JSONL, TRL conversational SFT, TRL stepwise supervision.

Each run of a session (``Trajectory.runs``) becomes one conversation: its last
request plus the last answer. A session whose history was rewritten (summarized,
truncated) is cut there, the new run starting from the context the model saw; a
call that sampled several answers, and a context summary's model call, is a
conversation of its own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import orjson

from gateway.export.load import Step, Trajectory, assistant_message


def conversations(t: Trajectory) -> Iterator[tuple[list[dict[str, Any]], list[Step], int]]:
    """(messages, steps that produced its assistant turns, index of the first generated turn)."""
    for run in t.runs():
        last = run[-1]
        yield [*last.messages, assistant_message(last)], run, len(run[0].messages)


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
    """TRL's stepwise supervision: one prompt, the answers step by step, a label per step
    (a row per run of the session)."""
    for run in t.runs():
        prompt = "\n".join(
            str(m.get("content") or "")
            for m in run[0].messages
            if m.get("role") in ("system", "user")
        )
        yield {
            "prompt": prompt,
            "completions": [_as_text(assistant_message(s)) for s in run],
            "labels": [s.reward >= 0 for s in run],
            "gearshift": _provenance(t, run),
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
