"""The one mapping from exceptions to HTTP responses in the OpenAI error shape.

The completion endpoints, served by ``gateway.http.entry`` outside FastAPI's router,
call ``exception_response``; every other route reaches it through the handlers that
``register_exception_handlers`` installs. Anything that is not a ``GatewayError`` is a
bug: it is logged with the request id and answered 500 without a traceback.
"""

from __future__ import annotations

import logging

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from gateway.errors import GatewayError, InvalidRequest, MethodNotAllowed, RouteNotFound
from sandbox.protocol import describe_validation

log = logging.getLogger(__name__)


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


def register_exception_handlers(app: FastAPI) -> None:
    """Route FastAPI's exceptions through this module."""

    async def on_gateway_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, GatewayError)
        return error_response(exc, _request_id(request))

    async def on_validation(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        message, param = describe_validation(list(exc.errors()), skip=("body",))
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
