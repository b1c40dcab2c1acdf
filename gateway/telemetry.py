"""OpenTelemetry: one span per model request, following the GenAI semantic conventions.

The tracer provider is built from settings in the app's lifespan (or injected
by tests with an in-memory exporter). With ``exporter: none`` the no-op tracer
is used and a span costs next to nothing on the request path.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

from gateway.config import TelemetrySettings
from gateway.context import RequestContext

OPERATION = {"chat": "chat", "completions": "text_completion"}


def build_tracer_provider(settings: TelemetrySettings) -> trace.TracerProvider:
    if settings.exporter == "none":
        return trace.NoOpTracerProvider()
    exporter: SpanExporter
    if settings.exporter == "console":
        exporter = ConsoleSpanExporter()
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = (
            OTLPSpanExporter(endpoint=settings.otlp_endpoint)
            if settings.otlp_endpoint
            else OTLPSpanExporter()
        )
    provider = TracerProvider(resource=Resource.create({"service.name": settings.service_name}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def start_span(tracer: Tracer, ctx: RequestContext, body: Mapping[str, Any]) -> Span:
    op = OPERATION[ctx.endpoint]
    attrs: dict[str, Any] = {
        "gen_ai.operation.name": op,
        "gen_ai.provider.name": "vllm",
        "gen_ai.request.model": ctx.requested_model,
        "gearshift.request_id": ctx.request_id,
    }
    for key, attr in (
        ("max_tokens", "gen_ai.request.max_tokens"),
        ("max_completion_tokens", "gen_ai.request.max_tokens"),
        ("temperature", "gen_ai.request.temperature"),
        ("top_p", "gen_ai.request.top_p"),
        ("seed", "gen_ai.request.seed"),
        ("n", "gen_ai.request.choice.count"),
    ):
        value = body.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            attrs[attr] = value
    if ctx.session_id:
        attrs["gen_ai.conversation.id"] = ctx.session_id
    return tracer.start_span(f"{op} {ctx.requested_model}", kind=SpanKind.CLIENT, attributes=attrs)


def end_span(span: Span, ctx: RequestContext, status: int, response_model: str | None) -> None:
    if span.is_recording():
        attrs: dict[str, Any] = {
            "http.response.status_code": status,
            "gearshift.attempts": ctx.attempts,
        }
        if ctx.tier is not None:
            attrs["gearshift.tier"] = str(ctx.tier)
            attrs["gearshift.route_reason"] = ctx.route_reason
            attrs["gearshift.fallback"] = ctx.fallback
        if ctx.replica:
            attrs["server.address"] = ctx.replica
        if response_model:
            attrs["gen_ai.response.model"] = response_model
        if ctx.prompt_tokens is not None:
            attrs["gen_ai.usage.input_tokens"] = ctx.prompt_tokens
        if ctx.completion_tokens is not None:
            attrs["gen_ai.usage.output_tokens"] = ctx.completion_tokens
        if ctx.finish_reasons:
            attrs["gen_ai.response.finish_reasons"] = ctx.finish_reasons
        span.set_attributes(attrs)
        if status >= 400 or ctx.error:
            span.set_attribute("error.type", str(status) if status >= 400 else "stream_error")
            span.set_status(Status(StatusCode.ERROR, ctx.error))
    span.end()
