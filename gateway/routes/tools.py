"""Hosted tools: the sandbox's tools, reached through the gateway with the caller's API key.

    GET  /v1/tools               the tools' JSON schemas (to pass as ``tools`` to a chat call)
    POST /v1/tools/{name}        run one: {"arguments": {...}, "tool_call_id": ..., "approved": ...}

The session is the caller's ``X-Session-Id`` (or ``session_id`` in the body): one sandbox
workspace per tenant and session, created on first use. The sandbox decides with the
caller's tenant and key. When the call answers a tool call a recorded step made
(``tool_call_id``), its result, exit status, denial, injected fault and attestation are
stored on that tool call, with ``tool_success`` and ``tool_seconds`` rewards.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson
from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import Response

from gateway.errors import InvalidRequest, ResourceNotFound, StoreUnavailable, UpstreamError
from gateway.routes.trajectories import parse
from gateway.serving import Gateway
from gateway.store import queries
from sandbox.client import SandboxError


class ToolRun(BaseModel):
    model_config = ConfigDict(extra="forbid")
    arguments: dict[str, Any] = Field(default_factory=dict)
    session_id: str | None = Field(default=None, min_length=1, max_length=256)
    tool_call_id: str | None = Field(default=None, max_length=128)
    approved: bool = False


def sandbox_session(tenant: str, session: str) -> str:
    return hashlib.sha256(f"{tenant}\x00{session}".encode()).hexdigest()[:32]


def build_router(gateway: Gateway) -> APIRouter:
    router = APIRouter(prefix="/v1")

    def client() -> Any:
        if gateway.sandbox is None:
            raise StoreUnavailable("the tool sandbox is not running (see the gateway's log)")
        return gateway.sandbox

    @router.get("/tools")
    async def tools(request: Request) -> Response:
        gateway.auth.authenticate(request.headers.get("authorization"))
        return Response(
            orjson.dumps({"object": "list", "data": await client().tools()}),
            media_type="application/json",
        )

    @router.post("/tools/{name}")
    async def run(request: Request, name: str) -> Response:
        who = gateway.auth.authenticate(request.headers.get("authorization"))
        body = await parse(request, ToolRun)
        session = body.session_id or request.headers.get("x-session-id")
        if not session:
            raise InvalidRequest(
                "name the session: X-Session-Id header or session_id", param="session_id"
            )
        sbx, sid = client(), sandbox_session(who.tenant, session)
        try:
            try:
                result = await sbx.call(
                    who.tenant, who.key_name, sid, name, body.arguments, body.approved
                )
            except SandboxError as exc:
                if exc.status != 404 or exc.code == "unknown_tool":
                    raise
                try:
                    await sbx.create_session(who.tenant, who.key_name, session_id=sid)
                except SandboxError as race:
                    if race.status != 409:  # 409: a concurrent first call created it
                        raise
                result = await sbx.call(
                    who.tenant, who.key_name, sid, name, body.arguments, body.approved
                )
        except SandboxError as exc:
            if exc.status == 404:
                raise ResourceNotFound(str(exc)) from None
            if exc.status in (400, 409, 413):
                raise InvalidRequest(str(exc), status=exc.status) from None
            raise UpstreamError(f"tool sandbox: {exc}") from None  # 401, 5xx: not the caller's
        recorded = False
        if body.tool_call_id and gateway.recorder is not None:
            text = result.stdout or (
                orjson.dumps(result.output).decode() if result.output is not None else result.stderr
            )
            outcome = result.model_dump() | {"text": text}
            recorded = await gateway.recorder.call(
                lambda c: queries.record_tool_result(
                    c, who.tenant, session, body.tool_call_id or "", outcome
                )
            )
        data = result.model_dump() | {"recorded": recorded}
        return Response(orjson.dumps(data), media_type="application/json")

    return router
