"""The gateway as an MCP client: list a server's tools, call one, through the official ``mcp``
SDK (streamable HTTP, or stdio for servers the operator configures).

Each operation opens its own session and closes it (the SDK's ``Client``): a response's
calls are few and seconds apart, and no connection outlives the request that needed it.
Every operation has one deadline (``responses.mcp.timeout_s``), connect included. Whatever
goes wrong — refused connection, HTTP error, protocol error, timeout — is ``McpFailed``
with a one-line message; a tool that answers ``isError`` is not a failure of the server
but an error result (``Called.ok`` false).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import orjson
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


@dataclass(frozen=True, slots=True)
class Target:
    """Where one MCP server is reached: a URL (streamable HTTP) or a command (stdio)."""

    label: str
    url: str | None = None
    command: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)  # the request's, sent with each call


@dataclass(frozen=True, slots=True)
class Called:
    text: str  # what the model is told
    ok: bool


class McpFailed(Exception):
    """The server could not be reached or did not answer in time, or answered wrongly."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _leaf(exc: BaseException) -> BaseException:
    """The first real error inside the SDK's exception groups (its task groups wrap them)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def describe(exc: BaseException) -> str:
    leaf = _leaf(exc)
    text = str(leaf).strip().splitlines()[0] if str(leaf).strip() else ""
    return f"{type(leaf).__name__}: {text}" if text else type(leaf).__name__


@asynccontextmanager
async def _session(target: Target, timeout_s: float) -> AsyncIterator[Client]:
    if target.url is not None:
        http = create_mcp_http_client(headers=dict(target.headers))
        async with http:
            transport = streamable_http_client(target.url, http_client=http)
            async with Client(transport, read_timeout_seconds=timeout_s, cache=None) as client:
                yield client
        return
    command, *args = target.command
    params = StdioServerParameters(command=command, args=args, env=dict(target.env) or None)
    async with Client(params, read_timeout_seconds=timeout_s, cache=None) as client:
        yield client


async def list_tools(target: Target, timeout_s: float) -> list[dict[str, Any]]:
    """The server's tools as ``mcp_list_tools`` lists them (name, description,
    input_schema, annotations), every page."""
    try:
        async with asyncio.timeout(timeout_s), _session(target, timeout_s) as client:
            tools: list[dict[str, Any]] = []
            cursor: str | None = None
            while True:
                page = await client.list_tools(cursor=cursor)
                tools.extend(_tool(t) for t in page.tools)
                cursor = page.next_cursor
                if not cursor:
                    return tools
    except TimeoutError:
        raise McpFailed(f"no answer within {timeout_s:g}s") from None
    except Exception as exc:  # the SDK's and the transport's errors: all of them mean "down"
        raise McpFailed(describe(exc)) from None


def _tool(tool: Any) -> dict[str, Any]:
    annotations = (
        tool.annotations.model_dump(by_alias=True, exclude_none=True) if tool.annotations else None
    )
    return {
        "name": tool.name, "description": tool.description,
        "input_schema": tool.input_schema, "annotations": annotations,
    }  # fmt: skip


async def call_tool(
    target: Target, name: str, arguments: dict[str, Any], timeout_s: float
) -> Called:
    """One tool call; a server that fails is ``McpFailed``, a tool that fails an error result."""
    try:
        async with asyncio.timeout(timeout_s), _session(target, timeout_s) as client:
            result = await client.call_tool(name, arguments)
    except TimeoutError:
        raise McpFailed(f"no answer within {timeout_s:g}s") from None
    except Exception as exc:
        raise McpFailed(describe(exc)) from None
    return Called(_text(result), not result.is_error)


def _text(result: Any) -> str:
    """The text parts of a result, joined; other parts (images, resources) as JSON; the
    structured content when there is nothing else."""
    parts: list[str] = []
    for part in result.content or ():
        if getattr(part, "type", None) == "text":
            parts.append(part.text)
        else:
            parts.append(orjson.dumps(part.model_dump(mode="json", exclude_none=True)).decode())
    if not parts and result.structured_content is not None:
        return orjson.dumps(result.structured_content).decode()
    return "\n".join(parts)
