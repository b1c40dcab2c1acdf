"""Hosted-call items as input: a client that keeps its own context (``store: false``, no
``previous_response_id``) sends back the ``code_interpreter_call``, ``mcp_call`` and
``mcp_list_tools`` items a response gave it, as it sends back its messages.

Each is checked field by field (a 400 naming the field) and kept in the shape the gateway
itself writes, so the chat request replays it as the chain's own items are replayed: the
call the model made and the output it was told. An ``mcp_list_tools`` item stands for its
server's listing, as the chain's would: the server is not listed again. What such an item
says is the client's own context, as its messages are: nothing here runs a tool. An
``mcp_approval_request`` is not taken as input: an approval answers a request this gateway
issued, in a stored chain (``previous_response_id``).
"""

from __future__ import annotations

from typing import Any

from gateway.errors import InvalidRequest

HOSTED_INPUT_TYPES = ("code_interpreter_call", "mcp_call", "mcp_list_tools")
STATUSES = ("completed", "incomplete", "failed", "in_progress", "calling", "interpreting")
KEYS = {
    # call_id and arguments: the gateway's extensions, naming the model's own call
    "code_interpreter_call": frozenset({"code", "container_id", "outputs", "call_id", "arguments"}),
    "mcp_call": frozenset(
        {"server_label", "name", "arguments", "output", "error", "approval_request_id", "call_id"}
    ),
    "mcp_list_tools": frozenset({"server_label", "tools", "error"}),
}
TOOL_KEYS = frozenset({"name", "description", "input_schema", "annotations"})
MAX_LISTED = 1000


def hosted_item(raw: dict[str, Any], where: str, ident: str) -> dict[str, Any]:
    """A hosted-call item of a request's ``input`` (``raw["type"]`` in HOSTED_INPUT_TYPES)."""
    kind = raw["type"]
    unknown = sorted(raw.keys() - KEYS[kind] - {"id", "type", "status"})
    if unknown:
        raise InvalidRequest(
            f"{where}.{unknown[0]} is not a field of a {kind} item", param=f"{where}.{unknown[0]}"
        )
    status = raw.get("status", "completed")
    if status not in STATUSES:
        raise InvalidRequest(
            f"{where}.status must be one of {', '.join(STATUSES)} (got {status!r})",
            param=f"{where}.status",
        )
    if kind == "mcp_list_tools":
        return _listing(raw, where, ident)
    item: dict[str, Any] = {"id": ident, "type": kind, "status": status}
    item["call_id"] = _text(raw, "call_id", where, optional=True)
    if kind == "code_interpreter_call":
        item["code"] = _text(raw, "code", where, optional=True, empty=True)
        item["container_id"] = _text(raw, "container_id", where, optional=True, empty=True)
        item["arguments"] = _text(raw, "arguments", where, optional=True, empty=True)
        item["outputs"] = _outputs(raw.get("outputs"), f"{where}.outputs")
        return item
    item["server_label"] = _text(raw, "server_label", where)
    item["name"] = _text(raw, "name", where)
    item["arguments"] = _text(raw, "arguments", where, empty=True)
    item["output"] = _text(raw, "output", where, optional=True, empty=True)
    item["error"] = _error(raw.get("error"), f"{where}.error")
    item["approval_request_id"] = _text(raw, "approval_request_id", where, optional=True)
    return item


def _listing(raw: dict[str, Any], where: str, ident: str) -> dict[str, Any]:
    tools = raw.get("tools")
    if not isinstance(tools, list) or len(tools) > MAX_LISTED:
        raise InvalidRequest(
            f"{where}.tools must be a list of at most {MAX_LISTED} tools", param=f"{where}.tools"
        )
    listed = []
    for j, tool in enumerate(tools):
        at = f"{where}.tools[{j}]"
        if not isinstance(tool, dict):
            raise InvalidRequest(f"{at} must be a tool object", param=at)
        unknown = sorted(tool.keys() - TOOL_KEYS)
        if unknown:
            raise InvalidRequest(
                f"{at}.{unknown[0]} is not a field of a listed tool", param=f"{at}.{unknown[0]}"
            )
        schema = tool.get("input_schema")
        if not isinstance(schema, dict):
            raise InvalidRequest(f"{at}.input_schema must be an object", param=f"{at}.input_schema")
        listed.append({
            "name": _text(tool, "name", at),
            "description": _text(tool, "description", at, optional=True, empty=True),
            "input_schema": schema,
            "annotations": _object(tool.get("annotations"), f"{at}.annotations"),
        })  # fmt: skip
    return {
        "id": ident, "type": "mcp_list_tools", "server_label": _text(raw, "server_label", where),
        "tools": listed, "error": _error(raw.get("error"), f"{where}.error"),
    }  # fmt: skip


def _outputs(value: Any, where: str) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidRequest(f"{where} must be a list of outputs", param=where)
    out = []
    for j, o in enumerate(value):
        at = f"{where}[{j}]"
        if not isinstance(o, dict) or o.get("type") not in ("logs", "image"):
            raise InvalidRequest(f"{at} must be a logs or an image output", param=f"{at}.type")
        key = "logs" if o["type"] == "logs" else "url"
        unknown = sorted(o.keys() - {"type", key})
        if unknown:
            raise InvalidRequest(
                f"{at}.{unknown[0]} is not a field of a {o['type']} output",
                param=f"{at}.{unknown[0]}",
            )
        out.append({"type": o["type"], key: _text(o, key, at, empty=True)})
    return out


def _error(value: Any, where: str) -> Any:
    """``error``: a string, or the ``{"type", "content"}`` object this gateway writes."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict) and all(isinstance(v, str) for v in value.values()):
        return value
    raise InvalidRequest(f"{where} must be a string or an object of strings", param=where)


def _object(value: Any, where: str) -> dict[str, Any] | None:
    if value is None or isinstance(value, dict):
        return value
    raise InvalidRequest(f"{where} must be an object", param=where)


def _text(
    raw: dict[str, Any], key: str, where: str, *, optional: bool = False, empty: bool = False
) -> Any:
    value = raw.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str) or (not empty and not value):
        need = "a string" if empty else "a non-empty string"
        raise InvalidRequest(f"{where}.{key} must be {need}", param=f"{where}.{key}")
    return value
