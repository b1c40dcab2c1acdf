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
import os
import re
import time

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.errors import MethodNotAllowed, ShuttingDown, exception_response
from gateway.serving import Gateway

_VALID_ID = re.compile(rb"^[A-Za-z0-9._:\-]{1,128}$")
COMPLETION_PATHS = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}


class GatewayEntry:
    def __init__(self, app: ASGIApp, gateway: Gateway) -> None:
        self.app = app
        self.gateway = gateway

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        state["t0"] = time.perf_counter()
        request_id = state["request_id"] = _client_id(scope) or os.urandom(12).hex()
        endpoint = COMPLETION_PATHS.get(scope["path"])
        if endpoint is None:
            await self.app(scope, receive, send)
            return
        try:
            if scope["method"] != "POST":
                raise MethodNotAllowed(f"use POST for {scope['path']}, not {scope['method']}")
            response = await self.gateway.handle(Request(scope, receive), endpoint)
        except Exception as exc:  # mapped to an OpenAI error; bugs are logged there
            response = exception_response(exc, request_id)
        except asyncio.CancelledError:
            # uvicorn cancels what still runs when its graceful shutdown runs out (`serve`
            # drains 10 s); unanswered, the client would get its bare "Internal Server Error"
            stopping = ShuttingDown(
                "the gateway shut down before this request finished; nothing was returned, "
                "so it is safe to send it again (to another instance, or to this one once "
                "it is back)",
                headers={"retry-after": "1"},
            )
            await exception_response(stopping, request_id)(scope, receive, send)
            raise
        await response(scope, receive, send)


def _client_id(scope: Scope) -> str | None:
    """The client's own X-Request-Id when it is short and plain enough to echo back."""
    for name, value in scope["headers"]:
        if name == b"x-request-id":
            return value.decode() if _VALID_ID.match(value) else None
    return None
