"""The gateway's client for the sandbox service (loopback TCP or a Unix socket).

Every failure it reports is a ``SandboxError`` (``sandbox.errors``): the class named by the
answered ``code`` through the fixed table ``BY_CODE`` (the base class for a code it does not
know), or ``SandboxUnreachable`` when nothing answered. Each carries the answered ``status``.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson

from sandbox.errors import (
    BodyTooLarge,
    InternalError,
    InvalidArguments,
    InvalidRequest,
    SandboxError,
    SandboxUnreachable,
    SessionExists,
    SessionNotFound,
    Unauthorized,
    UnknownTool,
)
from sandbox.protocol import FaultPlan, ToolResult

__all__ = [
    "BY_CODE", "BodyTooLarge", "InternalError", "InvalidArguments", "InvalidRequest",
    "SandboxClient", "SandboxError", "SandboxUnreachable", "SessionExists", "SessionNotFound",
    "Unauthorized", "UnknownTool",
]  # fmt: skip

# The errors the service answers, by code. Fixed here: a remote answer only ever picks one.
BY_CODE: dict[str, type[SandboxError]] = {
    cls.code: cls
    for cls in (
        InvalidRequest, InvalidArguments, Unauthorized, UnknownTool, SessionNotFound,
        SessionExists, BodyTooLarge, InternalError,
    )
}  # fmt: skip
UNREACHABLE_STATUS = 502  # nothing answered: reported as a bad gateway would be


def failure(status: int, raw: bytes) -> SandboxError:
    """The error for an answer with ``status`` >= 400 and body ``raw``."""
    try:
        err = orjson.loads(raw)["error"]
        code, message = err.get("code"), err.get("message")
    except (orjson.JSONDecodeError, TypeError, KeyError, AttributeError):
        code = message = None
    if not isinstance(message, str):
        message = raw[:200].decode(errors="replace")
    cls = BY_CODE.get(code, SandboxError) if isinstance(code, str) else SandboxError
    return cls(f"sandbox answered {status} {code or ''}: {message}", status=status)


class SandboxClient:
    def __init__(
        self, url: str, token: str, socket: str | None = None, timeout_s: float = 3600
    ) -> None:
        connector = aiohttp.UnixConnector(path=socket) if socket else None
        self._base = "http://sandbox" if socket else url.rstrip("/")
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=timeout_s),
            headers={"authorization": f"Bearer {token}"},
        )  # fmt: skip

    async def close(self) -> None:
        await self._session.close()

    async def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = orjson.dumps(body) if body is not None else None
        try:
            async with self._session.request(method, self._base + path, data=data) as resp:
                raw = await resp.read()
                status = resp.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise SandboxUnreachable(
                f"the sandbox service is unreachable: {exc!r}", status=UNREACHABLE_STATUS
            ) from exc
        if status >= 400:
            raise failure(status, raw)
        return orjson.loads(raw) if raw else None

    async def tools(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = await self._request("GET", "/v1/tools")
        return result

    async def approvals(self, tenant: str, key: str) -> dict[str, str]:
        """The tools this principal's grant holds for an approval, with their risk class."""
        body = {"principal": {"tenant": tenant, "key": key}}
        result: dict[str, str] = (await self._request("POST", "/v1/approvals", body))["approval"]
        return result

    async def create_session(
        self, tenant: str, key: str, session_id: str | None = None, faults: FaultPlan | None = None
    ) -> str:
        body: dict[str, Any] = {
            "principal": {"tenant": tenant, "key": key},
            "session_id": session_id,
        }
        if faults is not None:
            body["faults"] = faults.model_dump()
        return str((await self._request("POST", "/v1/sessions", body))["session_id"])

    async def delete_session(self, session_id: str) -> None:
        await self._request("DELETE", f"/v1/sessions/{session_id}", {})

    async def call(
        self,
        tenant: str,
        key: str,
        session_id: str,
        tool: str,
        arguments: dict[str, Any],
        approved: bool = False,
        create_session: bool = False,
    ) -> ToolResult:
        """Run a tool; ``create_session``: a session that does not exist yet is created
        for ``tenant`` by this call (no 404 and second round trip)."""
        body = {"principal": {"tenant": tenant, "key": key}, "session_id": session_id,
                "arguments": arguments, "approved": approved,
                "create_session": create_session}  # fmt: skip
        return ToolResult.model_validate(await self._request("POST", f"/v1/tools/{tool}", body))
