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
If the isolation runtime is unavailable, or another service holds the workspace root
(``sandbox.rootlock``), the service refuses to start.
"""

from __future__ import annotations

import asyncio
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
from sandbox.pool import Pool
from sandbox.protocol import SessionCreate, ToolCall, ToolResult, scoped_id
from sandbox.rootlock import RootLock
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
CLOSING_AT_ONCE = 32
WARM_TOOLS = tuple(name for name, tool in TOOLS.items() if tool.warm)  # run_python, run_shell


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
        self.pool: Pool | None = None  # spare warm sandboxes, for bwrap's warm sessions
        if isinstance(self.runtime, BwrapRuntime) and config.warm and config.pool > 0:
            self.pool = Pool(self.workspaces, self.runtime, config.pool, config.kernel_usage)
        # One service per root, before anything under it is touched (``sandbox.rootlock``);
        # then the workspaces a previous one left (it crashed, or was killed) are swept.
        try:
            self.lock = RootLock(config.root)
            try:
                stale = sweep(config.root)
            except BaseException:
                self.lock.release()
                raise
        except PermissionError as exc:  # not root: say so, not a traceback
            raise RuntimeUnavailable(
                f"cannot lock or clear old workspaces under {config.root} ({exc}); the "
                "sandbox service runs as root (it mounts workspaces and sets up cgroups)"
            ) from None
        if stale:
            log.info("removed %d workspaces left under %s", stale, config.root)

    # -- sessions ------------------------------------------------------------

    def start_pool(self) -> None:
        """Start filling the pool of spare warm sandboxes (in a running event loop)."""
        if self.pool is not None:
            self.pool.start(self._shapes())

    def _shapes(self) -> list[ResourceClass]:
        """The resource classes of the grants a warm session can start under."""
        grants = [*self.policy.by_key.values(), *self.policy.by_tenant.values()]
        return [g.resources for g in grants if g.tools & set(WARM_TOOLS)]

    def _shape(self, who: Who) -> ResourceClass | None:
        """The resource class ``who``'s warm session would start its runner with."""
        for tool in WARM_TOOLS:
            d = self.policy.decide(who, TOOLS[tool].policy_request({}, True))
            if d.allowed and d.resources is not None:
                return d.resources
        return None

    def create(self, body: SessionCreate) -> Session:
        sid = body.session_id or secrets.token_hex(16)
        if sid in self.sessions:
            raise SessionExists(f"session {sid!r} exists")
        who = Who(body.principal.tenant, body.principal.key)
        shape = self._shape(who) if self.pool is not None else None
        spare = self.pool.take(shape) if self.pool is not None and shape is not None else None
        root = spare.root if spare else self.workspaces.create(scoped_id(who.tenant, sid))
        s = Session(
            sid,
            who.tenant,
            Workspace(root, self.config.uid, self.config.gid),
            Faults(body.faults or self.config.faults_by_tenant.get(who.tenant)),
            warm=spare.warm if spare else None,
        )
        self.sessions[sid] = s
        return s

    def _session_for(self, body: ToolCall) -> Session:
        """The call's session; created for the caller's tenant when it asks for that."""
        if body.create_session and body.session_id not in self.sessions:
            return self.create(SessionCreate(principal=body.principal, session_id=body.session_id))
        return self.get(body.session_id, body.principal.tenant)

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

    async def close(self) -> None:
        """Stop the pool and remove every session (service shutdown). Workspaces are
        unmounted first, all at once (a runner still inside keeps its own view until it
        stops): a service killed while it stops hundreds of runners leaves no mount on the
        host; the runners die with it (bubblewrap's ``--die-with-parent``). The root's
        lock goes last."""
        if self.pool is not None:
            await self.pool.close()
        sessions = list(self.sessions.values())
        self.sessions.clear()
        for s in sessions:
            self.workspaces.remove(s.workspace.root)
        gate = asyncio.Semaphore(CLOSING_AT_ONCE)

        async def stop(warm: WarmPython) -> None:
            async with gate:
                await warm.stop()

        await asyncio.gather(*(stop(s.warm) for s in sessions if s.warm is not None))
        self.lock.release()  # last: another service may start on the root now

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
        session = self._session_for(body)
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
            others = [
                s.workspace.root
                for s in self.sessions.values()
                if s.tenant == t and s is not session  # identity: no path comparisons
            ]
            self.workspaces.share(root, others)
            result = await _run(tool, ctx, body.arguments, verdict)
        finally:
            session.busy -= 1
            session.last_used = time.monotonic()
            self.workspaces.changed(root)
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
            session.warm = WarmPython(
                self.runtime, session.workspace.root, limits, self.config.kernel_usage
            )
        return Context(
            session.workspace, self.runtime, limits, session.warm, egress, self.resolve,
            {n: (db.path, tuple(db.statements)) for n, db in self.config.databases.items()},
        )  # fmt: skip

    def attest(self, name: str, body: ToolCall, result: ToolResult) -> str:
        """HMAC-SHA256 (keyed with the service token) over the request and the result."""
        payload = orjson.dumps(
            {
                "tool": name,
                "request": body.model_dump(exclude={"create_session"}),  # transport, not the call
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
