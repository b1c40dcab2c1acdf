"""The OpenAI model list. (The completion endpoints are served by ``gateway.middleware``.)"""

from __future__ import annotations

from fastapi import APIRouter, Request

from gateway.serving import Gateway


def build_router(gateway: Gateway) -> APIRouter:
    router = APIRouter(prefix="/v1")

    @router.get("/models")
    async def models(request: Request) -> dict[str, object]:
        gateway.auth.authenticate(request.headers.get("authorization"))
        entries: list[dict[str, object]] = [
            {
                "id": "auto",
                "object": "model",
                "created": gateway.created,
                "owned_by": "gearshift",
                "gearshift": {"routed": True, "policy": gateway.policy.name},
            },
        ]
        for tier, pool in gateway.pools.items():
            entries.append(
                {
                    "id": pool.model,
                    "object": "model",
                    "created": gateway.created,
                    "owned_by": "gearshift",
                    "gearshift": {"tier": str(tier), "available": pool.available()},
                }
            )
        return {"object": "list", "data": entries}

    return router
