"""Permissions, deny by default. Pure: no I/O, no clock, no randomness.

A ``Policy`` holds grants keyed by API key name or tenant (the key's grant wins).
A grant lists the tools it allows, the workspace paths it may read and write
(glob patterns relative to the workspace), the resource class its processes get,
and the risk classes that need an approval. Every decision names the rule that
made it; nothing outside a grant is allowed, and there is no switch a request
can flip to turn checking off.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import posixpath
from dataclasses import dataclass, field
from enum import StrEnum


class Risk(StrEnum):
    READ_ONLY = "read-only"
    MUTATING = "mutating"
    EGRESS = "egress"
    DESTRUCTIVE = "destructive"


TOOL_RISK: dict[str, Risk] = {
    "read_file": Risk.READ_ONLY,
    "list_dir": Risk.READ_ONLY,
    "write_file": Risk.MUTATING,
    "run_python": Risk.DESTRUCTIVE,  # arbitrary code: it can delete the workspace
    "run_shell": Risk.DESTRUCTIVE,
    "http_fetch": Risk.EGRESS,
    "sql_query": Risk.READ_ONLY,
}

PATH_ACCESS: dict[str, str] = {"read_file": "read", "list_dir": "read", "write_file": "write"}


@dataclass(frozen=True, slots=True)
class ResourceClass:
    cpu_s: float = 10.0  # CPU seconds (rlimit and cgroup quota)
    memory_mb: int = 256
    pids: int = 64
    wall_s: float = 30.0
    output_bytes: int = 64 * 1024  # per stream, then truncated with a marker
    file_mb: int = 64  # largest file a process may write


@dataclass(frozen=True, slots=True)
class Egress:
    """Where ``http_fetch`` may go. Addresses are checked again after DNS resolution
    (``sandbox.tools.fetch``): private, loopback, link-local and metadata addresses are
    refused unless ``private`` is set or a CIDR here names them."""

    domains: tuple[str, ...] = ()  # exact names or "*.example.com"
    cidrs: tuple[str, ...] = ()
    ports: tuple[int, ...] = (443, 80)
    private: bool = False


@dataclass(frozen=True, slots=True)
class Grant:
    tools: frozenset[str] = frozenset()
    read: tuple[str, ...] = ()  # glob patterns relative to the workspace
    write: tuple[str, ...] = ()
    resources: ResourceClass = ResourceClass()
    approval: frozenset[Risk] = frozenset()  # risk classes that need an approval
    egress: Egress = Egress()
    databases: frozenset[str] = frozenset()  # names the SQL broker knows


@dataclass(frozen=True, slots=True)
class Principal:
    tenant: str
    key: str


@dataclass(frozen=True, slots=True)
class Request:
    tool: str
    path: str | None = None  # for file tools, relative to the workspace
    approved: bool = False  # an approval token was checked by the caller
    host: str | None = None  # for http_fetch
    port: int | None = None
    database: str | None = None  # for sql_query


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    rule: str  # which grant or default decided
    reason: str
    risk: Risk | None = None
    resources: ResourceClass | None = None
    egress: Egress | None = None


@dataclass(frozen=True, slots=True)
class Policy:
    by_key: dict[str, Grant] = field(default_factory=dict)
    by_tenant: dict[str, Grant] = field(default_factory=dict)

    def grant_for(self, who: Principal) -> tuple[str, Grant] | None:
        if who.key in self.by_key:
            return f"key:{who.key}", self.by_key[who.key]
        if who.tenant in self.by_tenant:
            return f"tenant:{who.tenant}", self.by_tenant[who.tenant]
        return None

    def held_for_approval(self, who: Principal) -> dict[str, Risk]:
        """The granted tools whose risk class this principal's grant holds for an
        approval, with that class: a caller asks a human before it calls them (with
        ``approved``), instead of learning it from a denial."""
        found = self.grant_for(who)
        if found is None:
            return {}
        grant = found[1]
        return {t: r for t, r in TOOL_RISK.items() if t in grant.tools and r in grant.approval}

    def decide(self, who: Principal, req: Request) -> Decision:
        risk = TOOL_RISK.get(req.tool)
        if risk is None:
            return Decision(False, "default", f"unknown tool {req.tool!r}")
        found = self.grant_for(who)
        if found is None:
            return Decision(
                False, "default", f"no grant for key {who.key!r} or tenant {who.tenant!r}", risk
            )
        rule, grant = found
        if req.tool not in grant.tools:
            return Decision(False, rule, f"tool {req.tool!r} is not granted", risk)
        if risk in grant.approval and not req.approved:
            return Decision(False, rule, f"{risk} tools need an approval", risk)
        problem = _problem(req, grant)
        if problem:
            return Decision(False, rule, problem, risk)
        return Decision(True, rule, "granted", risk, grant.resources, grant.egress)


def normalize(path: str | None) -> str | None:
    """A workspace-relative path without '.', or None when it leaves the workspace."""
    if path is None or path.startswith("/") or "\x00" in path:
        return None
    norm = posixpath.normpath(path)
    if norm == ".." or norm.startswith("../"):
        return None
    return norm


def _problem(req: Request, grant: Grant) -> str | None:
    access = PATH_ACCESS.get(req.tool)
    if access is not None:
        return _path_problem(req.path, grant.read if access == "read" else grant.write, access)
    if req.tool == "http_fetch":
        return _egress_problem(req.host, req.port, grant.egress)
    if req.tool == "sql_query" and req.database not in grant.databases:
        return f"database {req.database!r} is not granted"
    return None


def _egress_problem(host: str | None, port: int | None, egress: Egress) -> str | None:
    if not host:
        return "no host to fetch from"
    if port not in egress.ports:
        return f"port {port} is not granted"
    name = host.lower().rstrip(".")
    for pattern in egress.domains:
        if name == pattern or (pattern.startswith("*.") and name.endswith(pattern[1:])):
            return None
    if _in_cidrs(name, egress.cidrs):
        return None
    return f"host {host!r} is not in the egress allowlist"


def _in_cidrs(host: str, cidrs: tuple[str, ...]) -> bool:
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return False
    return any(addr in ipaddress.ip_network(c, strict=False) for c in cidrs)


def _path_problem(path: str | None, patterns: tuple[str, ...], access: str) -> str | None:
    norm = normalize(path)
    if norm is None:
        return f"path {path!r} is not inside the workspace"
    if not any(fnmatch.fnmatchcase(norm, p) for p in patterns):
        return f"{access} access to {norm!r} is not granted"
    return None
