"""Operators answer approval requests of MCP and sandbox tools (admin keys only;
docs/responses.md, "Approvals").

    GET    /admin/v1/approvals                     pending requests (?tenant=)
    POST   /admin/v1/approvals/{approval_request_id}   {"approve": bool, "reason": "..."}

A decision is stored on the response that asked, with ``approver: "operator:<key name>"``;
the client's next request of that chain (``previous_response_id``) applies it, with no
``mcp_approval_response`` of its own for that request.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from gateway.errors import PermissionDenied
from gateway.http.body import read_json, validated
from gateway.pipeline.responses.approvals import decision_item
from gateway.pipeline.responses.serving import ResponsesService
from gateway.pipeline.services import Services
from gateway.store import approvals as stored

Ident = Annotated[str, Path(min_length=1, max_length=64)]


class Answer(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    approve: bool
    reason: Annotated[str, Field(max_length=4096)] | None = None


def build_router(services: Services, service: ResponsesService) -> APIRouter:
    router = APIRouter(prefix="/admin/v1/approvals")

    def operator(request: Request) -> str:
        who = services.auth.authenticate(request.headers.get("authorization"))
        if not who.admin:
            raise PermissionDenied("answering approval requests needs an admin key")
        return f"operator:{who.key_name}"

    @router.get("")
    async def pending(
        request: Request, tenant: Annotated[str | None, Query(max_length=128)] = None
    ) -> dict[str, Any]:
        operator(request)
        data = await service.call(lambda c: stored.pending(c, tenant))
        return {"object": "list", "data": data}

    @router.post("/{ident}")
    async def answer(request: Request, ident: Ident) -> dict[str, Any]:
        approver = operator(request)
        body = await read_json(request, services.settings.limits.max_body_bytes)
        parsed = validated(body, Answer)
        decision = decision_item(ident, parsed.approve, parsed.reason, approver)
        return await service.call(
            lambda c: stored.decide(c, ident, decision), "approval_request_id"
        )

    return router
