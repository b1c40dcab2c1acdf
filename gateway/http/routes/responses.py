"""The Responses API's routes (the serving logic is ``gateway.pipeline.responses``).

    POST   /v1/responses                      create (streamed with ``stream: true``)
    GET    /v1/responses/{id}                 the stored response object (``stream=true``
                                              ``&starting_after=N``: a streamed background
                                              run's events, resumed)
    DELETE /v1/responses/{id}                 delete it and its items
    GET    /v1/responses/{id}/input_items     its input items, a cursor page
    POST   /v1/responses/{id}/cancel          stop a background response
    POST   /v1/responses/compact              a conversation as its user messages and a
                                              summary (``compaction``)
    GET    /admin/v1/approvals                pending approval requests, MCP and sandbox
                                              tools (``approvals``)

Everything is scoped to the caller's tenant: another tenant's response is a 404 like a
missing one. docs/responses.md lists what is served and what is not yet.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter, FastAPI, Path, Query, Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from gateway.http.body import read_json, validated
from gateway.http.errors import exception_response
from gateway.http.routes import approvals
from gateway.pipeline.handler import STREAM_HEADERS, CompletionPipeline
from gateway.pipeline.request import RequestIdentity
from gateway.pipeline.responses import compaction, protocol
from gateway.pipeline.responses.serving import ResponsesService, Turn
from gateway.pipeline.services import Services
from gateway.store import responses as stored

log = logging.getLogger(__name__)
STREAM = {k.decode(): v.decode() for k, v in STREAM_HEADERS}
Ident = Annotated[str, Path(min_length=1, max_length=64)]


class _Serve(Response):
    """Runs the model step when Starlette sends the response: the pipeline writes to the
    socket itself (streams), and watches it for the client's departure."""

    def __init__(self, service: ResponsesService, turn: Turn) -> None:
        super().__init__()  # what FastAPI reads of a returned response (background, headers)
        self.service, self.turn = service, turn

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False

        async def tracked(message: Any) -> None:
            nonlocal started
            started = True
            await send(message)

        try:
            await self.service.serve(self.turn, scope, receive, tracked)
        except Exception as exc:  # mapped to an OpenAI error (counted by the pipeline)
            request_id = self.turn.parsed.identity.request_id
            if started:
                log.error("response %s failed after its answer began", request_id, exc_info=exc)
                return
            await exception_response(exc, request_id)(scope, receive, send)


def build_router(services: Services, pipeline: CompletionPipeline) -> APIRouter:
    service = ResponsesService(services, pipeline)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Inside the app's lifespan: background runs stop (and are stored) before the
        # recorder closes.
        try:
            yield
        finally:
            await service.background.close()

    outer = APIRouter(lifespan=lifespan)
    router = APIRouter(prefix="/v1/responses")

    def tenant(request: Request) -> str:
        return services.auth.authenticate(request.headers.get("authorization")).tenant

    @router.post("")
    async def create(request: Request) -> Response:
        headers = request.headers
        who = services.auth.authenticate(headers.get("authorization"))
        body = await read_json(request, services.settings.limits.max_body_bytes)
        protocol.check_names(body)
        parsed = validated(body, protocol.ResponsesRequest)
        protocol.check_supported(parsed)
        if parsed.truncation is None:  # the key's, tenant's or config's default
            default = services.settings.context.truncation_for(who.tenant, who.key_name)
            parsed = parsed.model_copy(update={"truncation": default})
        identity = RequestIdentity(
            request.state.request_id, request.state.t0, "chat", parsed.model, who.tenant,
            who.key_name, headers.get("x-session-id"), headers.get("x-gearshift-task-id"),
            headers.get("x-gearshift-group-id"), context=parsed.truncation,
        )  # fmt: skip
        turn = await service.prepare(parsed, identity)
        if parsed.background:
            queued = await service.background.start(turn)
            if parsed.stream:  # the run's events, read from its log (it runs on if we leave)
                events = service.background.follow(who.tenant, queued["id"], -1)
                return StreamingResponse(events, headers=STREAM)
            return Response(orjson.dumps(queued), media_type="application/json")
        return _Serve(service, turn)

    @router.post("/compact")
    async def compact(request: Request) -> dict[str, Any]:
        headers = request.headers
        who = services.auth.authenticate(headers.get("authorization"))
        body = await read_json(request, services.settings.limits.max_body_bytes)
        parsed = validated(body, compaction.CompactRequest)
        identity = RequestIdentity(
            request.state.request_id, request.state.t0, "chat", parsed.model, who.tenant,
            who.key_name, headers.get("x-session-id"),
        )  # fmt: skip
        return await compaction.compact(services, parsed, identity, service.call)

    @router.get("/{ident}", response_model=None)
    async def retrieve(
        request: Request,
        ident: Ident,
        stream: bool = False,
        starting_after: Annotated[int, Query(ge=-1)] = -1,
    ) -> dict[str, Any] | StreamingResponse:
        who = tenant(request)
        if stream:  # a streamed background run's events, resumed after a sequence number
            events = service.background.follow(who, ident, starting_after)
            return StreamingResponse(events, headers=STREAM)
        return await service.call(lambda c: stored.get(c, who, ident))

    @router.delete("/{ident}")
    async def delete(request: Request, ident: Ident) -> dict[str, Any]:
        who = tenant(request)
        service.background.forget(who, ident)
        return await service.call(lambda c: stored.remove(c, who, ident))

    @router.post("/{ident}/cancel")
    async def cancel(request: Request, ident: Ident) -> dict[str, Any]:
        return await service.background.cancel(tenant(request), ident)

    @router.get("/{ident}/input_items")
    async def input_items(
        request: Request,
        ident: Ident,
        limit: Annotated[int, Query(ge=1, le=100)] = 20,
        after: Annotated[str | None, Query(max_length=64)] = None,
        order: Literal["asc", "desc"] = "desc",
    ) -> dict[str, Any]:
        who = tenant(request)
        return await service.call(
            lambda c: stored.input_items(c, who, ident, limit=limit, after=after, order=order)
        )

    outer.include_router(router)
    outer.include_router(approvals.build_router(services, service))
    return outer
