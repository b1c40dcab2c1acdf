"""The outermost ASGI layer: stamps each HTTP request with its start time and id.

It runs before routing, so the overhead the gateway reports covers everything
the process does for a request after the server parsed it. A plain ASGI class,
not Starlette's BaseHTTPMiddleware, which would copy every streamed chunk
through an extra task.
"""

from __future__ import annotations

import os
import re
import time

from starlette.types import ASGIApp, Receive, Scope, Send

_VALID_ID = re.compile(rb"^[A-Za-z0-9._:\-]{1,128}$")


class RequestStamp:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            state = scope.setdefault("state", {})
            state["t0"] = time.perf_counter()
            state["request_id"] = _client_id(scope) or os.urandom(12).hex()
        await self.app(scope, receive, send)


def _client_id(scope: Scope) -> str | None:
    """The client's own X-Request-Id when it is short and plain enough to echo back."""
    for name, value in scope["headers"]:
        if name == b"x-request-id":
            return value.decode() if _VALID_ID.match(value) else None
    return None
