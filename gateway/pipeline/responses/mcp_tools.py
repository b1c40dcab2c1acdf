"""``{"type": "mcp", ...}`` tools: the request's shape, the operator's allowlist, the listing.

    {"type": "mcp", "server_label": "docs", "server_url": "https://.../mcp",
     "allowed_tools": ["search"] | {"tool_names": [...], "read_only": true},
     "require_approval": "always" | "never" | {"always": {...}, "never": {...}},
     "headers": {"Authorization": "Bearer ..."}, "server_description": "..."}

A server is used only when ``responses.mcp.servers`` lists it for the caller's tenant
(deny by default): by its URL, or — for a stdio server, which only the operator can
configure — by its label alone (no ``server_url``). An unlisted URL is a 400 naming it.

The server's tools are listed once per ``previous_response_id`` chain: the first response
that offers the server gets an ``mcp_list_tools`` output item, later ones reuse the
chain's. The model sees each allowed tool as a function tool of the same name. A call of
a tool that needs approval becomes an ``mcp_approval_request`` (``gateway.pipeline.
responses.approvals``); ``require_approval`` defaults to ``"always"``, as OpenAI's does.
``headers`` are sent to the server and never echoed or stored.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.config import McpSettings
from gateway.errors import GatewayError, InvalidRequest
from gateway.pipeline.responses import mcp_client
from gateway.pipeline.responses.items import new_id
from gateway.pipeline.responses.mcp_client import McpFailed, Target

KEYS = frozenset(
    {"type", "server_label", "server_url", "allowed_tools", "require_approval", "headers",
     "server_description"}
)  # fmt: skip
NOT_YET_KEYS = frozenset({"connector_id", "authorization", "tunnel_id", "defer_loading"})
LABEL = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
FILTER_KEYS = frozenset({"tool_names", "read_only"})
KIND = "mcp:"  # hosted kinds of MCP tools: "mcp:<label>", "mcp?:<label>" when approval is needed
APPROVAL_KIND = "mcp?:"
SANDBOX_LABEL = "sandbox"  # the mcp_call items of the sandbox's tools (hosted.SERVER_LABEL)


class McpListFailed(GatewayError):
    """An MCP server's tools could not be listed: the request cannot be served as asked."""

    status = 424
    type = "external_connector_error"
    code = "mcp_list_tools_failed"


@dataclass(frozen=True, slots=True)
class Filter:
    names: frozenset[str] | None = None
    read_only: bool | None = None
    every: bool = False

    def matches(self, tool: dict[str, Any]) -> bool:
        if self.every or (self.names is not None and tool["name"] in self.names):
            return True
        hint = (tool.get("annotations") or {}).get("readOnlyHint")
        return self.read_only is not None and bool(hint) == self.read_only


@dataclass(frozen=True, slots=True)
class McpTool:
    label: str
    url: str | None
    allowed: Filter | None  # None: every tool of the server
    always: Filter | None  # require_approval
    never: Filter | None
    headers: dict[str, str]
    where: str

    def needs_approval(self, tool: dict[str, Any]) -> bool:
        """Named in ``never``: no; in ``always``: yes; neither: yes unless only ``always``
        filters were given (then the others are the exceptions to it)."""
        if self.never is not None and self.never.matches(tool):
            return False
        if self.always is not None:
            return self.always.matches(tool) or self.never is not None
        return True

    def allows(self, tool: dict[str, Any]) -> bool:
        return self.allowed is None or self.allowed.matches(tool)


def kind(label: str, approval: bool) -> str:
    return (APPROVAL_KIND if approval else KIND) + label


def parse_kind(value: str) -> tuple[str, bool] | None:
    """(server label, needs approval) of an MCP tool's hosted kind; None: not MCP."""
    for prefix, approval in ((APPROVAL_KIND, True), (KIND, False)):
        if value.startswith(prefix):
            return value[len(prefix) :], approval
    return None


def parse(tool: dict[str, Any], where: str) -> tuple[McpTool, dict[str, Any]]:
    """An ``mcp`` tool of ``tools`` (every field checked) and how the response echoes it."""
    for key in sorted(tool.keys() - KEYS):
        what = "is not supported by this gateway" if key in NOT_YET_KEYS else "is not a field"
        raise InvalidRequest(
            f"{where}.{key} {what} of an mcp tool (docs/responses.md)", param=f"{where}.{key}"
        )
    label = tool.get("server_label")
    if not isinstance(label, str) or not LABEL.match(label):
        raise InvalidRequest(
            f"{where}.server_label must be 1 to 64 letters, digits, '_' or '-' (got {label!r})",
            param=f"{where}.server_label",
        )
    if label == SANDBOX_LABEL:
        raise InvalidRequest(
            f"{where}.server_label {label!r} is reserved for the sandbox's hosted tools",
            param=f"{where}.server_label",
        )
    url = tool.get("server_url")
    if url is not None and (
        not isinstance(url, str) or not url.startswith(("http://", "https://"))
    ):
        raise InvalidRequest(
            f"{where}.server_url must be an http:// or https:// URL (got {url!r})",
            param=f"{where}.server_url",
        )
    headers = tool.get("headers") or {}
    if not isinstance(headers, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
    ):
        raise InvalidRequest(
            f"{where}.headers must map header names to strings", param=f"{where}.headers"
        )
    description = tool.get("server_description")
    if description is not None and not isinstance(description, str):
        raise InvalidRequest(
            f"{where}.server_description must be a string", param=f"{where}.server_description"
        )
    allowed = _allowed(tool.get("allowed_tools"), f"{where}.allowed_tools")
    always, never = _approval(tool.get("require_approval"), f"{where}.require_approval")
    parsed = McpTool(
        label, url.rstrip("/") if url else None, allowed, always, never, headers, where
    )
    echo = {
        "type": "mcp", "server_label": label, "server_url": url,
        "allowed_tools": tool.get("allowed_tools"),
        "require_approval": tool.get("require_approval", "always"), "headers": None,
        "server_description": description,
    }  # fmt: skip
    return parsed, echo


