"""Hosted tools: the sandbox's tools, reached through the gateway with the caller's API key.

    GET  /v1/tools               the tools' JSON schemas (to pass as ``tools`` to a chat call)
    POST /v1/tools/{name}        run one: {"arguments": {...}, "tool_call_id": ..., "approved": ...}

The session is the caller's ``X-Session-Id`` (or ``session_id`` in the body): one sandbox
workspace per tenant and session, created on first use. The sandbox decides with the
caller's tenant and key. When the call answers a tool call a recorded step made
(``tool_call_id``), its result, exit status, denial, injected fault and attestation are
stored on that tool call, with ``tool_success`` and ``tool_seconds`` rewards; ``recorded``
in the answer says so (queued for the store, like the steps, when this gateway recorded
the call; committed, when the call is found in the store instead).
"""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import Response

from gateway.errors import InvalidRequest, PermissionDenied
from gateway.http.body import read_model
from gateway.pipeline.services import Services
from gateway.pipeline.tools import list_tools, run_tool
from gateway.store import queries

MAX_BODY = 4 << 20  # the sandbox's own limit on a call


class ToolRun(BaseModel):
    model_config = ConfigDict(extra="forbid")
    arguments: dict[str, Any] = Field(default_factory=dict)
    session_id: str | None = Field(default=None, min_length=1, max_length=256)
    tool_call_id: str | None = Field(default=None, max_length=128)
    approved: bool = False


def build_router(services: Services) -> APIRouter:
    router = APIRouter(prefix="/v1")

    @router.get("/tools")
    async def tools(request: Request) -> Response:
        services.auth.authenticate(request.headers.get("authorization"))
        return Response(
            orjson.dumps({"object": "list", "data": await list_tools(services.sandbox)}),
            media_type="application/json",
        )

    @router.post("/tools/{name}")
    async def run(request: Request, name: str) -> Response:
        who = services.auth.authenticate(request.headers.get("authorization"))
        if not who.may_run_tool(name):
            raise PermissionDenied(f"this API key may not run the tool {name!r}", param="name")
        switched_off = services.control.tool_off(name)
        if switched_off is not None:
            raise PermissionDenied(switched_off, param="name")
        body = await read_model(request, ToolRun, MAX_BODY)
        session = body.session_id or request.headers.get("x-session-id")
        if not session:
            raise InvalidRequest(
                "name the session: X-Session-Id header or session_id", param="session_id"
            )
        result = await run_tool(
            services.sandbox, who.tenant, who.key_name, session, name, body.arguments,
            body.approved,
        )  # fmt: skip
        recorded = False
        data = result.model_dump()
        if body.tool_call_id and services.recorder is not None:
            text = result.stdout or (
                orjson.dumps(result.output).decode() if result.output is not None else result.stderr
            )
            outcome = data | {"text": text}
            call_id = body.tool_call_id
            # A call this gateway recorded goes to the writer's batches like the steps;
            # another replica's (or one from before a restart) is looked up in the store.
            known = await services.recorder.tool_result(who.tenant, session, call_id, outcome)
            recorded = (
                known
                if known is not None
                else await services.recorder.call(
                    lambda c: queries.record_tool_result(c, who.tenant, session, call_id, outcome)
                )
            )
        return Response(orjson.dumps(data | {"recorded": recorded}), media_type="application/json")

    return router
