"""The gateway's client for the sandbox service (loopback TCP or a Unix socket). On a Unix
socket, tool calls go as frames on persistent connections (``sandbox.frames``) when the
service offers them, else over HTTP like the rest.

Every failure it reports is a ``SandboxError`` (``sandbox.errors``): the class named by the
answered ``code`` through the fixed table ``BY_CODE`` (the base class for a code it does not
know), or ``SandboxUnreachable`` when nothing answered. Each carries the answered ``status``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson

from sandbox import frames
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
        answer = orjson.loads(raw)
    except orjson.JSONDecodeError:
        answer = None
    return answered(status, answer, raw[:200].decode(errors="replace"))


def answered(status: int, answer: Any, fallback: str) -> SandboxError:
    """The error for an answer with ``status`` >= 400 and (parsed) body ``answer``;
    ``fallback`` is the message when the body has none."""
    try:
        err = answer["error"]
        code, message = err.get("code"), err.get("message")
    except (TypeError, KeyError, AttributeError):
        code = message = None
    if not isinstance(message, str):
        message = fallback
    cls = BY_CODE.get(code, SandboxError) if isinstance(code, str) else SandboxError
    return cls(f"sandbox answered {status} {code or ''}: {message}", status=status)


class Frames:
    """Persistent connections to the service's frames socket, one per call in flight."""

    def __init__(self, socket: str, token: str) -> None:
        self.path, self.hello = str(frames.frames_path(socket)), frames.frame({"token": token})
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """An idle connection, or a new one; None when the service has no frames socket
        (or not for this user): the caller goes by HTTP."""
        if self.idle:
            return self.idle.pop()
        try:
            reader, writer = await asyncio.open_unix_connection(self.path)
        except (FileNotFoundError, ConnectionRefusedError, PermissionError):
            return None
        writer.write(self.hello)
        return reader, writer

    async def call(
        self, conn: tuple[asyncio.StreamReader, asyncio.StreamWriter], request: dict[str, Any]
    ) -> Any:
        """The service's answer on ``conn``, which goes back to the idle ones after it
        (closed, if anything went wrong or the call was cancelled)."""
        reader, writer = conn
        try:
            writer.write(frames.frame(request))
            answer = orjson.loads(await frames.read_frame(reader, 1 << 30))
        except BaseException:
            writer.close()
            raise
        if isinstance(answer, dict) and answer.get("status") in frames.CLOSED_AFTER:
            writer.close()
        else:
            self.idle.append(conn)
        return answer

    def close(self) -> None:
        for _, writer in self.idle:
            writer.close()
        self.idle.clear()


class SandboxClient:
    def __init__(
        self, url: str, token: str, socket: str | None = None, timeout_s: float = 3600
    ) -> None:
        self._frames = Frames(socket, token) if socket else None
        self._timeout_s = timeout_s
        connector = aiohttp.UnixConnector(path=socket) if socket else None
        self._base = "http://sandbox" if socket else url.rstrip("/")
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=timeout_s),
            headers={"authorization": f"Bearer {token}"},
        )  # fmt: skip

    async def close(self) -> None:
        if self._frames is not None:
            self._frames.close()
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
        conn = await self._frames.connect() if self._frames is not None else None
        if conn is None:
            return ToolResult.model_validate(await self._request("POST", f"/v1/tools/{tool}", body))
        assert self._frames is not None
        try:
            async with asyncio.timeout(self._timeout_s):
                answer = await self._frames.call(conn, {"tool": tool, "call": body})
            status = answer["status"]
        except (OSError, asyncio.IncompleteReadError, TimeoutError, frames.FrameTooLarge,
                orjson.JSONDecodeError, TypeError, KeyError) as exc:  # fmt: skip
            raise SandboxUnreachable(
                f"the sandbox service is unreachable: {exc!r}", status=UNREACHABLE_STATUS
            ) from exc
        if status != 200:
            raise answered(status, answer, f"status {status}")
        return ToolResult.model_validate(answer["result"])
