"""The sandbox's HTTP service (Starlette); the logic is in ``sandbox.core``.

    GET    /health
    GET    /v1/tools                   every tool's JSON schema
    POST   /v1/approvals               {principal}: the tools its grant holds for an approval
    POST   /v1/sessions                a workspace for one trajectory (+ fault plan)
    DELETE /v1/sessions/{id}           remove it (also done after session_ttl_s idle)
    POST   /v1/tools/{name}            run a tool call: policy, faults, runtime, attestation

On a Unix socket, tool calls are also taken as frames on ``<socket>.frames``
(``sandbox.frames``: the same token, models, limits and answers, without HTTP).
Every call but /health needs ``Authorization: Bearer <token>`` (constant-time
comparison). Errors are ``{"error": {"message", "type", "code"}}``, translated from the
exception tree (``sandbox.errors``) in one place, ``error_response``; a bug answers
500 and the service keeps serving. If the isolation runtime is unavailable the
service refuses to start: it fails closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import stat
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sandbox import frames
from sandbox.config import SandboxConfig
from sandbox.core import Sandbox
from sandbox.errors import (
    BodyTooLarge,
    InternalError,
    InvalidArguments,
    InvalidRequest,
    RuntimeUnavailable,
    SandboxError,
    SessionExists,
    SessionNotFound,
    Unauthorized,
    UnknownTool,
)
from sandbox.policy import Principal as Who
from sandbox.protocol import (
    GrantQuery,
    SessionCreate,
    ToolCall,
    describe_validation,
    read_limited,
)
from sandbox.runtime.base import Runtime
from sandbox.runtime.cgroups import remove_stale
from sandbox.tools.fetch import Resolver
from sandbox.tools.registry import TOOLS

log = logging.getLogger("gearshift.sandbox")
MAX_BODY = 4 << 20
M = TypeVar("M", bound=BaseModel)


# The HTTP status of each error the service answers; the body carries the class's ``code``.
# Any other exception (the tree's client-only and non-HTTP members included) is a bug: 500.
STATUS: dict[type[SandboxError], int] = {
    InvalidRequest: 400,
    InvalidArguments: 400,
    Unauthorized: 401,
    UnknownTool: 404,
    SessionNotFound: 404,
    SessionExists: 409,
    BodyTooLarge: 413,
    InternalError: 500,
}


def error_answer(exc: Exception, path: str = "") -> tuple[int, dict[str, Any]]:
    """The one translation of an exception into the service's answer: status and body
    (over HTTP and over frames, ``sandbox.frames``)."""
    if isinstance(exc, SandboxError):
        status = next((STATUS[c] for c in type(exc).__mro__ if c in STATUS), None)
        if status is not None:
            return status, _error(exc.code, exc.message)
    log.error("sandbox: unexpected error on %s", path, exc_info=exc)  # answer, log, keep serving
    return 500, _error(InternalError.code, "internal sandbox error; see the service log")


def error_response(exc: Exception, path: str = "") -> Response:
    status, body = error_answer(exc, path)
    return Response(orjson.dumps(body), status, media_type="application/json")


def _error(code: str, message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "sandbox_error", "code": code}}


class _Empty(BaseModel):
    pass


class Handlers:
    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox

    async def parse(self, request: Request, model: type[M]) -> M:
        """The authorized request's body as ``model``."""
        auth = request.headers.get("authorization", "")
        if not hmac.compare_digest(auth.encode(), b"Bearer " + self.sandbox.token):
            raise Unauthorized("missing or wrong sandbox token")
        declared = request.headers.get("content-length")
        raw = await read_limited(request.stream(), MAX_BODY, declared, BodyTooLarge)
        try:
            return model.model_validate_json(raw or b"{}")
        except ValidationError as exc:
            raise InvalidRequest(describe_validation(exc.errors(include_url=False))[0]) from None

    async def tools(self, request: Request) -> Response:
        await self.parse(request, _Empty)
        return _json([t.schema() for t in TOOLS.values()])

    async def approvals(self, request: Request) -> Response:
        """The tools the principal's grant holds for an approval, with their risk class."""
        who = (await self.parse(request, GrantQuery)).principal
        held = self.sandbox.policy.held_for_approval(Who(who.tenant, who.key))
        return _json({"approval": {tool: str(risk) for tool, risk in held.items()}})

    async def create(self, request: Request) -> Response:
        s = self.sandbox.create(await self.parse(request, SessionCreate))
        return _json({"session_id": s.id}, 201)

    async def delete(self, request: Request) -> Response:
        await self.parse(request, _Empty)
        await self.sandbox.remove(request.path_params["sid"])
        return Response(status_code=204)

    async def call(self, request: Request) -> Response:
        body = await self.parse(request, ToolCall)
        result = await self.sandbox.call(request.path_params["name"], body)
        return Response(result.model_dump_json().encode(), media_type="application/json")


