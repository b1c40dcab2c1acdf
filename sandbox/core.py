"""The sandbox's core: sessions and their workspaces, and one tool call end to end
(policy, faults, runtime, attestation). The HTTP layer is ``sandbox.service``.

The service's endpoints, for reference:

    GET    /health
    GET    /v1/tools                   every tool's JSON schema
    POST   /v1/approvals               {principal}: the tools its grant holds for an approval
    POST   /v1/sessions                a workspace for one trajectory (+ fault plan)
    DELETE /v1/sessions/{id}           remove it (also done after session_ttl_s idle)
    POST   /v1/tools/{name}            run a tool call: policy, faults, runtime, attestation

Every call needs ``Authorization: Bearer <token>`` (compared in constant time).
A session belongs to the tenant that created it: another tenant's call answers
404 as if it did not exist. Errors are ``{"error": {"message", "type", "code"}}``.
If the isolation runtime is unavailable the service refuses to start.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import sqlite3
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from sandbox.config import SandboxConfig
from sandbox.errors import (
    InvalidArguments,
    RuntimeUnavailable,
    SessionExists,
    SessionNotFound,
    ToolRefused,
    UnknownTool,
)
from sandbox.faults import FAULTS, Faults
from sandbox.policy import Decision, Egress, ResourceClass
from sandbox.policy import Principal as Who
from sandbox.protocol import SessionCreate, ToolCall, ToolResult, scoped_id
from sandbox.runtime import RUNTIMES
from sandbox.runtime.base import ProcessResult, Runtime
from sandbox.runtime.bwrap import BwrapRuntime
from sandbox.runtime.warm import WarmPython
from sandbox.tools.fetch import Resolver, system_resolver
from sandbox.tools.files import Workspace
from sandbox.tools.registry import TOOLS, Context, Tool
from sandbox.toolschema import check_value
from sandbox.workspace import Workspaces, sweep

log = logging.getLogger("gearshift.sandbox")


@dataclass
class Session:
    id: str
    tenant: str
    workspace: Workspace
    faults: Faults
    last_used: float = field(default_factory=time.monotonic)
    warm: WarmPython | None = None  # the session's resident interpreter, once started
    busy: int = 0  # calls in flight: an idle-expiry never removes a session mid-call


class Sandbox:
    def __init__(
        self, config: SandboxConfig, runtime: Runtime | None = None, resolve: Resolver | None = None
    ) -> None:
        self.resolve: Resolver = resolve or system_resolver
        self.config = config
        self.token = (
            config.token.get_secret_value() if config.token else secrets.token_urlsafe(32)
        ).encode()
        self.runtime = runtime or RUNTIMES[config.runtime](config.uid, config.gid)
        self.policy = config.policy()
        self.sessions: dict[str, Session] = {}
        q = config.workspace
        self.workspaces = Workspaces(config.root, config.uid, config.gid, q.each(), q.tenant())
        # Workspaces a previous service left (it crashed, or was killed) are mounted still.
        try:
            stale = sweep(config.root)
        except PermissionError as exc:  # not root: say so, not a traceback
            raise RuntimeUnavailable(
                f"cannot clear old workspaces under {config.root} ({exc}); the sandbox "
                "service runs as root (it mounts workspaces and sets up cgroups)"
            ) from None
        if stale:
            log.info("removed %d workspaces left under %s", stale, config.root)

    # -- sessions ------------------------------------------------------------

    def create(self, body: SessionCreate) -> Session:
        sid = body.session_id or secrets.token_hex(16)
        if sid in self.sessions:
            raise SessionExists(f"session {sid!r} exists")
        root = self.workspaces.create(scoped_id(body.principal.tenant, sid))
        s = Session(
            sid,
            body.principal.tenant,
            Workspace(root, self.config.uid, self.config.gid),
            Faults(body.faults or self.config.faults_by_tenant.get(body.principal.tenant)),
        )
        self.sessions[sid] = s
        return s

    def get(self, sid: str, tenant: str) -> Session:
        s = self.sessions.get(sid)
        if s is None or not hmac.compare_digest(s.tenant.encode(), tenant.encode()):
            raise SessionNotFound(f"no session {sid!r}")
        s.last_used = time.monotonic()
        return s

    async def remove(self, sid: str) -> None:
        s = self.sessions.pop(sid, None)
        if s is not None:
            if s.warm is not None:
                await s.warm.stop()
            self.workspaces.remove(s.workspace.root)

    async def expire(self) -> int:
        """Remove the sessions idle for ``session_ttl_s`` (none with a call in flight)."""
        cutoff = time.monotonic() - self.config.session_ttl_s
        old = [sid for sid, s in self.sessions.items() if s.last_used < cutoff and not s.busy]
        for sid in old:
            await self.remove(sid)
        return len(old)

    # -- tool calls ----------------------------------------------------------

    async def call(self, name: str, body: ToolCall) -> ToolResult:
        tool = TOOLS.get(name)
        if tool is None:
            raise UnknownTool(f"no tool {name!r}; see GET /v1/tools")
        session = self.get(body.session_id, body.principal.tenant)
        problem = check_value(body.arguments, tool.parameters, name)
        if problem is not None:
            raise InvalidArguments(problem)
        who = Who(body.principal.tenant, body.principal.key)
        decision = self.policy.decide(who, tool.policy_request(body.arguments, body.approved))
        log.info(
            "tool %s for %s/%s in %s: %s by %s (%s)", name, who.tenant, who.key, session.id,
            "allowed" if decision.allowed else "denied", decision.rule, decision.reason,
        )  # fmt: skip
        result = await self._execute(tool, body, session, decision)
        result.attestation = self.attest(name, body, result)
        return result

    async def _execute(
        self, tool: Tool, body: ToolCall, session: Session, d: Decision
    ) -> ToolResult:
        verdict = ToolResult(
            tool=tool.name,
            allowed=d.allowed,
            rule=d.rule,
            reason=d.reason,
            risk=str(d.risk) if d.risk else None,
        )
        if not d.allowed or d.resources is None:
            return verdict
        fault = session.faults.next()
        if fault is not None:
            return FAULTS[fault].apply(verdict, fault, session.faults.retry_after_s)
        ctx = self._context(tool, session, d.resources, d.egress)
        root, t = session.workspace.root, session.tenant
        session.busy += 1
        try:
            others = [s.workspace.root for s in self.sessions.values() if s.tenant == t]
            self.workspaces.share(root, [p for p in others if p != root])
            result = await _run(tool, ctx, body.arguments, verdict)
        finally:
            session.busy -= 1
            session.last_used = time.monotonic()
        if result.exit_status not in (0, None) and result.limit is None:
            result.limit = self.workspaces.exhausted(root)  # ENOSPC: "disk" or "inodes"
        return result

    def _context(
        self, tool: Tool, session: Session, limits: ResourceClass, egress: Egress | None
    ) -> Context:
        if (
            tool.warm
            and self.config.warm
            and session.warm is None
            and isinstance(self.runtime, BwrapRuntime)
        ):
            session.warm = WarmPython(self.runtime, session.workspace.root, limits)
        return Context(
            session.workspace, self.runtime, limits, session.warm, egress, self.resolve,
            {n: (db.path, tuple(db.statements)) for n, db in self.config.databases.items()},
        )  # fmt: skip

    def attest(self, name: str, body: ToolCall, result: ToolResult) -> str:
        """HMAC-SHA256 (keyed with the service token) over the request and the result."""
        payload = orjson.dumps(
            {
                "tool": name,
                "request": body.model_dump(),
                "result": result.model_dump(exclude={"attestation"}),
            },
            option=orjson.OPT_SORT_KEYS,
        )
        return hmac.new(self.token, payload, hashlib.sha256).hexdigest()


async def _run(tool: Tool, ctx: Context, args: dict[str, Any], verdict: ToolResult) -> ToolResult:
    """Run an allowed call. A tool's refusal is a denial by the refusing rule; an I/O or
    input failure is a failed run (exit status 1) with the error as its stderr."""
    started = time.perf_counter()
    try:
        out = await tool.run(ctx, args)
    except ToolRefused as exc:
        return verdict.model_copy(update={"allowed": False, "rule": exc.rule, "reason": str(exc)})
    except (OSError, ValueError, aiohttp.ClientError, sqlite3.Error) as exc:
        return verdict.model_copy(
            update={"exit_status": 1, "stderr": str(exc), "duration_ms": _ms_since(started)}
        )
    if isinstance(out, ProcessResult):
        return verdict.model_copy(update=_process_fields(out))
    return verdict.model_copy(
        update={"exit_status": 0, "output": out, "duration_ms": _ms_since(started)}
    )


def _process_fields(out: ProcessResult) -> dict[str, Any]:
    """A process's outcome as the result's fields (its output decoded for the wire)."""
    return {
        "exit_status": out.exit_status,
        "stdout": out.stdout.decode(errors="replace"),
        "stderr": out.stderr.decode(errors="replace"),
        "truncated": out.truncated,
        "duration_ms": out.duration_ms,
        "limit": out.limit,
        "usage": out.usage,
    }


def _ms_since(started: float) -> float:
    return (time.perf_counter() - started) * 1000
