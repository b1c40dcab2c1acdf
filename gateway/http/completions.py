"""The first stages of a completion request: authenticate, read, validate; then the pipeline.

The body is validated against the endpoint's wire model (a 400 names the parameter) but
forwarded as the client's own JSON object: unknown parameters reach vLLM unchanged and
are logged once per name.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from gateway.errors import GatewayError
from gateway.http.body import read_json_raw
from gateway.http.protocol import REQUESTS, note_unknown_fields
from gateway.http.session_validation import SessionValidator
from gateway.pipeline.handler import CompletionPipeline
from gateway.pipeline.request import ParsedRequest, RequestIdentity
from gateway.pipeline.services import Services
from router import Endpoint


class Completions:
    def __init__(self, services: Services) -> None:
        self.services = services
        self.pipeline = CompletionPipeline(services)
        self._unknown_fields: set[str] = set()  # already logged as forwarded unknown
        self.validator = SessionValidator()  # a named session's history is validated once

    async def __call__(
        self, scope: Scope, receive: Receive, send: Send, endpoint: Endpoint, request_id: str,
        t0: float,
    ) -> None:  # fmt: skip
        try:
            parsed = await self.parse(Request(scope, receive), endpoint, request_id, t0)
        except GatewayError as exc:  # refused before any tier was chosen
            self.services.metrics.requests.labels(endpoint, "none", str(exc.status)).inc()
            raise
        await self.pipeline(parsed, scope, receive, send)

    async def parse(
        self, request: Request, endpoint: Endpoint, request_id: str, t0: float
    ) -> ParsedRequest:
        """Authenticate (before reading the body), read, validate."""
        headers = request.headers
        principal = self.services.auth.authenticate(headers.get("authorization"))
        raw, body = await read_json_raw(request, self.services.settings.limits.max_body_bytes)
        session_id = headers.get("x-session-id") or body.get("user")
        named = (principal.tenant, session_id) if isinstance(session_id, str) else None
        encoded = self.validator.validate(body, REQUESTS[endpoint], named, len(raw))
        note_unknown_fields(endpoint, body, self._unknown_fields)
        who = RequestIdentity(
            request_id, t0, endpoint, body["model"], principal.tenant, principal.key_name,
            session_id, headers.get("x-gearshift-task-id"), headers.get("x-gearshift-group-id"),
        )  # fmt: skip
        return ParsedRequest(who, body, raw, encoded)