def _json(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status, media_type="application/json")


def _route(path: str, fn: Callable[[Request], Awaitable[Response]], method: str) -> Route:
    async def endpoint(request: Request) -> Response:
        try:
            return await fn(request)
        except Exception as exc:  # domain errors and bugs alike: translated in one place
            return error_response(exc, request.url.path)

    return Route(path, endpoint, methods=[method])


def check_root(config: SandboxConfig) -> None:
    """Workspaces live under ``root``; the sandbox uid must be able to reach them."""
    config.root.mkdir(parents=True, exist_ok=True, mode=0o711)
    for d in [config.root, *config.root.parents]:
        st = d.stat()
        if not (st.st_mode & stat.S_IXOTH or st.st_uid == config.uid):
            raise RuntimeUnavailable(
                f"sandbox.root {config.root}: {d} is not traversable by uid {config.uid} "
                "(chmod o+x it, or choose another root)"
            )


async def _frames(sandbox: Sandbox, config: SandboxConfig) -> asyncio.AbstractServer | None:
    """The frames socket beside a Unix socket's HTTP (``sandbox.frames``); without it (a
    TCP service, or a path too long for a socket) clients use HTTP."""
    if config.socket is None:
        return None
    path = frames.frames_path(config.socket)
    try:
        return await frames.serve(sandbox, path, MAX_BODY, lambda exc: error_answer(exc, "frames"))
    except OSError as exc:
        log.warning("sandbox: no frames socket at %s (%s); tool calls use HTTP", path, exc)
        return None


def create_app(
    config: SandboxConfig, runtime: Runtime | None = None, resolve: Resolver | None = None
) -> Starlette:
    sandbox = Sandbox(config, runtime, resolve)  # holds the root (``sandbox.rootlock``)
    try:
        sandbox.runtime.check()  # fail closed: no isolation, no service
        check_root(config)
        remove_stale()
    except BaseException:
        sandbox.lock.release()
        raise
    h = Handlers(sandbox)

    async def health(request: Request) -> Response:
        return Response(b'{"status":"ok"}', media_type="application/json")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async def reaper() -> None:
            while True:
                await asyncio.sleep(min(30.0, config.session_ttl_s))
                await sandbox.expire()

        task = asyncio.create_task(reaper())
        sandbox.start_pool()
        lean = await _frames(sandbox, config)
        try:
            yield
        finally:
            task.cancel()
            if lean is not None:
                lean.close()
                with contextlib.suppress(OSError):
                    frames.frames_path(config.socket or "").unlink()
            await sandbox.close()

    app = Starlette(
        routes=[
            Route("/health", health),
            _route("/v1/tools", h.tools, "GET"),
            _route("/v1/approvals", h.approvals, "POST"),
            _route("/v1/sessions", h.create, "POST"),
            _route("/v1/sessions/{sid}", h.delete, "DELETE"),
            _route("/v1/tools/{name}", h.call, "POST"),
        ],
        lifespan=lifespan,
    )
    app.state.sandbox = sandbox
    return app
