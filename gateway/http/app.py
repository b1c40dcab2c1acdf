"""The app factory. No module-level app, settings or clients: tests and the CLI build their own."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from opentelemetry import trace

from gateway.config import Settings
from gateway.http.completions import Completions
from gateway.http.dashboard import pages as dashboard
from gateway.http.entry import GatewayEntry
from gateway.http.errors import register_exception_handlers
from gateway.http.routes import admin, agents, control, models, ops, responses, tools, trajectories
from gateway.metrics import Metrics
from gateway.pipeline.services import Services


def create_app(
    settings: Settings,
    *,
    metrics: Metrics | None = None,
    tracer_provider: trace.TracerProvider | None = None,
) -> FastAPI:
    services = Services(settings, metrics=metrics, tracer_provider=tracer_provider)
    agent_metrics = agents.AgentMetricsExporter(services)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await services.start()
        agent_metrics.start()
        try:
            yield
        finally:
            await agent_metrics.close()
            await services.close()

    app = FastAPI(
        title="Gearshift",
        summary="OpenAI-compatible two-tier gateway for agents",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    app.include_router(models.build_router(services))
    app.include_router(ops.build_router(services))
    app.include_router(trajectories.build_router(services))
    app.include_router(admin.build_router(services))
    app.include_router(tools.build_router(services))
    app.include_router(agents.build_router(services, agent_metrics))
    app.include_router(control.build_router(services))
    app.include_router(dashboard.build_router(services))
    completions = Completions(services)
    app.include_router(responses.build_router(services, completions.pipeline))
    register_exception_handlers(app)
    app.add_middleware(GatewayEntry, completions=completions)
    return app
