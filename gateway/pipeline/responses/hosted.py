"""Hosted tools: the sandbox's tools, offered to the model as function tools and run by the
gateway inside a response (the hosted loop, ``gateway.pipeline.responses.loop``).

Request shapes (``tools[i]``):

    {"type": "code_interpreter", "container": "auto" | {...}}   the sandbox's run_python
    {"type": "sandbox", "name": "<tool>"}                        any sandbox tool, by name
                                                                 (a gateway extension)

The model sees each as a function tool with the sandbox's own JSON schema
(``GET /v1/tools``). Its calls become output items the ``openai`` SDK types:
``code_interpreter_call`` (``code``, ``outputs: [{"type": "logs"}]``) for run_python
offered as ``code_interpreter``, ``mcp_call`` with ``server_label: "sandbox"`` for the
others. Both carry ``call_id``, the model's tool call id, and ``arguments``, its exact
arguments (extensions on ``code_interpreter_call``: they name the recorded tool call, and
a chain replays the call to the model exactly as the model made it).

A tool whose risk class the caller's grant holds for an approval waits for one
(``approvals``) instead of running. A tool's failure, timeout or denial is the tool's
output, told to the model with its error class (``error: denied: ...``); only a sandbox that cannot be reached is an error of the
response (``SandboxUnavailable``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson
from sqlalchemy.exc import SQLAlchemyError

from gateway.errors import GatewayError, InvalidRequest, SandboxUnavailable, StoreUnavailable
from gateway.pipeline.request import RequestIdentity
from gateway.pipeline.responses import approvals, mcp_tools
from gateway.pipeline.responses.items import CODE_TOOL, new_id, tool_name
from gateway.pipeline.responses.sandbox_offers import SandboxOffers
from gateway.pipeline.services import Services
from gateway.pipeline.tools import run_tool
from gateway.recording.recorder import RecorderClosed
from gateway.store import queries
from sandbox.protocol import ToolResult

log = logging.getLogger(__name__)
SERVER_LABEL = "sandbox"  # the mcp_call items' server_label
CODE_KEYS = frozenset({"type", "container", "allowed_callers"})
SANDBOX_KEYS = frozenset({"type", "name"})


@dataclass(frozen=True, slots=True)
class Hosted:
    """One hosted tool a request asked for: its kind and the sandbox tool it runs."""

    kind: str  # code_interpreter | sandbox
    name: str  # the sandbox tool (and the function name the model sees)
    where: str  # tools[i], for errors


def parse(tool: dict[str, Any], where: str) -> tuple[Hosted, dict[str, Any]] | None:
    """A hosted tool of ``tools`` and how the response echoes it; None: not a hosted type."""
    kind = tool.get("type")
    if kind == "code_interpreter":
        _known_keys(tool, CODE_KEYS, where)
        container = tool.get("container", "auto")
        if not isinstance(container, str | dict):
            raise InvalidRequest(
                f"{where}.container must be a container id or an object",
                param=f"{where}.container",
            )
        return Hosted("code_interpreter", CODE_TOOL, where), {
            "type": "code_interpreter", "container": container,
        }  # fmt: skip
    if kind == "sandbox":
        _known_keys(tool, SANDBOX_KEYS, where)
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidRequest(
                f"{where}.name must name a sandbox tool (GET /v1/tools lists them)",
                param=f"{where}.name",
            )
        return Hosted("sandbox", name, where), {"type": "sandbox", "name": name}
    return None


def _known_keys(tool: dict[str, Any], allowed: frozenset[str], where: str) -> None:
    unknown = sorted(tool.keys() - allowed)
    if unknown:
        raise InvalidRequest(
            f"{where}.{unknown[0]} is not a field of a {tool['type']} tool (docs/responses.md)",
            param=f"{where}.{unknown[0]}",
        )


async def offer(
    services: Services, wanted: Iterable[Hosted], who: RequestIdentity, asked: SandboxOffers
) -> tuple[dict[str, str], list[Any]]:
    """The hosted tools' kinds by function name, and their chat tool schemas from the
    sandbox; a sandbox that is down is a 503 here, before anything is sent. A tool whose
    risk class the caller's grant holds for an approval (the sandbox declares which) is
    of the kind of an MCP tool that needs approval, of the server ``sandbox``: its calls
    wait as ``mcp_approval_request`` items (``approvals``). Both come from the sandbox
    through ``asked``, which remembers them for about a second (``sandbox_offers``)."""
    wanted = list(wanted)
    if not wanted:
        return {}, []
    listed, held = await asked.get(services.sandbox, who.tenant, who.api_key)
    schemas = {t["function"]["name"]: t for t in listed}
    kinds: dict[str, str] = {}
    offered: list[Any] = []
    for h in wanted:
        if h.name not in schemas:
            raise InvalidRequest(
                f"{h.where}: the sandbox has no tool {h.name!r} (GET /v1/tools lists them)",
                param=f"{h.where}.name",
            )
        kinds[h.name] = mcp_tools.kind(SERVER_LABEL, True) if h.name in held else h.kind
        offered.append(schemas[h.name])
    return kinds, offered


# -- items -------------------------------------------------------------------------


def new_item(kind: str, name: str, call_id: str, container: str) -> dict[str, Any]:
    """A hosted call's output item, in progress (its arguments are not known yet); a call
    of an MCP tool that needs approval is an ``mcp_approval_request`` instead."""
    server = mcp_tools.parse_kind(kind)
    if server is not None and server[1]:
        return approvals.request_item(server[0], name, call_id)
    if kind == "code_interpreter":
        return {
            "id": new_id("ci"), "type": "code_interpreter_call", "status": "in_progress",
            "code": "", "container_id": container, "outputs": None, "call_id": call_id,
            "arguments": "",
        }  # fmt: skip
    return {
        "id": new_id("mcp"), "type": "mcp_call", "status": "in_progress",
        "server_label": server[0] if server else SERVER_LABEL, "name": name, "arguments": "",
        "output": None,
        "error": None, "call_id": call_id,
    }  # fmt: skip


def set_arguments(item: dict[str, Any], arguments: str) -> None:
    """Put the call's final arguments on its item (code_interpreter: and the code)."""
    item["arguments"] = arguments
    if item["type"] != "code_interpreter_call":
        return
    try:
        args = orjson.loads(arguments or "{}")
    except orjson.JSONDecodeError:
        args = None
    code = args.get("code") if isinstance(args, dict) else None
    item["code"] = code if isinstance(code, str) else arguments


