"""The app factory. No module-level app, settings or clients: tests and the CLI build their own."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from opentelemetry import trace

from gateway.config import Settings
from gateway.errors import register_exception_handlers
from gateway.metrics import Metrics
from gateway.middleware import GatewayEntry
from gateway.routes import openai, ops, tools, trajectories
from gateway.serving import Gateway

log = logging.getLogger(__name__)


def create_app(
    settings: Settings,
    *,
    metrics: Metrics | None = None,
    tracer_provider: trace.TracerProvider | None = None,
) -> FastAPI:
    gateway = Gateway(settings, metrics=metrics, tracer_provider=tracer_provider)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await gateway.start()
        try:
            yield
        finally:
            await gateway.close()

    app = FastAPI(
        title="Gearshift",
        summary="OpenAI-compatible two-tier gateway for agents",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    app.include_router(openai.build_router(gateway))
    app.include_router(ops.build_router(gateway))
    app.include_router(trajectories.build_router(gateway))
    app.include_router(tools.build_router(gateway))
    register_exception_handlers(app)
    app.add_middleware(GatewayEntry, gateway=gateway)
    return app
