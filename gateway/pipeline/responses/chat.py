"""A Responses request as the chat request the completion pipeline serves.

``tools`` (client-owned function tools and hosted tools: ``hosted``), ``tool_choice`` and
``text.format`` are checked here, each problem a 400 naming the field, and translated once:
what the response object echoes (``Echo``) and what vLLM gets (the chat body of each step).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.errors import InvalidRequest
from gateway.pipeline.responses import hosted, mcp_tools
from gateway.pipeline.responses.items import CODE_TOOL
from gateway.pipeline.responses.protocol import ResponsesRequest, not_yet

FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
FUNCTION_KEYS = frozenset({"type", "name", "description", "parameters", "strict"})
# OpenAI function-tool fields that change nothing for a client-owned tool
FUNCTION_IGNORED = frozenset({"defer_loading", "allowed_callers", "async", "output_schema"})
CHOICES = ("none", "auto", "required")


@dataclass(frozen=True, slots=True)
class Echo:
    """How the response object states the request's tools, tool choice and text format."""

    tools: list[dict[str, Any]]  # as the response states them (function and hosted)
    tool_choice: str | dict[str, Any]
    text: dict[str, Any]
    hosted: tuple[hosted.Hosted, ...] = ()
    mcp: tuple[mcp_tools.McpTool, ...] = ()

    @property
    def functions(self) -> list[dict[str, Any]]:
        return [t for t in self.tools if t["type"] == "function"]


def echo(request: ResponsesRequest) -> Echo:
    tools: list[dict[str, Any]] = []
    wanted: list[hosted.Hosted] = []
    servers: list[mcp_tools.McpTool] = []
    for i, raw in enumerate(request.tools or []):
        where = f"tools[{i}]"
        if isinstance(raw, dict) and raw.get("type") == "mcp":
            server, echoed = mcp_tools.parse(raw, where)
            servers.append(server)
            tools.append(echoed)
            continue
        found = hosted.parse(raw, where) if isinstance(raw, dict) else None
        if found is None:
            tools.append(_function_tool(raw, where))
        else:
            wanted.append(found[0])
            tools.append(found[1])
    names = [t["name"] for t in tools if t["type"] == "function"] + [h.name for h in wanted]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise InvalidRequest(f"two tools are named {name!r}", param="tools")
    functions = {t["name"] for t in tools if t["type"] == "function"}
    labels = set(mcp_tools.by_label(servers))  # a 400 for two servers with one label
    choice = _tool_choice(request.tool_choice, functions, wanted, labels)
    return Echo(tools, choice, _text(request.text), tuple(wanted), tuple(servers))


def chat_body(
    request: ResponsesRequest,
    messages: list[dict[str, Any]],
    spec: Echo,
    offered: Sequence[Any] = (),
    *,
    first: bool = True,
    max_tokens: int | None = None,
) -> dict[str, Any]:
    """The chat completion request for one model step of ``request``: ``offered`` are the
    hosted tools' chat schemas; a forced ``tool_choice`` holds for the ``first`` step only
    (later steps of the loop are ``auto``, else the loop could never end); ``max_tokens``:
    what is left of ``max_output_tokens``."""
    body: dict[str, Any] = {"model": request.model, "messages": messages}
    functions = [
        {
            "type": "function",
            "function": {k: v for k, v in t.items() if k != "type" and v is not None},
        }
        for t in spec.functions
    ]
    if functions or offered:
        body["tools"] = [*functions, *offered]
        body["tool_choice"] = _chat_choice(spec, first)
        if request.parallel_tool_calls is not None:
            body["parallel_tool_calls"] = request.parallel_tool_calls
    fmt = spec.text["format"]
    if fmt["type"] == "json_object":
        body["response_format"] = {"type": "json_object"}
    elif fmt["type"] == "json_schema":
        schema = {k: v for k, v in fmt.items() if k != "type"}
        body["response_format"] = {"type": "json_schema", "json_schema": schema}
    for mine, theirs in (
        ("max_output_tokens", "max_tokens"), ("temperature", "temperature"), ("top_p", "top_p"),
    ):  # fmt: skip
        value = getattr(request, mine)
        if value is not None:
            body[theirs] = value
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    if request.stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}  # usage goes into the response object
    return body


def _chat_choice(spec: Echo, first: bool) -> str | dict[str, Any]:
    choice = spec.tool_choice
    if isinstance(choice, str):
        return choice if first or choice == "none" else "auto"
    if not first:
        return "auto"
    if choice["type"] == "code_interpreter":
        return {"type": "function", "function": {"name": CODE_TOOL}}
    if choice["type"] == "mcp" and "name" not in choice:
        return "required"  # one of the offered tools; vLLM cannot narrow it to one server's
    return {"type": "function", "function": {"name": choice["name"]}}


def check_forced(spec: Echo, kinds: Mapping[str, str]) -> None:
    """A 400 when ``tool_choice`` forces an MCP tool its server does not offer; ``kinds``:
    the hosted kind of every offered tool by name (known once the servers are listed)."""
    choice = spec.tool_choice
    if not isinstance(choice, dict) or choice["type"] != "mcp" or "name" not in choice:
        return
    found = mcp_tools.parse_kind(kinds.get(choice["name"], ""))
    if found is None or found[0] != choice["server_label"]:
        raise InvalidRequest(
            f"tool_choice.name: MCP server {choice['server_label']!r} offers no tool "
            f"{choice['name']!r} (its listing, narrowed by allowed_tools)",
            param="tool_choice.name",
        )


