"""MCP tools inside a response: what a request offers the model, and running the calls.

    prepare    the request's mcp tools → their servers through the operator's allowlist
               (``targets``, no I/O) → their tools, listed now or reused from the chain
               (``offer``), as hosted kinds and chat function schemas
    preface    before the first model step: the decisions on the chain's approval
               requests become ``mcp_call`` items, run (approved) or told as denied
    loop       the model's calls of MCP tools are hosted calls (``run``): the call goes to
               the server, its result (or the server's failure, as an error) to the model

A server that fails or does not answer within ``responses.mcp.timeout_s`` is a 424 when
its tools are listed (nothing was sent to a model yet), and the call's error output when
the model called it; never a 500 or a hang.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.config import McpSettings
from gateway.errors import InvalidRequest
from gateway.pipeline.responses import approvals, hosted, mcp_client, mcp_tools
from gateway.pipeline.responses.mcp_client import McpFailed, Target
from gateway.pipeline.responses.mcp_tools import McpTool
from sandbox.protocol import ToolResult


@dataclass(frozen=True, slots=True)
class McpOffer:
    targets: dict[str, Target] = field(default_factory=dict)  # by server label
    kinds: dict[str, str] = field(default_factory=dict)  # hosted kinds by function name
    offered: list[dict[str, Any]] = field(default_factory=list)  # chat function schemas
    listed: list[dict[str, Any]] = field(default_factory=list)  # new mcp_list_tools items


def targets(settings: McpSettings, tenant: str, tools: Sequence[McpTool]) -> dict[str, Target]:
    return {t.label: mcp_tools.target(settings, tenant, t) for t in tools}


async def offer(
    settings: McpSettings,
    tools: Sequence[McpTool],
    found: dict[str, Target],
    history: Iterable[dict[str, Any]],
    taken: Iterable[str],
) -> McpOffer:
    """List what the chain has not listed yet (concurrently), and offer every allowed
    tool; ``taken``: the request's other tool names (a clash is a 400)."""
    if not tools:
        return McpOffer()
    history = list(history)
    known = {t.label: mcp_tools.listed(history, t.label) for t in tools}
    missing = [t for t in tools if known[t.label] is None]
    fresh = await asyncio.gather(
        *(mcp_tools.list_item(found[t.label], settings.timeout_s, t.where) for t in missing)
    )
    known.update({t.label: item for t, item in zip(missing, fresh, strict=True)})
    result = McpOffer(found, listed=list(fresh))
    names = set(taken)
    for t in tools:
        item = known[t.label]
        assert item is not None
        kinds, schemas = mcp_tools.offered(t, item)
        for name in kinds:
            if name in names:
                raise InvalidRequest(
                    f"{t.where}: MCP server {t.label!r} has a tool {name!r}, and another tool "
                    "of this request has that name; narrow allowed_tools",
                    param=f"{t.where}.allowed_tools",
                )
            names.add(name)
        result.kinds.update(kinds)
        result.offered.extend(schemas)
    return result


async def run(target: Target, item: dict[str, Any], arguments: str, timeout_s: float) -> ToolResult:
    """Call the tool on its server and settle its ``mcp_call`` item: the tool's result, or
    the error the model is told (bad arguments, the tool's own error, the server down).
    What happened, as the sandbox tells its runs, for the recorded tool call."""
    started = time.perf_counter()

    def settled(text: str, ok: bool, allowed: bool = True) -> ToolResult:
        hosted.settle(item, text, ok)
        return ToolResult(
            tool=item["name"], allowed=allowed, rule=f"mcp:{target.label}",
            reason=text if not allowed else "", exit_status=0 if ok else 1, stdout=text,
            duration_ms=(time.perf_counter() - started) * 1000,
        )  # fmt: skip

    try:
        args = orjson.loads(arguments or "{}")
    except orjson.JSONDecodeError as exc:
        return settled(f"error: invalid arguments: not JSON ({exc})", ok=False)
    if not isinstance(args, dict):
        return settled("error: invalid arguments: not a JSON object", ok=False)
    try:
        called = await mcp_client.call_tool(target, item["name"], args, timeout_s)
    except McpFailed as exc:
        text = f"error: unavailable: MCP server {target.label!r} failed: {exc.message}"
        return settled(text, ok=False)
    return settled(called.text if called.ok else f"error: tool error: {called.text}", called.ok)


async def preface(
    decisions: Sequence[approvals.Decision], found: dict[str, Target], timeout_s: float
) -> list[tuple[dict[str, Any], ToolResult]]:
    """The decided approval requests as settled ``mcp_call`` items, in order, with what
    happened (a denial: not allowed, as the sandbox tells one)."""
    out: list[tuple[dict[str, Any], ToolResult]] = []
    for decision in decisions:
        item = approvals.call_item(decision)
        if decision.approve:
            target = found[decision.request["server_label"]]
            result = await run(target, item, decision.request["arguments"], timeout_s)
        else:
            text = approvals.denial(decision)
            hosted.settle(item, text, ok=False)
            result = ToolResult(
                tool=item["name"], allowed=False, rule=decision.approver, reason=text,
                stdout=text,
            )  # fmt: skip
        out.append((item, result))
    return out
