"""What the request path hands to the recorder: plain data, built without I/O."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson


class RawJson:
    """A JSON value kept as the bytes it arrived in. The request path never parses what
    only the recorder needs (the client's whole body, a prompt's token ids): the bytes
    go into the writer's frame as they are, and the writer process parses them.
    (Not a dataclass: orjson would write it as an object instead of asking for its text.)"""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __repr__(self) -> str:
        return f"RawJson({len(self.data)} bytes)"

    def parsed(self) -> Any:
        return orjson.loads(self.data)


@dataclass(slots=True)
class ChoiceCapture:
    """One choice of a model answer as the engine produced it."""

    index: int
    message: dict[str, Any] | None = None  # chat: the assistant message; completions: {"text"}
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    finish_reason: str | None = None


@dataclass(slots=True)
class ChainHashes:
    """The hash chain of an unnamed chat session as the request path computed it
    (``gateway.store.chain``): the history's prefix hash and each choice's continuation
    hash. The writer hashes the history itself when a record has none."""

    prefix: str | None
    continuations: list[str | None]


@dataclass(slots=True)
class StepRecord:
    """One model call (all its choices) and everything known about how it was served."""

    step_ids: list[str]  # one per choice, generated on the request path
    request_id: str
    tenant: str
    api_key: str
    endpoint: str
    request: dict[str, Any] | RawJson  # the body as the client sent it (before capture fields)
    external_session: str | None
    task_id: str | None
    group_id: str | None
    created_at: float  # unix time
    status: int = 0
    tier: str | None = None
    model: str | None = None
    replica: str | None = None
    policy: str | None = None
    propensity: float | None = None
    route_reason: str | None = None
    features: dict[str, Any] | None = None
    fallback: bool = False
    escalated: bool = False
    attempts: int = 0
    prompt_token_ids: list[int] | RawJson | None = None  # the writer sees a list
    choices: list[ChoiceCapture] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    ttft_ms: float | None = None
    duration_ms: float = 0.0
    error: str | None = None
    chain: ChainHashes | None = None
    routing_version: str | None = None  # gateway.routing.control
    # the condensation of its prompt, a session event (``gateway.recording.context_event``)
    context: dict[str, Any] | None = None

    def describe(self) -> str:
        return f"request {self.request_id}"

    def call_ids(self) -> set[str]:
        """The ids of the tool calls its answers made."""
        return {
            str(call["id"])
            for choice in self.choices
            for call in (choice.message or {}).get("tool_calls") or ()
            if isinstance(call, dict) and call.get("id")
        }


@dataclass(slots=True)
class ToolResultRecord:
    """A sandbox run answering a recorded tool call (``POST /v1/tools/{name}`` with a
    ``tool_call_id``): written in the writer's batches, after the step that made the call."""

    tenant: str
    session: str  # the client's session name
    call_id: str
    outcome: dict[str, Any]  # the sandbox's result, with ``text``: what the model will read
    created_at: float
    kind: str = "tool_result"

    def describe(self) -> str:
        return f"the tool result for call {self.call_id!r}"