def claim(
    item: dict[str, Any], kinds: dict[str, str], container: str
) -> tuple[dict[str, Any], str | None]:
    """A finished function_call item as a hosted item when it calls a hosted tool, with its
    raw arguments; else the item itself and None."""
    kind = kinds.get(item["name"]) if item["type"] == "function_call" else None
    if kind is None:
        return item, None
    hosted = new_item(kind, item["name"], item["call_id"], container)
    set_arguments(hosted, item["arguments"])
    return hosted, item["arguments"]


def settle(item: dict[str, Any], text: str, ok: bool, status: str | None = None) -> None:
    """Put the tool's output (what the model is told) on its item."""
    item["status"] = status or ("completed" if ok else "failed")
    if item["type"] == "code_interpreter_call":
        item["outputs"] = [{"type": "logs", "logs": text}]
    else:
        item["output"] = text
        item["error"] = None if ok else {"type": "mcp_tool_execution_error", "content": text}


# -- running ---------------------------------------------------------------------------


def model_text(result: ToolResult) -> tuple[str, bool]:
    """What the model is told of a sandbox result, and whether the call succeeded."""
    if not result.allowed:
        return f"error: denied: {result.reason} (rule: {result.rule})", False
    if result.fault is not None:
        retry = f" (retry after {result.retry_after_s}s)" if result.retry_after_s else ""
        return f"error: {result.fault}{retry}: {result.stderr or result.reason}".rstrip(), False
    body = result.stdout
    if result.output is not None:
        body = orjson.dumps(result.output).decode()
    if result.stderr:
        body = f"{body}{'' if not body or body.endswith(chr(10)) else chr(10)}{result.stderr}"
    if result.limit is not None:
        what = "timeout" if result.limit == "wall_time" else f"limit {result.limit}"
        return f"error: {what} (exit status {result.exit_status})\n{body}".rstrip(), False
    if result.exit_status not in (None, 0):
        return f"error: exit status {result.exit_status}\n{body}".rstrip(), False
    return body, True


async def run(
    services: Services, who: RequestIdentity, session: str, item: dict[str, Any], arguments: str,
    *, approved: bool = False,
) -> None:  # fmt: skip
    """Run one hosted call in the session's workspace and settle its item; the result is
    recorded on the step's tool call. ``SandboxUnavailable`` (the sandbox is down) is raised.
    ``approved``: a human approved this call (its risk class is held for an approval)."""
    try:
        args = orjson.loads(arguments or "{}")
    except orjson.JSONDecodeError as exc:
        settle(item, f"error: invalid arguments: not JSON ({exc})", ok=False)
        return
    if not isinstance(args, dict):
        settle(item, "error: invalid arguments: not a JSON object", ok=False)
        return
    name = tool_name(item)
    switched_off = services.control.tool_off(name)  # checked at every iteration
    if switched_off is not None:
        settle(item, f"error: denied: {switched_off}", ok=False)
        return
    principal = services.auth.named(who.tenant, who.api_key)
    if principal is not None and not principal.may_run_tool(name):
        settle(item, f"error: denied: this API key may not run the tool {name!r}", ok=False)
        return
    try:
        result = await run_tool(
            services.sandbox, who.tenant, who.api_key, session, tool_name(item), args, approved
        )
    except SandboxUnavailable:
        raise
    except GatewayError as exc:  # bad arguments, unknown tool, the sandbox's own failure
        settle(item, f"error: {exc.code or exc.type}: {exc.message}", ok=False)
        return
    text, ok = model_text(result)
    settle(item, text, ok)
    await record(services, who.tenant, session, item["call_id"], result, text)


async def record(
    services: Services, tenant: str, session: str, call_id: str, result: ToolResult, text: str
) -> None:
    """The result on the recorded tool call, as ``POST /v1/tools/{name}`` stores it."""
    recorder = services.recorder
    if recorder is None:
        return
    outcome = result.model_dump() | {"text": text}
    try:
        known = await recorder.tool_result(tenant, session, call_id, outcome)
        if known is None:
            await recorder.call(
                lambda c: queries.record_tool_result(c, tenant, session, call_id, outcome)
            )
    except (RecorderClosed, StoreUnavailable, SQLAlchemyError) as exc:
        log.error("tool result of call %s could not be recorded: %s", call_id, exc)
