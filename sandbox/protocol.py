"""The sandbox service's wire models (typed request/response, unknown fields refused), and
``scoped_id``, the per-tenant id both the gateway and the sandbox give a named session."""

from __future__ import annotations

import hashlib
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

FaultKind = Literal["timeout", "rate_limit", "exception", "permission", "exhaustion"]


def scoped_id(tenant: str, name: str) -> str:
    """The stable per-tenant id of a tenant's named session or workspace: the gateway's
    trajectory store and the sandbox both give it this id, so one tenant's names never meet
    another's. 32 hex digits of ``sha256(tenant NUL name)``."""
    return hashlib.sha256(f"{tenant}\x00{name}".encode()).hexdigest()[:32]


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Principal(Model):
    tenant: str = Field(min_length=1, max_length=128)
    key: str = Field(min_length=1, max_length=128)


class FaultRule(Model):
    kind: FaultKind
    probability: float = Field(default=0.0, ge=0.0, le=1.0)


class FaultPlan(Model):
    """Faults for an RL environment: each call draws from ``rules`` (seeded), or follows
    ``script`` (one entry per call, ``null`` for no fault) while it lasts."""

    seed: int = 0
    rules: list[FaultRule] = Field(default_factory=list, max_length=16)
    script: list[FaultKind | None] = Field(default_factory=list, max_length=10_000)
    retry_after_s: float = Field(default=1.0, ge=0, le=3600)


class SessionCreate(Model):
    principal: Principal
    session_id: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.-]{1,128}$")
    faults: FaultPlan | None = None


class ToolCall(Model):
    principal: Principal
    session_id: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,128}$")
    arguments: dict[str, Any] = Field(default_factory=dict)
    approved: bool = False


class ToolResult(Model):
    tool: str
    allowed: bool
    rule: str
    reason: str
    risk: str | None = None
    exit_status: int | None = None
    stdout: str = ""
    stderr: str = ""
    truncated: bool = False
    duration_ms: float = 0.0
    limit: str | None = None
    usage: dict[str, float] = Field(default_factory=dict)
    output: Any = None  # structured output of file tools
    fault: FaultKind | None = None
    retry_after_s: float | None = None
    attestation: str = ""
