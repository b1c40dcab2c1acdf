"""Operational endpoints: liveness, readiness, Prometheus metrics."""

from __future__ import annotations

import orjson
from fastapi import APIRouter
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.responses import Response

from gateway.pipeline.services import Services


def build_router(services: Services) -> APIRouter:
    router = APIRouter()

    @router.get("/health")
    async def health() -> Response:
        return Response(b'{"status":"ok"}', media_type="application/json")

    @router.get("/ready")
    async def ready() -> Response:
        for tier, pool in services.pools.items():
            for r in pool.replicas:
                services.metrics.replica_healthy.labels(str(tier), r.url).set(1 if r.healthy else 0)
        body = {
            "ready": services.ready(),
            "tiers": {
                str(t): {"model": p.model, "replicas": p.status()}
                for t, p in services.pools.items()
            },
        }
        return Response(
            orjson.dumps(body), 200 if body["ready"] else 503, media_type="application/json"
        )

    @router.get("/metrics")
    async def metrics() -> Response:
        for tier, pool in services.pools.items():
            for r in pool.replicas:
                services.metrics.replica_healthy.labels(str(tier), r.url).set(1 if r.healthy else 0)
        return Response(generate_latest(services.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return router
