"""The outermost ASGI layer: request stamping, and the completion endpoints' fast path.

Every HTTP request gets its start time and id here, before anything else runs,
so the overhead the gateway reports covers all the process does for it.

``POST /v1/chat/completions`` and ``/v1/completions`` are served from here
directly rather than through FastAPI's router: its exception, exit-stack and
dependency layers cost about as much CPU as the gateway's own work on these
two hot endpoints (measured in docs/decisions/completions-fast-path.md).
Everything else — models, health, readiness, metrics — is a FastAPI route.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.errors import MethodNotAllowed, ShuttingDown
from gateway.http.completions import Completions
from gateway.http.errors import exception_response
from router import Endpoint

log = logging.getLogger(__name__)
_VALID_ID = re.compile(rb"^[A-Za-z0-9._:\-]{1,128}$")
COMPLETION_PATHS: dict[str, Endpoint] = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
}


class GatewayEntry:
    def __init__(self, app: ASGIApp, completions: Completions) -> None:
        self.app = app
        self.completions = completions

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        t0 = state["t0"] = time.perf_counter()
        request_id = state["request_id"] = _client_id(scope) or os.urandom(12).hex()
        endpoint = COMPLETION_PATHS.get(scope["path"])
        if endpoint is None:
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = True
            await send(message)

        try:
            if scope["method"] != "POST":
                raise MethodNotAllowed(f"use POST for {scope['path']}, not {scope['method']}")
            await self.completions(scope, receive, tracked, endpoint, request_id, t0)
        except Exception as exc:  # mapped to an OpenAI error; bugs are logged there
            if started:  # too late to answer: the client has part of a response
                log.error("request %s failed after its answer began", request_id, exc_info=exc)
                return
            await exception_response(exc, request_id)(scope, receive, send)
        except asyncio.CancelledError:
            # uvicorn cancels what still runs when its graceful shutdown runs out (`serve`
            # drains 10 s); unanswered, the client would get its bare "Internal Server Error"
            if not started:
                stopping = ShuttingDown(
                    "the gateway shut down before this request finished; nothing was returned, "
                    "so it is safe to send it again (to another instance, or to this one once "
                    "it is back)",
                    headers={"retry-after": "1"},
                )
                await exception_response(stopping, request_id)(scope, receive, send)
            raise


def _client_id(scope: Scope) -> str | None:
    """The client's own X-Request-Id when it is short and plain enough to echo back."""
    for name, value in scope["headers"]:
        if name == b"x-request-id":
            return value.decode() if _VALID_ID.match(value) else None
    return None
