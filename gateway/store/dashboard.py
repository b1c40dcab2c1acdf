"""The reads behind the operators' dashboard: traffic over time, latency per tier, recent
sessions and one session's episode timeline.

Time series are bucketed by the database (seconds since the epoch, divided by the bucket
width), so a day of traffic is a few hundred rows whatever the request rate. Latency
percentiles are computed here from the most recent ``LATENCY_SAMPLE`` model calls of the
window: SQLite has no percentile function, and a dashboard needs the shape, not every row.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Integer, case, cast, func, select
from sqlalchemy.sql import ColumnElement

from gateway.store.schema import sessions, steps, tool_calls

LATENCY_SAMPLE = 20_000
TIERS = ("full", "fast")


@dataclass
class Bucket:
    start: datetime
    calls: dict[str, int] = field(default_factory=dict)  # by tier
    mean_ms: dict[str, float] = field(default_factory=dict)
    mean_ttft_ms: dict[str, float] = field(default_factory=dict)
    escalated: int = 0
    fallbacks: int = 0
    errors: int = 0


def _epoch(col: Any) -> ColumnElement[Any]:
    return cast(func.extract("epoch", col), Integer)


def _first_choices(
    since: datetime, until: datetime | None, tenant: str | None
) -> list[ColumnElement[bool]]:
    cond = [steps.c.choice_index == 0, steps.c.created_at >= since]
    if until is not None:
        cond.append(steps.c.created_at < until)
    if tenant is not None:
        cond.append(steps.c.tenant_id == tenant)
    return cond


def traffic(
    conn: Connection,
    *,
    since: datetime,
    until: datetime | None = None,
    bucket_s: int,
    tenant: str | None = None,
) -> list[Bucket]:
    """Model calls per bucket and tier, their mean latency and TTFT, escalations,
    fallbacks and errors; buckets with no traffic are left out."""
    slot = (_epoch(steps.c.created_at) / bucket_s).label("slot")
    tier = func.coalesce(steps.c.tier, "none").label("tier")
    rows = conn.execute(
        select(
            slot,
            tier,
            func.count().label("n"),
            func.avg(steps.c.duration_ms).label("ms"),
            func.avg(steps.c.ttft_ms).label("ttft"),
            func.sum(case((steps.c.escalated, 1), else_=0)).label("escalated"),
            func.sum(case((steps.c.fallback, 1), else_=0)).label("fallbacks"),
            func.sum(case((steps.c.status != 200, 1), else_=0)).label("errors"),
        )
        .where(*_first_choices(since, until, tenant))
        .group_by(slot, tier)
        .order_by(slot)
    ).all()
    buckets: dict[int, Bucket] = {}
    for r in rows:
        b = buckets.setdefault(
            int(r.slot), Bucket(datetime.fromtimestamp(int(r.slot) * bucket_s, UTC))
        )
        b.calls[r.tier] = int(r.n)
        if r.ms is not None:
            b.mean_ms[r.tier] = float(r.ms)
        if r.ttft is not None:
            b.mean_ttft_ms[r.tier] = float(r.ttft)
        b.escalated += int(r.escalated or 0)
        b.fallbacks += int(r.fallbacks or 0)
        b.errors += int(r.errors or 0)
    return [buckets[k] for k in sorted(buckets)]


def _percentile(sorted_values: list[float], q: float) -> float:
    i = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[i]


def latency(
    conn: Connection, *, since: datetime, until: datetime | None = None, tenant: str | None = None
) -> dict[str, dict[str, float | int]]:
    """Per tier: calls, p50/p95/p99 of time to the last byte and p50 of time to the first,
    over the window's most recent ``LATENCY_SAMPLE`` successful model calls."""
    rows = conn.execute(
        select(steps.c.tier, steps.c.duration_ms, steps.c.ttft_ms)
        .where(*_first_choices(since, until, tenant), steps.c.status == 200)
        .order_by(steps.c.created_at.desc())
        .limit(LATENCY_SAMPLE)
    ).all()
    out: dict[str, dict[str, float | int]] = {}
    for tier in TIERS:
        total = sorted(float(r.duration_ms) for r in rows if r.tier == tier)
        if not total:
            continue
        first = sorted(float(r.ttft_ms) for r in rows if r.tier == tier and r.ttft_ms is not None)
        out[tier] = {
            "calls": len(total),
            "p50_ms": _percentile(total, 0.5),
            "p95_ms": _percentile(total, 0.95),
            "p99_ms": _percentile(total, 0.99),
            **({"ttft_p50_ms": _percentile(first, 0.5)} if first else {}),
        }
    return out


