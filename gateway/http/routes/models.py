"""The OpenAI model list. (The completion endpoints are served by ``gateway.http.entry``.)"""

from __future__ import annotations

from fastapi import APIRouter, Request

from gateway.pipeline.services import Services


def build_router(services: Services) -> APIRouter:
    router = APIRouter(prefix="/v1")

    @router.get("/models")
    async def models(request: Request) -> dict[str, object]:
        services.auth.authenticate(request.headers.get("authorization"))
        entries: list[dict[str, object]] = [
            {
                "id": "auto",
                "object": "model",
                "created": services.created,
                "owned_by": "gearshift",
                "gearshift": {"routed": True, "policy": services.policy.name},
            },
        ]
        for tier, pool in services.pools.items():
            entries.append(
                {
                    "id": pool.model,
                    "object": "model",
                    "created": services.created,
                    "owned_by": "gearshift",
                    "gearshift": {"tier": str(tier), "available": pool.available()},
                }
            )
        return {"object": "list", "data": entries}

    return router
