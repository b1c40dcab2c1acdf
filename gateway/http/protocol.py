"""Wire models of the OpenAI endpoints the gateway serves.

They validate the fields the gateway and vLLM care about, strictly (a string
where a number belongs is a 400, not a coercion), and allow every other field:
new OpenAI parameters must reach vLLM unchanged. The gateway forwards the
client's own JSON object, not a re-serialized model, so nothing is lost or
reordered; unknown top-level fields are logged once per name.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any, Literal, NotRequired

from pydantic import ConfigDict, Field, TypeAdapter, ValidationError, with_config
from typing_extensions import TypedDict

from sandbox.protocol import describe_validation

log = logging.getLogger(__name__)


# Each shape is a TypedDict validated by a ``TypeAdapter``: the same rules as models would
# check, without building an object per message, tool and call that nobody reads (the
# client's own dict is what is forwarded). About half the CPU of validating models on an
# agent's 39 KB body (docs/decisions/wire-typeddicts.md). Strict: a string where a number belongs
# is a 400, not a coercion; every other key is allowed and kept.
WIRE = ConfigDict(extra="allow", strict=True)


@with_config(WIRE)
class FunctionCall(TypedDict):
    name: str
    arguments: str


@with_config(WIRE)
class ToolCall(TypedDict):
    id: NotRequired[str | None]
    type: NotRequired[Literal["function"]]
    function: FunctionCall


@with_config(WIRE)
class ContentPart(TypedDict):
    type: str
    text: NotRequired[str | None]  # a text part's words; whatever else a part carries passes


@with_config(WIRE)
class ChatMessage(TypedDict):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: NotRequired[str | list[ContentPart] | None]
    name: NotRequired[str | None]
    tool_calls: NotRequired[list[ToolCall] | None]
    tool_call_id: NotRequired[str | None]


@with_config(WIRE)
class FunctionDef(TypedDict):
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")]
    description: NotRequired[str | None]
    parameters: NotRequired[dict[str, Any] | None]
    strict: NotRequired[bool | None]


@with_config(WIRE)
class Tool(TypedDict):
    type: Literal["function"]
    function: FunctionDef


@with_config(WIRE)
class StreamOptions(TypedDict):
    include_usage: NotRequired[bool | None]


@with_config(WIRE)
class SamplingFields(TypedDict):
    model: Annotated[str, Field(min_length=1)]
    stream: NotRequired[bool]
    stream_options: NotRequired[StreamOptions | None]
    n: NotRequired[Annotated[int, Field(ge=1, le=128)] | None]
    max_tokens: NotRequired[Annotated[int, Field(ge=1)] | None]
    temperature: NotRequired[Annotated[float, Field(ge=0, le=2)] | None]
    top_p: NotRequired[Annotated[float, Field(gt=0, le=1)] | None]
    seed: NotRequired[int | None]
    stop: NotRequired[str | list[str] | None]
    presence_penalty: NotRequired[Annotated[float, Field(ge=-2, le=2)] | None]
    frequency_penalty: NotRequired[Annotated[float, Field(ge=-2, le=2)] | None]
    user: NotRequired[str | None]


@with_config(WIRE)
class ChatCompletionRequest(SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: NotRequired[Annotated[int, Field(ge=1)] | None]
    logprobs: NotRequired[bool | None]
    top_logprobs: NotRequired[Annotated[int, Field(ge=0, le=20)] | None]
    tools: NotRequired[list[Tool] | None]
    tool_choice: NotRequired[Literal["none", "auto", "required"] | dict[str, Any] | None]
    parallel_tool_calls: NotRequired[bool | None]
    response_format: NotRequired[dict[str, Any] | None]
    reasoning_effort: NotRequired[str | None]


@with_config(WIRE)
class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: NotRequired[Annotated[int, Field(ge=0)] | None]  # 0 with echo: the prompt alone
    logprobs: NotRequired[Annotated[int, Field(ge=0, le=20)] | None]
    echo: NotRequired[bool | None]
    suffix: NotRequired[str | None]


# what validates each endpoint's body (a pydantic ValidationError on the first problem)
REQUESTS: dict[str, TypeAdapter[Any]] = {
    "chat": TypeAdapter(ChatCompletionRequest),
    "completions": TypeAdapter(CompletionRequest),
}
_KNOWN = {
    "chat": frozenset(
        ChatCompletionRequest.__required_keys__ | ChatCompletionRequest.__optional_keys__
    ),
    "completions": frozenset(
        CompletionRequest.__required_keys__ | CompletionRequest.__optional_keys__
    ),
}


def note_unknown_fields(endpoint: str, body: dict[str, Any], seen: set[str]) -> None:
    """Log, once per name (``seen`` remembers), top-level fields forwarded without being known."""
    for key in body.keys() - _KNOWN[endpoint]:
        if key not in seen:
            seen.add(key)
            log.info("forwarding unrecognised %s field %r to vLLM unchanged", endpoint, key)


def describe(exc: ValidationError) -> tuple[str, str | None]:
    """One readable sentence for the first validation error, and the offending parameter."""
    return describe_validation(exc.errors(include_url=False))