def recent_sessions(
    conn: Connection, *, tenant: str | None = None, limit: int = 50, before: datetime | None = None
) -> list[dict[str, Any]]:
    """The latest sessions, newest first, with their step and tier counts."""
    per_step = (
        select(
            steps.c.session_id.label("sid"),
            func.count().label("steps"),
            func.sum(case((steps.c.tier == "fast", 1), else_=0)).label("fast"),
            func.sum(case((steps.c.status != 200, 1), else_=0)).label("errors"),
        )
        .where(steps.c.choice_index == 0)
        .group_by(steps.c.session_id)
        .subquery()
    )
    q = (
        select(
            sessions.c.id,
            sessions.c.tenant_id,
            sessions.c.api_key,
            sessions.c.external_id,
            sessions.c.task_id,
            sessions.c.status,
            sessions.c.outcome,
            sessions.c.created_at,
            func.coalesce(per_step.c.steps, 0).label("steps"),
            func.coalesce(per_step.c.fast, 0).label("fast"),
            func.coalesce(per_step.c.errors, 0).label("errors"),
        )
        .select_from(sessions.outerjoin(per_step, per_step.c.sid == sessions.c.id))
        .order_by(sessions.c.created_at.desc(), sessions.c.id)
        .limit(limit)
    )
    if tenant is not None:
        q = q.where(sessions.c.tenant_id == tenant)
    if before is not None:
        q = q.where(sessions.c.created_at < before)
    return [dict(r._mapping) for r in conn.execute(q)]


def episode(conn: Connection, session_id: str) -> dict[str, Any] | None:
    """A session and its timeline: each model call (first choice) in order with its tier,
    routing reason, tokens and timing, and the tool calls it made with their results."""
    head = conn.execute(select(sessions).where(sessions.c.id == session_id)).first()
    if head is None:
        return None
    calls: dict[str, list[dict[str, Any]]] = {}
    for r in conn.execute(
        select(
            tool_calls.c.step_id,
            tool_calls.c.call_id,
            tool_calls.c.tool,
            tool_calls.c.arguments,
            tool_calls.c.status,
            tool_calls.c.exit_status,
            tool_calls.c.duration_ms,
            tool_calls.c.denial,
            tool_calls.c.injected_fault,
            tool_calls.c.attestation,
            tool_calls.c.result,
        )
        .where(tool_calls.c.session_id == session_id)
        .order_by(tool_calls.c.created_at)
    ):
        calls.setdefault(r.step_id, []).append(dict(r._mapping))
    timeline = []
    for r in conn.execute(
        select(
            steps.c.id,
            steps.c.seq,
            steps.c.tier,
            steps.c.model,
            steps.c.policy,
            steps.c.route_reason,
            steps.c.escalated,
            steps.c.fallback,
            steps.c.status,
            steps.c.finish_reason,
            steps.c.prompt_tokens,
            steps.c.completion_tokens,
            steps.c.ttft_ms,
            steps.c.duration_ms,
            steps.c.error,
            steps.c.created_at,
        )
        .where(steps.c.session_id == session_id, steps.c.choice_index == 0)
        .order_by(steps.c.seq)
    ):
        timeline.append(dict(r._mapping) | {"tool_calls": calls.get(r.id, [])})
    return {"session": dict(head._mapping), "steps": timeline}
