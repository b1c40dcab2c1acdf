"""The tools: a JSON schema for the model, what the policy is asked about a call, and how
each runs (one entry per tool)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandbox.errors import EgressDenied, QueryRefused
from sandbox.policy import Egress, ResourceClass
from sandbox.policy import Request as PolicyRequest
from sandbox.runtime.base import ProcessResult, Runtime
from sandbox.runtime.warm import WarmPython
from sandbox.tools.fetch import Resolver, fetch, system_resolver, target
from sandbox.tools.files import Workspace
from sandbox.tools.sql import query


@dataclass(frozen=True, slots=True)
class Context:
    workspace: Workspace
    runtime: Runtime
    limits: ResourceClass
    warm: WarmPython | None = None
    egress: Egress | None = None
    resolve: Resolver = system_resolver
    databases: Mapping[str, tuple[Path, tuple[str, ...]]] = field(default_factory=dict)


Impl = Callable[[Context, dict[str, Any]], Awaitable["ProcessResult | Any"]]
Asks = Callable[[str, dict[str, Any], bool], PolicyRequest]  # (tool, arguments, approved)


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]
    run: Impl
    asks: Asks  # what the policy decides on for a call (its path, host or database)
    warm: bool = False  # runs through the session's resident interpreter when warm is on

    def schema(self) -> dict[str, Any]:
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                "parameters": self.parameters, "strict": True}}  # fmt: skip

    def policy_request(self, arguments: dict[str, Any], approved: bool) -> PolicyRequest:
        """The request the policy decides on; ``arguments`` already fit ``parameters``."""
        return self.asks(self.name, arguments, approved)


def tool_only(name: str, args: dict[str, Any], approved: bool) -> PolicyRequest:
    """Process tools: the grant of the tool (and its risk class) is all there is to check."""
    return PolicyRequest(name, ".", approved)


def workspace_path(name: str, args: dict[str, Any], approved: bool) -> PolicyRequest:
    """File tools: the ``path`` argument, checked against the grant's read or write globs."""
    return PolicyRequest(name, str(args.get("path") or "."), approved)


def url_target(name: str, args: dict[str, Any], approved: bool) -> PolicyRequest:
    """``http_fetch``: the URL's host and port, checked against the egress allowlist."""
    try:
        host, port = target(str(args["url"]))
    except EgressDenied:
        return PolicyRequest(name, approved=approved)  # no host: refused by the policy
    return PolicyRequest(name, approved=approved, host=host, port=port)


def database(name: str, args: dict[str, Any], approved: bool) -> PolicyRequest:
    """``sql_query``: the database name, checked against the grant's databases."""
    return PolicyRequest(name, approved=approved, database=str(args["database"]))


def _obj(props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": props,
        "required": required,
        "additionalProperties": False,
    }


async def run_python(ctx: Context, args: dict[str, Any]) -> ProcessResult:
    if ctx.warm is not None:  # the session's resident interpreter forks a child per call
        return await ctx.warm.run(str(args["code"]), b"", ctx.limits)
    return await ctx.runtime.run(
        ["python3", "-I", "-"], ctx.workspace.root, ctx.limits, str(args["code"]).encode()
    )


async def run_shell(ctx: Context, args: dict[str, Any]) -> ProcessResult:
    if ctx.warm is not None:  # exec'd by a fresh child of the session's resident interpreter
        argv = ["/bin/sh", "-c", str(args["command"])]
        return await ctx.warm.run("", b"", ctx.limits, argv)
    return await ctx.runtime.run(["sh", "-c", str(args["command"])], ctx.workspace.root, ctx.limits)


async def read_file(ctx: Context, args: dict[str, Any]) -> Any:
    data, truncated = await ctx.workspace.read(
        str(args["path"]), ctx.limits.output_bytes, ctx.limits.wall_s
    )
    return {"content": data.decode("utf-8", errors="replace"), "truncated": truncated}


async def write_file(ctx: Context, args: dict[str, Any]) -> Any:
    data = str(args["content"]).encode()
    if len(data) > ctx.limits.file_mb << 20:
        raise ValueError(f"content exceeds the {ctx.limits.file_mb} MB file limit")
    written = await ctx.workspace.write(
        str(args["path"]), data, bool(args.get("append")), ctx.limits.wall_s
    )
    return {"written": written}


async def http_fetch(ctx: Context, args: dict[str, Any]) -> Any:
    assert ctx.egress is not None
    return await fetch(str(args["url"]), ctx.egress, ctx.limits, ctx.resolve)


async def sql_query(ctx: Context, args: dict[str, Any]) -> Any:
    found = ctx.databases.get(str(args["database"]))
    if found is None:
        raise QueryRefused(f"the broker knows no database {args['database']!r}")
    path, classes = found
    return await query(path, str(args["query"]), classes, ctx.limits.wall_s)


async def list_dir(ctx: Context, args: dict[str, Any]) -> Any:
    return {"entries": await ctx.workspace.list(str(args.get("path") or "."), ctx.limits.wall_s)}


TOOLS: dict[str, Tool] = {
    t.name: t
    for t in (
        Tool("run_python", "Run a Python 3 program in the session's workspace (no network).",
             _obj({"code": {"type": "string"}}, ["code"]), run_python, tool_only, warm=True),
        Tool("run_shell", "Run a POSIX shell command in the session's workspace (no network).",
             _obj({"command": {"type": "string"}}, ["command"]), run_shell, tool_only, warm=True),
        Tool("read_file", "Read a text file of the workspace.",
             _obj({"path": {"type": "string"}}, ["path"]), read_file, workspace_path),
        Tool("write_file", "Write (or append to) a file of the workspace.",
             _obj({"path": {"type": "string"}, "content": {"type": "string"},
                   "append": {"type": "boolean"}}, ["path", "content"]), write_file, workspace_path),
        Tool("list_dir", "List a directory of the workspace.",
             _obj({"path": {"type": "string"}}, []), list_dir, workspace_path),
        Tool("http_fetch", "GET a URL on the egress allowlist (no redirects followed).",
             _obj({"url": {"type": "string"}}, ["url"]), http_fetch, url_target),
        Tool("sql_query", "Run a read-only SQL query on a configured database.",
             _obj({"database": {"type": "string"}, "query": {"type": "string"}},
                  ["database", "query"]), sql_query, database),
    )
}  # fmt: skip
