"""The sandbox service's wire models (typed request/response, unknown fields refused), and
what the gateway shares with it on the wire: ``scoped_id``, the per-tenant id both give a
named session; ``read_limited``, a request body read under a size limit; and
``describe_validation``, a validation error told in one sentence naming the parameter."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterable, Callable, Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

FaultKind = Literal["timeout", "rate_limit", "exception", "permission", "exhaustion"]


def scoped_id(tenant: str, name: str) -> str:
    """The stable per-tenant id of a tenant's named session or workspace: the gateway's
    trajectory store and the sandbox both give it this id, so one tenant's names never meet
    another's. 32 hex digits of ``sha256(tenant NUL name)``."""
    return hashlib.sha256(f"{tenant}\x00{name}".encode()).hexdigest()[:32]


async def read_limited(
    chunks: AsyncIterable[bytes],
    limit: int,
    declared: str | None,
    too_large: Callable[[str], Exception],
) -> bytes:
    """A body read while it streams in, refused (``too_large(message)``) as soon as its
    declared length (``content-length``) or the bytes read so far pass ``limit``."""
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large(f"request body of {declared} bytes exceeds the limit of {limit} bytes")
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise too_large(f"request body exceeds the limit of {limit} bytes")
        parts.append(chunk)
    return b"".join(parts)


def _is_branch_tag(part: str) -> bool:
    return part[:1].islower() and ("[" in part or part in {"str", "int", "dict", "list", "bool"})


def describe_validation(
    errors: Sequence[Mapping[str, Any]], skip: tuple[str, ...] = ()
) -> tuple[str, str | None]:
    """One readable sentence for the first of pydantic's validation errors, and the
    offending parameter's dotted path; ``skip`` drops location parts (FastAPI's "body")."""
    if not errors:
        return "invalid request", None
    first = errors[0]
    if first["loc"] and _is_branch_tag(str(first["loc"][-1])):
        # A value no branch of a union accepted: pydantic lists each branch's complaint; the
        # one that got deepest into the value says what is wrong (content parts whose text
        # is not a string, rather than "content should be a string").
        base = first["loc"][:-1]
        first = max(
            (e for e in errors if e["loc"][: len(base)] == base), key=lambda e: len(e["loc"])
        )
    # Drop pydantic's union-branch tags ('str', 'list[...]') from the path.
    loc = [str(p) for p in first["loc"] if not _is_branch_tag(str(p)) and p not in skip]
    param = ".".join(loc) or None
    got = first.get("input")
    got_text = (
        f" (got {type(got).__name__} {str(got)[:60]!r})" if first["type"] != "missing" else ""
    )
    where = f"'{param}': " if param else ""
    return f"{where}{first['msg']}{got_text}", param


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


class GrantQuery(Model):
    principal: Principal


class ToolCall(Model):
    principal: Principal
    session_id: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,128}$")
    arguments: dict[str, Any] = Field(default_factory=dict)
    approved: bool = False
    # No such session yet: create it for the principal's tenant (as POST /v1/sessions
    # would, without a fault plan of its own) instead of answering 404.
    create_session: bool = False


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
