"""The sandbox service's configuration (a section of the gateway's ``Settings``)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from sandbox.policy import Egress, Grant, Policy, ResourceClass, Risk
from sandbox.protocol import FaultPlan
from sandbox.workspace import Quota


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Resources(Section):
    cpu_s: float = Field(default=10.0, gt=0, le=3600)
    memory_mb: int = Field(default=256, ge=16, le=65536)
    pids: int = Field(default=64, ge=4, le=4096)
    wall_s: float = Field(default=30.0, gt=0, le=3600)
    output_bytes: int = Field(default=64 * 1024, ge=1024, le=64 << 20)
    file_mb: int = Field(default=64, ge=1, le=65536)


class EgressConfig(Section):
    domains: list[str] = Field(default_factory=list, description='names or "*.example.com"')
    cidrs: list[str] = Field(default_factory=list)
    ports: list[int] = Field(default_factory=lambda: [443, 80])
    private: bool = Field(default=False, description="allow private/loopback/link-local targets")


class DatabaseConfig(Section):
    """A database the SQL broker opens for tools (read-only); only the broker knows where."""

    path: Path = Field(description="SQLite file")
    statements: list[str] = Field(default_factory=lambda: ["select", "with", "explain"])


class WorkspaceQuota(Section):
    """Limits on what workspaces hold, enforced by the kernel (each workspace is a tmpfs of
    this size; see docs/decisions/sandbox-workspace-quotas.md). Workspace data is in memory."""

    mb: int = Field(default=256, ge=1, le=1 << 20, description="bytes one workspace holds, MiB")
    inodes: int = Field(default=16384, ge=16, le=1 << 30, description="files and directories")
    tenant_mb: int = Field(
        default=2048, ge=1, le=1 << 24, description="all of one tenant's workspaces, MiB"
    )
    tenant_inodes: int = Field(default=131072, ge=16, le=1 << 32)

    def each(self) -> Quota:
        return Quota(self.mb << 20, self.inodes)

    def tenant(self) -> Quota:
        return Quota(self.tenant_mb << 20, self.tenant_inodes)


class GrantConfig(Section):
    tools: list[str] = Field(default_factory=list)
    egress: EgressConfig = EgressConfig()
    databases: list[str] = Field(default_factory=list)
    read: list[str] = Field(default_factory=list, description="glob patterns in the workspace")
    write: list[str] = Field(default_factory=list)
    resources: Resources = Resources()
    approval: list[Risk] = Field(default_factory=list)

    def grant(self) -> Grant:
        r, e = self.resources, self.egress
        return Grant(
            frozenset(self.tools), tuple(self.read), tuple(self.write),
            ResourceClass(r.cpu_s, r.memory_mb, r.pids, r.wall_s, r.output_bytes, r.file_mb),
            frozenset(self.approval),
            Egress(tuple(e.domains), tuple(e.cidrs), tuple(e.ports), e.private),
            frozenset(self.databases),
        )  # fmt: skip


class SandboxConfig(Section):
    enabled: bool = Field(
        default=True, description="`gearshift serve` starts the sandbox service (needs root)"
    )
    token: SecretStr | None = Field(
        default=None, description="shared secret of gateway and sandbox; generated when unset"
    )

    @field_validator("token")
    @classmethod
    def _real_secret(cls, v: SecretStr | None) -> SecretStr | None:
        """A masked dump of a secret (``**********``) is never a token."""
        if v is not None and set(v.get_secret_value()) <= {"*"}:
            raise ValueError("the sandbox token is a masked placeholder, not a secret")
        return v

    external: str | None = Field(
        default=None,
        description="URL of a sandbox service run apart (`gearshift sandbox` in its own "
        "container or pod), e.g. http://gearshift-sandbox:8200: `gearshift serve` starts none, "
        "and at start-up checks this one's /health and that it takes sandbox.token",
    )
    external_wait_s: float = Field(
        default=60.0, gt=0, le=3600, description="how long start-up waits for sandbox.external"
    )

    @field_validator("external")
    @classmethod
    def _external_url(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("http://", "https://")):
            raise ValueError(f"sandbox.external {v!r} must start with http:// or https://")
        return None if v is None else v.rstrip("/")

    @model_validator(mode="after")
    def _external_token(self) -> SandboxConfig:
        if self.external is not None and self.token is None:
            raise ValueError(
                "sandbox.external needs the service's token: set sandbox.token or "
                "sandbox.token_file (a secret file)"
            )
        return self

    socket: Path | None = Field(default=None, description="Unix socket to listen on")
    host: str = "127.0.0.1"
    port: int = Field(default=8200, gt=0, lt=65536)
    root: Path = Field(
        default=Path("/var/lib/gearshift-sandbox"), description="where session workspaces live"
    )
    runtime: Literal["bwrap", "gvisor"] = Field(
        default="bwrap",
        description="bwrap: bubblewrap + seccomp + cgroups (fast, warm sessions); gvisor: runsc, "
        "a user-space kernel (stronger boundary, about 200 ms a start)",
    )
    uid: int = Field(default=65534, ge=1, description="the unprivileged host user code runs as")
    gid: int = Field(default=65534, ge=1)
    session_ttl_s: float = Field(
        default=3600.0,
        gt=0,
        description="a session idle this long is removed, its workspace with it (checked "
        "every 30 s or session_ttl_s, whichever is shorter)",
    )
    workspace: WorkspaceQuota = WorkspaceQuota()
    warm: bool = Field(
        default=True,
        description="keep one resident interpreter per session for run_python and run_shell "
        "(a few ms a call instead of 30-90 ms); each call still runs in a fresh forked process",
    )
    kernel_usage: bool = Field(
        default=False,
        description="a warm call's CPU and memory from the kernel (a call cgroup per session: "
        "processes the call forks and never waits for are charged) instead of the forked "
        "child's own report; costs about 0.4-0.5 CPU-ms and 2-3 ms per warm call on 2 cores "
        "(docs/decisions/sandbox-warm-usage.md)",
    )
    pool: int = Field(
        default=2,
        ge=0,
        le=64,
        description="spare warm sandboxes (workspace + resident interpreter, never used) kept "
        "started per resource class of the grants that allow run_python or run_shell, handed "
        "to new sessions (bwrap with warm only; 0: none)",
    )
    databases: dict[str, DatabaseConfig] = Field(default_factory=dict)
    faults_by_tenant: dict[str, FaultPlan] = Field(
        default_factory=dict,
        description="fault plans for RL environments, applied to every session of the tenant "
        "that does not bring its own",
    )
    grants_by_key: dict[str, GrantConfig] = Field(default_factory=dict)
    grants_by_tenant: dict[str, GrantConfig] = Field(default_factory=dict)

    def policy(self) -> Policy:
        return Policy(
            {k: g.grant() for k, g in self.grants_by_key.items()},
            {t: g.grant() for t, g in self.grants_by_tenant.items()},
        )
