"""The gateway's exception tree and its one mapping to HTTP.

    GatewayError                    (status, OpenAI error type, code)
    ├── InvalidRequest              400 invalid_request_error
    │   └── PayloadTooLarge         413 invalid_request_error
    ├── AuthenticationFailed        401 authentication_error
    ├── PermissionDenied            403 permission_error      (key scope, admin only)
    ├── BudgetExceeded              403 insufficient_quota / budget_exceeded
    ├── RateLimited                 429 rate_limit_error      (a key's or tenant's limit)
    ├── ModelNotFound               404 invalid_request_error / model_not_found
    ├── RouteNotFound               404 invalid_request_error / not_found
    ├── MethodNotAllowed            405 invalid_request_error
    ├── ResourceNotFound            404 invalid_request_error / not_found (session, step)
    ├── Conflict                    409 invalid_request_error / conflict
    ├── StoreUnavailable            503 service_unavailable   (trajectory store off or down)
    ├── SandboxUnavailable          503 service_unavailable   (tool sandbox off or down)
    ├── ShuttingDown                503 service_unavailable   (the gateway is stopping)
    ├── TierSwitchedOff             503 service_unavailable   (a kill switch: tier off)
    ├── McpListFailed               424 external_connector_error (an MCP server's tools; in
    │                                  gateway.pipeline.responses.mcp_tools)
    ├── UpstreamError               502 upstream_error        (a replica answered badly)
    │   ├── UpstreamUnreachable     502 upstream_error        (connect failed or dropped)
    │   ├── UpstreamRateLimited     429 rate_limit_error      (Retry-After passed on)
    │   └── UpstreamTimeout         504 timeout
    └── NoHealthyReplica            503 service_unavailable   (tier down, no fallback)

Every error body has the OpenAI shape ``{"error": {"message", "type", "param",
"code"}}`` so the official ``openai`` client raises the matching exception and
applies its retry rules (it retries 408, 409, 429 and 5xx). The mapping to HTTP responses
is ``gateway.http.errors``; bugs reach its 500 handler, which logs them with the request
id and never leaks a traceback.
"""

from __future__ import annotations

from typing import Any


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


class PermissionDenied(GatewayError):
    status = 403
    type = "permission_error"
    code = "permission_denied"


class BudgetExceeded(GatewayError):
    """A token budget (per day or month) is spent: retrying before ``Retry-After`` is futile."""

    status = 403
    type = "insufficient_quota"
    code = "budget_exceeded"


class RateLimited(GatewayError):
    status = 429
    type = "rate_limit_error"
    code = "rate_limit_exceeded"


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


class SandboxUnavailable(GatewayError):
    status = 503
    type = "service_unavailable"
    code = "sandbox_unavailable"


class ShuttingDown(GatewayError):
    status = 503
    type = "service_unavailable"
    code = "shutting_down"


class TierSwitchedOff(GatewayError):
    status = 503
    type = "service_unavailable"
    code = "tier_switched_off"


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