def _function_tool(tool: Any, where: str) -> dict[str, Any]:
    if not isinstance(tool, dict):
        raise InvalidRequest(f"{where} must be a tool object", param=where)
    kind = tool.get("type")
    if kind != "function":
        if isinstance(kind, str) and kind:
            raise not_yet(f"{where}.type", f"tool type {kind!r} (OpenAI-hosted tools)")
        raise InvalidRequest(f"{where}.type must be 'function'", param=f"{where}.type")
    unknown = sorted(tool.keys() - FUNCTION_KEYS - FUNCTION_IGNORED)
    if unknown:
        raise InvalidRequest(
            f"{where}.{unknown[0]} is not a field of a function tool", param=f"{where}.{unknown[0]}"
        )
    name = tool.get("name")
    if not isinstance(name, str) or not FUNCTION_NAME.match(name):
        raise InvalidRequest(
            f"{where}.name must be 1 to 64 letters, digits, '_', '.' or '-' (got {name!r})",
            param=f"{where}.name",
        )
    out: dict[str, Any] = {"type": "function", "name": name}
    for key, types in (("description", str), ("parameters", dict), ("strict", bool)):
        value = tool.get(key)
        if value is not None and not isinstance(value, types):
            raise InvalidRequest(
                f"{where}.{key} must be a {types.__name__}", param=f"{where}.{key}"
            )
        out[key] = value
    out["parameters"] = out["parameters"] or {"type": "object", "properties": {}}
    return out


def _tool_choice(
    choice: str | dict[str, Any] | None,
    names: set[str],
    wanted: list[hosted.Hosted],
    labels: set[str],
) -> str | dict[str, Any]:
    if choice is None:
        return "auto"
    if isinstance(choice, str):
        if choice not in CHOICES:
            raise InvalidRequest(
                f"tool_choice must be one of {', '.join(CHOICES)} or a function (got {choice!r})",
                param="tool_choice",
            )
        if choice == "required" and not names and not wanted and not labels:
            raise InvalidRequest("tool_choice 'required' needs tools", param="tool_choice")
        return choice
    kind = choice.get("type")
    if kind == "code_interpreter":
        if not any(h.kind == "code_interpreter" for h in wanted):
            raise InvalidRequest(
                "tool_choice code_interpreter needs a code_interpreter tool", param="tool_choice"
            )
        return {"type": "code_interpreter"}
    if kind == "mcp":
        return _mcp_choice(choice, labels)
    if kind != "function":
        raise not_yet("tool_choice.type", f"tool_choice type {kind!r}")
    name = choice.get("name")
    if not isinstance(name, str) or name not in names:
        raise InvalidRequest(
            f"tool_choice.name must name one of the request's function tools (got {name!r})",
            param="tool_choice.name",
        )
    return {"type": "function", "name": name}


def _mcp_choice(choice: dict[str, Any], labels: set[str]) -> dict[str, Any]:
    """``{"type": "mcp", "server_label", "name"?}``: a tool of that server (the named one)."""
    unknown = sorted(choice.keys() - {"type", "server_label", "name"})
    if unknown:
        raise InvalidRequest(
            f"tool_choice.{unknown[0]} is not a field of an mcp tool choice",
            param=f"tool_choice.{unknown[0]}",
        )
    label = choice.get("server_label")
    if not isinstance(label, str) or label not in labels:
        raise InvalidRequest(
            "tool_choice.server_label must name one of the request's mcp tools' server_label "
            f"(got {label!r})",
            param="tool_choice.server_label",
        )
    name = choice.get("name")
    if name is None:
        return {"type": "mcp", "server_label": label}
    if not isinstance(name, str) or not FUNCTION_NAME.match(name):
        raise InvalidRequest(
            f"tool_choice.name must be a tool name (got {name!r})", param="tool_choice.name"
        )
    return {"type": "mcp", "server_label": label, "name": name}


def _text(text: dict[str, Any] | None) -> dict[str, Any]:
    fmt = (text or {}).get("format") or {"type": "text"}
    if not isinstance(fmt, dict):
        raise InvalidRequest("text.format must be an object", param="text.format")
    unknown = sorted((text or {}).keys() - {"format", "verbosity"})
    if unknown:
        raise InvalidRequest(
            f"text.{unknown[0]} is not a field of text", param=f"text.{unknown[0]}"
        )
    kind = fmt.get("type")
    if kind in ("text", "json_object"):
        return {"format": {"type": kind}}
    if kind != "json_schema":
        raise InvalidRequest(
            f"text.format.type must be text, json_object or json_schema (got {kind!r})",
            param="text.format.type",
        )
    name, schema = fmt.get("name"), fmt.get("schema")
    if not isinstance(name, str) or not FUNCTION_NAME.match(name):
        raise InvalidRequest(
            "text.format.name must be 1 to 64 letters, digits, '_', '.' or '-'",
            param="text.format.name",
        )
    if not isinstance(schema, dict):
        raise InvalidRequest(
            "text.format.schema must be a JSON schema object", param="text.format.schema"
        )
    out: dict[str, Any] = {"type": "json_schema", "name": name, "schema": schema}
    for key, types in (("description", str), ("strict", bool)):
        value = fmt.get(key)
        if value is not None and not isinstance(value, types):
            raise InvalidRequest(
                f"text.format.{key} must be a {types.__name__}", param=f"text.format.{key}"
            )
        if value is not None:
            out[key] = value
    return {"format": out}
