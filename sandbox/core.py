"""The sandbox's core: sessions and their workspaces, and one tool call end to end
(policy, faults, runtime, attestation). The HTTP layer is ``sandbox.service``.

The service's endpoints, for reference:

    GET    /health
    GET    /v1/tools                   every tool's JSON schema
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
import os
import secrets
import shutil
import sqlite3
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from sandbox.config import SandboxConfig
from sandbox.faults import Faults
from sandbox.policy import Decision
from sandbox.policy import Principal as Who
from sandbox.policy import Request as PolicyRequest
from sandbox.protocol import SessionCreate, ToolCall, ToolResult
from sandbox.runtime import RUNTIMES
from sandbox.runtime.base import ProcessResult, Runtime
from sandbox.runtime.bwrap import BwrapRuntime
from sandbox.runtime.warm import WarmPython
from sandbox.tools.fetch import EgressDenied, Resolver, system_resolver, target
from sandbox.tools.files import Escape, Workspace
from sandbox.tools.registry import TOOLS, Context
from sandbox.tools.sql import QueryRefused

log = logging.getLogger("gearshift.sandbox")


class HTTPError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


@dataclass
class Session:
    id: str
    tenant: str
    workspace: Workspace
    faults: Faults
    last_used: float = field(default_factory=time.monotonic)
    warm: WarmPython | None = None  # the session's resident interpreter, once started


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

    # -- sessions ------------------------------------------------------------

    def create(self, body: SessionCreate) -> Session:
        sid = body.session_id or secrets.token_hex(16)
        if sid in self.sessions:
            raise HTTPError(409, "conflict", f"session {sid!r} exists")
        root = (
            self.config.root
            / hashlib.sha256(f"{body.principal.tenant}\x00{sid}".encode()).hexdigest()[:32]
        )
        root.mkdir(parents=True, exist_ok=False, mode=0o700)
        os.chown(root, self.config.uid, self.config.gid)
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
            raise HTTPError(404, "not_found", f"no session {sid!r}")
        s.last_used = time.monotonic()
        return s

    async def remove(self, sid: str) -> None:
        s = self.sessions.pop(sid, None)
        if s is not None:
            if s.warm is not None:
                await s.warm.stop()
            shutil.rmtree(s.workspace.root, ignore_errors=True)

    async def expire(self) -> int:
        cutoff = time.monotonic() - self.config.session_ttl_s
        old = [sid for sid, s in self.sessions.items() if s.last_used < cutoff]
        for sid in old:
            await self.remove(sid)
        return len(old)

    # -- tool calls ----------------------------------------------------------

    async def call(self, name: str, body: ToolCall) -> ToolResult:
        tool = TOOLS.get(name)
        if tool is None:
            raise HTTPError(404, "unknown_tool", f"no tool {name!r}; see GET /v1/tools")
        session = self.get(body.session_id, body.principal.tenant)
        _check_args(name, tool.parameters, body.arguments)
        who = Who(body.principal.tenant, body.principal.key)
        decision = self.policy.decide(who, _policy_request(name, tool.path_arg, body))
        log.info(
            "tool %s for %s/%s in %s: %s by %s (%s)", name, who.tenant, who.key, session.id,
            "allowed" if decision.allowed else "denied", decision.rule, decision.reason,
        )  # fmt: skip
        result = await self._execute(name, body, session, decision)
        result.attestation = self.attest(name, body, result)
        return result

    async def _execute(
        self, name: str, body: ToolCall, session: Session, d: Decision
    ) -> ToolResult:
        base: dict[str, Any] = {"tool": name, "allowed": d.allowed, "rule": d.rule, "reason": d.reason,
                "risk": str(d.risk) if d.risk else None}  # fmt: skip
        if not d.allowed or d.resources is None:
            return ToolResult(**base)
        fault = session.faults.next()
        if fault is not None:
            return _injected(
                base, fault, session.faults.plan.retry_after_s if session.faults.plan else 1.0
            )
        if (
            name == "run_python"
            and self.config.warm
            and session.warm is None
            and isinstance(self.runtime, BwrapRuntime)
        ):
            session.warm = WarmPython(self.runtime, session.workspace.root, d.resources)
        ctx = Context(
            session.workspace, self.runtime, d.resources, session.warm, d.egress, self.resolve,
            {n: (db.path, tuple(db.statements)) for n, db in self.config.databases.items()},
        )  # fmt: skip
        started = time.perf_counter()
        try:
            out = await TOOLS[name].run(ctx, body.arguments)
        except Escape as exc:
            return ToolResult(**{**base, "allowed": False, "rule": "workspace", "reason": str(exc)})
        except EgressDenied as exc:
            return ToolResult(**{**base, "allowed": False, "rule": "egress", "reason": str(exc)})
        except QueryRefused as exc:
            return ToolResult(
                **{**base, "allowed": False, "rule": "sql broker", "reason": str(exc)}
            )
        except (OSError, ValueError, aiohttp.ClientError, sqlite3.Error) as exc:
            return ToolResult(
                **base,
                exit_status=1,
                stderr=str(exc),
                duration_ms=(time.perf_counter() - started) * 1000,
            )
        if isinstance(out, ProcessResult):
            return ToolResult(
                **base, exit_status=out.exit_status, stdout=out.stdout.decode(errors="replace"),
                stderr=out.stderr.decode(errors="replace"), truncated=out.truncated,
                duration_ms=out.duration_ms, limit=out.limit, usage=out.usage,
            )  # fmt: skip
        return ToolResult(
            **base, exit_status=0, output=out, duration_ms=(time.perf_counter() - started) * 1000
        )

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


def _injected(base: dict[str, Any], fault: str, retry_after: float) -> ToolResult:
    marked: dict[str, Any] = {**base, "fault": fault}
    if fault == "timeout":
        return ToolResult(
            **marked, exit_status=137, limit="wall_time", stderr="killed: wall time limit"
        )
    if fault == "rate_limit":
        return ToolResult(
            **marked,
            exit_status=None,
            retry_after_s=retry_after,
            stderr="rate limited; retry later",
        )
    if fault == "exception":
        return ToolResult(
            **marked, exit_status=1, stderr="RuntimeError: the tool failed unexpectedly"
        )
    if fault == "permission":
        return ToolResult(**{**marked, "allowed": False, "reason": "permission denied"})
    return ToolResult(**marked, exit_status=137, limit="memory", stderr="killed: out of memory")


def _policy_request(name: str, path_arg: str | None, body: ToolCall) -> PolicyRequest:
    args = body.arguments
    if name == "http_fetch":
        try:
            host, port = target(str(args["url"]))
        except EgressDenied:
            return PolicyRequest(name, approved=body.approved)  # no host: refused by the policy
        return PolicyRequest(name, approved=body.approved, host=host, port=port)
    if name == "sql_query":
        return PolicyRequest(name, approved=body.approved, database=str(args["database"]))
    path = args.get(path_arg) if path_arg else None
    return PolicyRequest(name, str(path or "."), body.approved)


def _check_args(name: str, schema: dict[str, Any], args: dict[str, Any]) -> None:
    props = schema.get("properties", {})
    for key in schema.get("required", []):
        if key not in args:
            raise HTTPError(400, "invalid_arguments", f"{name}: missing argument {key!r}")
    for key, value in args.items():
        if key not in props:
            raise HTTPError(400, "invalid_arguments", f"{name}: unknown argument {key!r}")
        want = {"string": str, "boolean": bool}.get(props[key].get("type"), object)
        if not isinstance(value, want):
            raise HTTPError(
                400, "invalid_arguments", f"{name}: {key!r} must be a {props[key]['type']}"
            )