def _names(value: Any, where: str) -> frozenset[str]:
    if not isinstance(value, list) or not all(isinstance(n, str) and n for n in value):
        raise InvalidRequest(f"{where} must be a list of tool names", param=where)
    return frozenset(value)


def _filter(value: Any, where: str) -> Filter:
    if not isinstance(value, dict):
        raise InvalidRequest(f"{where} must be an object with tool_names", param=where)
    for key in sorted(value.keys() - FILTER_KEYS):
        raise InvalidRequest(
            f"{where}.{key} is not a field of a tool filter", param=f"{where}.{key}"
        )
    read_only = value.get("read_only")
    if read_only is not None and not isinstance(read_only, bool):
        raise InvalidRequest(f"{where}.read_only must be a boolean", param=f"{where}.read_only")
    names = value.get("tool_names")
    return Filter(None if names is None else _names(names, f"{where}.tool_names"), read_only)


def _allowed(value: Any, where: str) -> Filter | None:
    if value is None:
        return None
    if isinstance(value, list):
        return Filter(_names(value, where))
    return _filter(value, where)


def _approval(value: Any, where: str) -> tuple[Filter | None, Filter | None]:
    """(always, never) filters; ``"always"``: every tool, ``"never"``: none."""
    if value is None or value == "always":
        return None, None
    if value == "never":
        return None, Filter(every=True)
    if not isinstance(value, dict):
        raise InvalidRequest(
            f"{where} must be 'always', 'never' or an object with always/never filters "
            f"(got {value!r})",
            param=where,
        )
    for key in sorted(value.keys() - {"always", "never"}):
        raise InvalidRequest(
            f"{where}.{key} is not a field of require_approval", param=f"{where}.{key}"
        )
    always = value.get("always")
    never = value.get("never")
    return (
        None if always is None else _filter(always, f"{where}.always"),
        None if never is None else _filter(never, f"{where}.never"),
    )


# -- the allowlist ---------------------------------------------------------------------


def target(settings: McpSettings, tenant: str, tool: McpTool) -> Target:
    """Where the operator lets ``tenant`` reach ``tool``'s server; a 400 when nowhere."""
    for server in settings.servers:
        if tenant not in server.tenants and "*" not in server.tenants:
            continue
        by_url = tool.url is not None and server.url == tool.url
        by_label = tool.url is None and server.label == tool.label
        if by_url or by_label:
            return Target(
                tool.label, server.url, tuple(server.command or ()), dict(server.env),
                tool.headers,
            )  # fmt: skip
    if tool.url is None:
        raise InvalidRequest(
            f"{tool.where}: no MCP server labelled {tool.label!r} is configured for this "
            "tenant; give its server_url, or ask the operator to add it to responses.mcp.servers",
            param=f"{tool.where}.server_url",
        )
    raise InvalidRequest(
        f"{tool.where}.server_url {tool.url!r} is not an MCP server this tenant may use; the "
        "operator allows servers in responses.mcp.servers (docs/responses.md)",
        param=f"{tool.where}.server_url",
    )


# -- listing ---------------------------------------------------------------------------


def listed(history: Iterable[dict[str, Any]], label: str) -> dict[str, Any] | None:
    """The chain's latest successful ``mcp_list_tools`` item for the server ``label``."""
    found = None
    for item in history:
        if item["type"] == "mcp_list_tools" and item["server_label"] == label:
            found = item if not item.get("error") else found
    return found


async def list_item(target: Target, timeout_s: float, where: str) -> dict[str, Any]:
    """List the server's tools now, as an ``mcp_list_tools`` item; 424 when it fails."""
    try:
        tools = await mcp_client.list_tools(target, timeout_s)
    except McpFailed as exc:
        raise McpListFailed(
            f"{where}: error retrieving tool list from MCP server {target.label!r}: {exc.message}",
            param=f"{where}.server_url",
        ) from None
    return {"id": new_id("mcpl"), "type": "mcp_list_tools", "server_label": target.label,
            "tools": tools, "error": None}  # fmt: skip


def offered(tool: McpTool, item: dict[str, Any]) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """The server's allowed tools as hosted kinds by name and chat function schemas."""
    kinds: dict[str, str] = {}
    schemas: list[dict[str, Any]] = []
    for t in item["tools"]:
        if not tool.allows(t):
            continue
        kinds[t["name"]] = kind(tool.label, tool.needs_approval(t))
        function = {"name": t["name"], "parameters": t.get("input_schema") or {"type": "object"}}
        if t.get("description"):
            function["description"] = t["description"]
        schemas.append({"type": "function", "function": function})
    return kinds, schemas


def by_label(tools: Sequence[McpTool]) -> dict[str, McpTool]:
    out: dict[str, McpTool] = {}
    for t in tools:
        if t.label in out:
            raise InvalidRequest(
                f"two mcp tools have server_label {t.label!r}", param=f"{t.where}.server_label"
            )
        out[t.label] = t
    return out
