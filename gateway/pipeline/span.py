"""One span per model request, following the OpenTelemetry GenAI semantic conventions."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

from gateway.pipeline.outcome import Outcome
from gateway.pipeline.request import RequestIdentity
from router import Endpoint

OPERATION: dict[Endpoint, str] = {"chat": "chat", "completions": "text_completion"}
REQUEST_ATTRIBUTES = (
    ("max_tokens", "gen_ai.request.max_tokens"),
    ("max_completion_tokens", "gen_ai.request.max_tokens"),
    ("temperature", "gen_ai.request.temperature"),
    ("top_p", "gen_ai.request.top_p"),
    ("seed", "gen_ai.request.seed"),
    ("n", "gen_ai.request.choice.count"),
)


def start_span(tracer: Tracer, who: RequestIdentity, body: Mapping[str, Any]) -> Span:
    op = OPERATION[who.endpoint]
    attrs: dict[str, Any] = {
        "gen_ai.operation.name": op,
        "gen_ai.provider.name": "vllm",
        "gen_ai.request.model": who.requested_model,
        "gearshift.request_id": who.request_id,
    }
    for key, attr in REQUEST_ATTRIBUTES:
        value = body.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            attrs[attr] = value
    if who.session_id:
        attrs["gen_ai.conversation.id"] = who.session_id
    return tracer.start_span(f"{op} {who.requested_model}", kind=SpanKind.CLIENT, attributes=attrs)


def end_span(span: Span, outcome: Outcome) -> None:
    if span.is_recording():
        served = outcome.served
        attrs: dict[str, Any] = {
            "http.response.status_code": outcome.status,
            "gearshift.attempts": served.attempts,
            "gearshift.tier": str(served.tier),
            "gearshift.route_reason": outcome.route_reason,
            "gearshift.fallback": served.fallback,
        }
        if served.replica:
            attrs["server.address"] = served.replica
        if outcome.response_model:
            attrs["gen_ai.response.model"] = outcome.response_model
        if outcome.prompt_tokens is not None:
            attrs["gen_ai.usage.input_tokens"] = outcome.prompt_tokens
        if outcome.completion_tokens is not None:
            attrs["gen_ai.usage.output_tokens"] = outcome.completion_tokens
        if outcome.finish_reasons:
            attrs["gen_ai.response.finish_reasons"] = list(outcome.finish_reasons)
        span.set_attributes(attrs)
        error = outcome.error or outcome.stream_error
        if outcome.status >= 400 or error:
            kind = str(outcome.status) if outcome.status >= 400 else "stream_error"
            span.set_attribute("error.type", kind)
            span.set_status(Status(StatusCode.ERROR, error))
    span.end()
