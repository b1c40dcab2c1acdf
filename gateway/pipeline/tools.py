"""Running a hosted tool for a caller: the sandbox session of its trajectory, created on
first use, and the one place the sandbox client's errors become the gateway's.

    sandbox error                          gateway error
    SessionNotFound, UnknownTool        →  ResourceNotFound      404
    InvalidRequest (and arguments)      →  InvalidRequest        400
    SessionExists                       →  Conflict              409
    BodyTooLarge                        →  PayloadTooLarge       413
    SandboxUnreachable                  →  SandboxUnavailable    503  (the sandbox is down)
    Unauthorized, InternalError, other  →  UpstreamError         502  (not the caller's fault)
"""

from __future__ import annotations

from typing import Any

from gateway.errors import (
    Conflict,
    GatewayError,
    InvalidRequest,
    PayloadTooLarge,
    ResourceNotFound,
    SandboxUnavailable,
    UpstreamError,
)
from sandbox.client import (
    BodyTooLarge,
    SandboxClient,
    SandboxError,
    SandboxUnreachable,
    SessionExists,
    SessionNotFound,
    UnknownTool,
)
from sandbox.client import InvalidRequest as SandboxInvalidRequest
from sandbox.protocol import ToolResult, scoped_id

TRANSLATION: tuple[tuple[type[SandboxError], type[GatewayError]], ...] = (
    (SessionNotFound, ResourceNotFound),
    (UnknownTool, ResourceNotFound),
    (SandboxInvalidRequest, InvalidRequest),
    (SessionExists, Conflict),
    (BodyTooLarge, PayloadTooLarge),
    (SandboxUnreachable, SandboxUnavailable),
)


def translate(exc: SandboxError) -> GatewayError:
    """The gateway's error for a failure the sandbox client reported."""
    for theirs, ours in TRANSLATION:
        if isinstance(exc, theirs):
            return ours(f"tool sandbox: {exc.message}")
    return UpstreamError(f"tool sandbox: {exc.message}")


def _running(sandbox: SandboxClient | None) -> SandboxClient:
    if sandbox is None:
        raise SandboxUnavailable("the tool sandbox is not running (see the gateway's log)")
    return sandbox


async def list_tools(sandbox: SandboxClient | None) -> list[dict[str, Any]]:
    """The hosted tools' JSON schemas."""
    try:
        return await _running(sandbox).tools()
    except SandboxError as exc:
        raise translate(exc) from None


async def held_for_approval(sandbox: SandboxClient | None, tenant: str, key: str) -> set[str]:
    """The tools the caller's grant holds for an approval (a risk class its ``approval``
    names), as the sandbox declares them."""
    try:
        return set(await _running(sandbox).approvals(tenant, key))
    except SandboxError as exc:
        raise translate(exc) from None


async def run_tool(
    sandbox: SandboxClient | None,
    tenant: str,
    key: str,
    session: str,
    tool: str,
    arguments: dict[str, Any],
    approved: bool = False,
) -> ToolResult:
    """Run ``tool`` in the workspace of ``tenant``'s ``session`` (one per trajectory); the
    sandbox creates the session on its first call, in the same round trip."""
    sandbox = _running(sandbox)
    sid = scoped_id(tenant, session)
    try:
        return await sandbox.call(tenant, key, sid, tool, arguments, approved, create_session=True)
    except SandboxError as exc:
        raise translate(exc) from None
