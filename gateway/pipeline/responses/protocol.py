"""The ``POST /v1/responses`` body: which parameters this slice serves, accepts or refuses.

Unlike chat completions, a Responses body is not forwarded to vLLM: the gateway turns it
into a chat request (``gateway.pipeline.responses.chat``). So an unknown parameter cannot
"pass through" — it is a 400 naming it. Three kinds of known parameters:

* served: ``SERVED`` below (docs/responses.md says how each maps to the chat request);
* accepted and ignored: ``IGNORED`` (valid OpenAI parameters that change nothing here yet,
  e.g. ``reasoning``; ``truncation: "auto"`` is served by the context stage, docs/context.md);
* not supported yet: ``NOT_YET``, a 400 naming the parameter when it is set
  (``conversation``, ``prompt``, ...). Tool types other than function,
  code_interpreter, sandbox (``hosted``) and mcp (``mcp_tools``) are refused in ``chat``.

Input items, tools, ``tool_choice`` and ``text`` are checked by hand where they are
converted, so that a 400 names the exact field (``input[2].call_id``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gateway.errors import InvalidRequest

SERVED = frozenset(
    {
        "model", "input", "instructions", "previous_response_id", "store", "stream",
        "max_output_tokens", "tool_choice", "tools", "parallel_tool_calls", "text",
        "temperature", "top_p", "metadata", "user", "max_tool_calls", "background",
        "truncation",
    }
)  # fmt: skip
IGNORED = frozenset(
    {
        "reasoning", "include", "prompt_cache_key",
        "prompt_cache_retention", "prompt_cache_options", "safety_identifier", "service_tier",
        "top_logprobs", "stream_options",
    }
)  # fmt: skip
NOT_YET = frozenset(
    {
        "conversation", "prompt", "context_management", "moderation", "image",
        "access_programs", "background_options",
    }
)  # fmt: skip


class ResponsesRequest(BaseModel):
    """The scalar parameters, strictly typed; item lists are checked where converted."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: Annotated[str, Field(min_length=1)]
    input: str | list[Any]
    instructions: str | None = None
    previous_response_id: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    store: bool | None = None
    stream: bool | None = None
    max_output_tokens: Annotated[int, Field(ge=1)] | None = None
    tool_choice: str | dict[str, Any] | None = None
    tools: list[Any] | None = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    metadata: Annotated[dict[str, Annotated[str, Field(max_length=512)]], Field(max_length=16)] | None = None  # fmt: skip
    user: str | None = None
    max_tool_calls: Annotated[int, Field(ge=1)] | None = None
    background: bool | None = None  # gateway.pipeline.responses.background
    truncation: Literal["auto", "disabled"] | None = None  # "auto": gateway.pipeline.context
    # accepted, not used yet (IGNORED)
    reasoning: dict[str, Any] | None = None
    include: list[str] | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    safety_identifier: str | None = None
    service_tier: str | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    stream_options: dict[str, Any] | None = None
    # refused when set (NOT_YET)
    conversation: Any = None
    prompt: Any = None
    context_management: Any = None
    moderation: Any = None
    image: Any = None
    access_programs: Any = None
    background_options: Any = None

    @property
    def stored(self) -> bool:
        return self.store is not False


def check_names(body: dict[str, Any]) -> None:
    """A 400 naming every parameter that is not an OpenAI Responses parameter."""
    unknown = sorted(body.keys() - SERVED - IGNORED - NOT_YET)
    if unknown:
        names = ", ".join(repr(n) for n in unknown)
        raise InvalidRequest(
            f"unrecognized request argument(s): {names} (see docs/responses.md)", param=unknown[0]
        )


def check_supported(request: ResponsesRequest) -> None:
    """A 400 for valid parameters this slice does not serve yet."""
    if request.background and request.store is False:
        raise InvalidRequest(
            "background responses must be stored: background: true needs store: true",
            param="background",
        )
    for name in sorted(NOT_YET):
        if getattr(request, name) is not None:
            raise not_yet(name, repr(name))
    for key in request.metadata or {}:
        if len(key) > 64:
            raise InvalidRequest("metadata keys are at most 64 characters", param="metadata")


def not_yet(param: str, what: str) -> InvalidRequest:
    return InvalidRequest(
        f"{what} is not supported yet by this gateway's /v1/responses; it serves function "
        "tools, the sandbox's hosted tools (code_interpreter, sandbox), MCP tools, and "
        "background runs (see docs/responses.md)",
        param=param,
    )
