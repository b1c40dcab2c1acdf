"""OpenTelemetry: the tracer provider, built from settings (or injected by tests with an
in-memory exporter). With ``exporter: none`` the no-op tracer is used and a span costs next
to nothing on the request path. The request's span is ``gateway.pipeline.span``.
"""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

from gateway.config import TelemetrySettings


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
