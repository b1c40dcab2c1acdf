"""A real MCP server for tests: the ``mcp`` SDK's MCPServer over streamable HTTP."""

from __future__ import annotations

import asyncio
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp_types import ToolAnnotations


def demo_server() -> Any:
    """``add`` (read-only), ``shout`` and ``boom`` (a tool that always fails); its ASGI app."""
    server = MCPServer("demo")

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @server.tool()
    def shout(text: str) -> str:
        """Upper-case a text."""
        return text.upper()

    @server.tool()
    def boom(reason: str) -> str:
        """Always fails."""
        raise ValueError(f"kaboom: {reason}")

    return server.streamable_http_app()


def hanging_app() -> Any:
    """An HTTP endpoint that accepts MCP requests and never answers them."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        await asyncio.sleep(3)  # longer than the tests' timeout; short enough to stop the server

    return app


if __name__ == "__main__":  # the same tools over stdio: python -m tests.support.mcp_server
    stdio = MCPServer("demo-stdio")

    @stdio.tool()
    def shout(text: str) -> str:
        """Upper-case a text."""
        return text.upper()

    stdio.run("stdio")
