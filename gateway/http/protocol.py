"""Wire models of the OpenAI endpoints the gateway serves.

They validate the fields the gateway and vLLM care about, strictly (a string
where a number belongs is a 400, not a coercion), and allow every other field:
new OpenAI parameters must reach vLLM unchanged. The gateway forwards the
client's own JSON object, not a re-serialized model, so nothing is lost or
reordered; unknown top-level fields are logged once per name.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sandbox.protocol import describe_validation

log = logging.getLogger(__name__)


class OpenAIModel(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class FunctionCall(OpenAIModel):
    name: str
    arguments: str


class ToolCall(OpenAIModel):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ContentPart(OpenAIModel):
    type: str
    text: str | None = None  # a text part's words; whatever else a part carries passes through


class ChatMessage(OpenAIModel):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None


class FunctionDef(OpenAIModel):
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(OpenAIModel):
    type: Literal["function"]
    function: FunctionDef


class StreamOptions(OpenAIModel):
    include_usage: bool | None = None


class SamplingFields(OpenAIModel):
    model: Annotated[str, Field(min_length=1)]
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Annotated[int, Field(ge=1, le=128)] | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    presence_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    user: str | None = None


class ChatCompletionRequest(SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    reasoning_effort: str | None = None


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: Annotated[int, Field(ge=0)] | None = None  # 0 with echo: the prompt alone
    logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    echo: bool | None = None
    suffix: str | None = None


_KNOWN = {
    "chat": frozenset(ChatCompletionRequest.model_fields),
    "completions": frozenset(CompletionRequest.model_fields),
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
