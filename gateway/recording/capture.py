"""Ask the engine for exact tokens and behaviour log-probabilities; give clients what they asked.

``prepare`` adds ``return_token_ids`` and ``logprobs`` to the upstream body and
remembers what the client itself requested. ``strip`` removes from an answer
what the client did not ask for, so recording never changes what a client sees.
``StreamCapture`` does both for a stream, chunk by chunk: one chunk may carry
several tokens (speculative decoding), several choices, and tool-call deltas that
must be assembled by ``index``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from gateway.recording.records import ChoiceCapture


@dataclass(frozen=True, slots=True)
class Wants:
    """What the client asked to see of the capture fields."""

    logprobs: bool
    token_ids: bool


def prepare(endpoint: str, body: dict[str, Any]) -> Wants:
    """Mutate ``body`` so that the engine returns token ids and per-token log-probabilities."""
    asked = body.get("logprobs")  # completions: an int (0 asks too); chat: a bool
    wants = Wants(
        logprobs=asked is not None if endpoint == "completions" else bool(asked),
        token_ids=bool(body.get("return_token_ids")),
    )
    body["return_token_ids"] = True
    if endpoint == "chat":
        body["logprobs"] = True
    elif body.get("logprobs") is None:
        body["logprobs"] = 0  # the sampled token's log-probability, no alternatives
    return wants


def strip(data: dict[str, Any], wants: Wants) -> None:
    """Remove from one response object (or stream chunk) what the client did not ask for."""
    if not wants.token_ids:
        data.pop("prompt_token_ids", None)
    for choice in data.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        if not wants.token_ids:
            choice.pop("token_ids", None)
            choice.pop("prompt_token_ids", None)
        if not wants.logprobs and "logprobs" in choice:
            choice["logprobs"] = None


def sampled_logprobs(logprobs: Any) -> list[float]:
    """The sampled tokens' log-probabilities from a chat or completions ``logprobs`` object."""
    if not isinstance(logprobs, dict):
        return []
    content = logprobs.get("content")
    if isinstance(content, list):  # chat
        return [float(e["logprob"]) for e in content if isinstance(e, dict)]
    values = logprobs.get("token_logprobs")  # completions
    if isinstance(values, list):
        return [float(v) if v is not None else 0.0 for v in values]
    return []


def choices_of(data: dict[str, Any], endpoint: str) -> list[ChoiceCapture]:
    """The captures of a whole (non-streamed) answer."""
    out = []
    for c in data.get("choices") or ():
        if not isinstance(c, dict):
            continue
        message = c.get("message") if endpoint == "chat" else {"text": c.get("text")}
        out.append(
            ChoiceCapture(
                index=int(c.get("index") or 0),
                message=message if isinstance(message, dict) else None,
                token_ids=c.get("token_ids"),
                logprobs=sampled_logprobs(c.get("logprobs")),
                finish_reason=c.get("finish_reason"),
            )
        )
    return out


class _Assembly:
    """One streamed choice being put back together."""

    __slots__ = ("content", "finish", "logprobs", "role", "token_ids", "tools")

    def __init__(self) -> None:
        self.role = "assistant"
        self.content: list[str] = []
        self.tools: dict[int, dict[str, Any]] = {}
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        self.finish: str | None = None

    def add_delta(self, delta: dict[str, Any]) -> None:
        if isinstance(delta.get("content"), str):
            self.content.append(delta["content"])
        for tc in delta.get("tool_calls") or ():
            slot = self.tools.setdefault(
                int(tc.get("index") or 0),
                {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
            )
            if tc.get("id"):
                slot["id"] = tc["id"]
            fn = tc.get("function") or {}
            if fn.get("name"):
                slot["function"]["name"] += fn["name"]
            if fn.get("arguments"):
                slot["function"]["arguments"] += fn["arguments"]

    def capture(self, index: int, endpoint: str) -> ChoiceCapture:
        text = "".join(self.content)
        if endpoint == "chat":
            message: dict[str, Any] = {"role": self.role, "content": text or None}
            if self.tools:
                message["tool_calls"] = [self.tools[i] for i in sorted(self.tools)]
        else:
            message = {"text": text}
        return ChoiceCapture(index, message, self.token_ids, self.logprobs, self.finish)


class StreamCapture:
    """Feed it every SSE event of a stream; it rewrites events and assembles the answer."""

    def __init__(self, endpoint: str, wants: Wants) -> None:
        self.endpoint = endpoint
        self.wants = wants
        self.prompt_token_ids: list[int] | None = None
        self.model: str | None = None
        self._choices: dict[int, _Assembly] = {}

    def on_event(self, event: bytes) -> bytes:
        """Record one ``data: {...}`` event and return it as the client should see it."""
        try:
            data = orjson.loads(event[5:])
        except orjson.JSONDecodeError:
            return event  # not ours to judge; the client gets it as it came
        if not isinstance(data, dict):
            return event
        if self.prompt_token_ids is None and isinstance(data.get("prompt_token_ids"), list):
            self.prompt_token_ids = data["prompt_token_ids"]
        if self.model is None and isinstance(data.get("model"), str):
            self.model = data["model"]
        for c in data.get("choices") or ():
            if isinstance(c, dict):
                self._add(c)
        if self.wants.logprobs and self.wants.token_ids:
            return event
        strip(data, self.wants)
        return b"data: " + orjson.dumps(data) + b"\n\n"

    def _add(self, c: dict[str, Any]) -> None:
        a = self._choices.setdefault(int(c.get("index") or 0), _Assembly())
        if self.endpoint == "chat":
            a.add_delta(c.get("delta") or {})
        elif isinstance(c.get("text"), str):
            a.content.append(c["text"])
        if isinstance(c.get("token_ids"), list):
            a.token_ids.extend(c["token_ids"])
        a.logprobs.extend(sampled_logprobs(c.get("logprobs")))
        if c.get("finish_reason"):
            a.finish = c["finish_reason"]

    def choices(self) -> list[ChoiceCapture]:
        return [self._choices[i].capture(i, self.endpoint) for i in sorted(self._choices)]
