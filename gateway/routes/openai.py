"""The OpenAI endpoints: thin handlers over ``Gateway``."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from gateway.serving import Gateway


def build_router(gateway: Gateway) -> APIRouter:
    router = APIRouter(prefix="/v1")

    @router.post("/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await gateway.handle(request, "chat")

    @router.post("/completions")
    async def completions(request: Request) -> Response:
        return await gateway.handle(request, "completions")

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
