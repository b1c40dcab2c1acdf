"""The gateway's exception tree and its one mapping to HTTP.

    GatewayError                    (status, OpenAI error type, code)
    ├── InvalidRequest              400 invalid_request_error
    │   └── PayloadTooLarge         413 invalid_request_error
    ├── AuthenticationFailed        401 authentication_error
    ├── ModelNotFound               404 invalid_request_error / model_not_found
    ├── RouteNotFound               404 invalid_request_error / not_found
    ├── MethodNotAllowed            405 invalid_request_error
    ├── ResourceNotFound            404 invalid_request_error / not_found (session, step)
    ├── Conflict                    409 invalid_request_error / conflict
    ├── StoreUnavailable            503 service_unavailable   (trajectory store off or down)
    ├── UpstreamError               502 upstream_error        (a replica answered badly)
    │   ├── UpstreamUnreachable     502 upstream_error        (connect failed or dropped)
    │   ├── UpstreamRateLimited     429 rate_limit_error      (Retry-After passed on)
    │   └── UpstreamTimeout         504 timeout
    └── NoHealthyReplica            503 service_unavailable   (tier down, no fallback)

Every error body has the OpenAI shape ``{"error": {"message", "type", "param",
"code"}}`` so the official ``openai`` client raises the matching exception and
applies its retry rules (it retries 408, 409, 429 and 5xx). Bugs reach the 500
handler, which logs them with the request id and never leaks a traceback.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

log = logging.getLogger(__name__)


class GatewayError(Exception):
    status: int = 500
    type: str = "server_error"
    code: str | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        headers: dict[str, str] | None = None,
        status: int | None = None,
    ):
        super().__init__(message)
        self.message = message
        self.param = param
        self.headers = headers or {}
        if status is not None:
            self.status = status

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


class InvalidRequest(GatewayError):
    status = 400
    type = "invalid_request_error"


class PayloadTooLarge(InvalidRequest):
    status = 413
    code = "payload_too_large"


class AuthenticationFailed(GatewayError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class ModelNotFound(GatewayError):
    status = 404
    type = "invalid_request_error"
    code = "model_not_found"


class RouteNotFound(GatewayError):
    status = 404
    type = "invalid_request_error"
    code = "not_found"


class MethodNotAllowed(GatewayError):
    status = 405
    type = "invalid_request_error"
    code = "method_not_allowed"


class ResourceNotFound(GatewayError):
    status = 404
    type = "invalid_request_error"
    code = "not_found"


class Conflict(GatewayError):
    status = 409
    type = "invalid_request_error"
    code = "conflict"


class StoreUnavailable(GatewayError):
    status = 503
    type = "service_unavailable"
    code = "store_unavailable"


class ShuttingDown(GatewayError):
    status = 503
    type = "service_unavailable"
    code = "shutting_down"


class UpstreamError(GatewayError):
    status = 502
    type = "upstream_error"
    code = "bad_gateway"


class UpstreamUnreachable(UpstreamError):
    code = "upstream_unreachable"


class UpstreamRateLimited(UpstreamError):
    status = 429
    type = "rate_limit_error"
    code = "rate_limited"


class UpstreamTimeout(UpstreamError):
    status = 504
    type = "timeout"
    code = "upstream_timeout"


class NoHealthyReplica(GatewayError):
    status = 503
    type = "service_unavailable"
    code = "no_healthy_replica"


def error_body(
    message: str, type_: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_response(exc: GatewayError, request_id: str | None = None) -> Response:
    headers = dict(exc.headers)
    if request_id:
        headers["x-request-id"] = request_id
    return Response(orjson.dumps(exc.body()), exc.status, headers, media_type="application/json")


def exception_response(exc: Exception, request_id: str | None) -> Response:
    """Any exception as an OpenAI error; anything not a GatewayError is a bug and is logged."""
    if isinstance(exc, GatewayError):
        return error_response(exc, request_id)
    log.error("unhandled error in request %s", request_id, exc_info=exc)
    return error_response(
        GatewayError(f"internal error; quote request id {request_id} when reporting it"), request_id
    )


def _request_id(request: Request) -> str | None:
    return getattr(request.state, "request_id", None)


def _describe_validation(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "invalid request", None
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    param = ".".join(loc) or None
    where = f" at '{param}'" if param else ""
    return f"{first.get('msg', 'invalid value')}{where}", param


def register_exception_handlers(app: FastAPI) -> None:
    """Route FastAPI's exceptions through this module (the completion endpoints,
    served outside FastAPI's router, call ``exception_response`` directly)."""

    async def on_gateway_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, GatewayError)
        return error_response(exc, _request_id(request))

    async def on_validation(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        message, param = _describe_validation(exc)
        return error_response(InvalidRequest(message, param=param), _request_id(request))

    async def on_http(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        mapped: GatewayError
        if exc.status_code == 404:
            mapped = RouteNotFound(
                f"no route {request.method} {request.url.path}; see GET /v1/models and the README"
            )
        elif exc.status_code == 405:
            mapped = MethodNotAllowed(
                f"method {request.method} is not allowed on {request.url.path}"
            )
        else:
            mapped = InvalidRequest(str(exc.detail), status=exc.status_code)
        return error_response(mapped, _request_id(request))

    async def on_bug(request: Request, exc: Exception) -> Response:
        return exception_response(exc, _request_id(request))

    app.add_exception_handler(GatewayError, on_gateway_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(Exception, on_bug)
