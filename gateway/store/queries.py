"""Tenant-scoped reads and the small writes behind the trajectory endpoints.

Every function takes the caller's tenant and filters on it: a row of another
tenant is indistinguishable from a row that does not exist (``NotFound``).
"""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import Connection, insert, select, update

from gateway.store import codec, prompt_refs
from gateway.store import rewards as reward_fns
from gateway.store.rows import insert_ignore, now_utc, session_key
from gateway.store.schema import feedback, sessions, steps, tenants, tool_calls
from gateway.store.schema import rewards as rewards_t


class NotFound(Exception):
    """No such session or step for this tenant."""


def _session_row(conn: Connection, tenant: str, ident: str) -> Any:
    """By the client's session name first, then by the internal id."""
    for cond in (sessions.c.id == session_key(tenant, ident), sessions.c.id == ident):
        row = conn.execute(select(sessions).where(cond, sessions.c.tenant_id == tenant)).first()
        if row is not None:
            return row
    raise NotFound(f"no session {ident!r}")


def start_session(
    conn: Connection,
    tenant: str,
    api_key: str,
    external: str | None,
    task_id: str | None,
    group_id: str | None,
    expected_actions: list[dict[str, Any]] | None,
) -> dict[str, Any]:
    external = external or uuid.uuid4().hex
    sid = session_key(tenant, external)
    insert_ignore(conn, tenants, [{"id": tenant, "created_at": now_utc()}])
    if conn.execute(select(sessions.c.id).where(sessions.c.id == sid)).first() is not None:
        raise FileExistsError(f"session {external!r} already exists")
    spec = {"expected_actions": expected_actions} if expected_actions is not None else None
    conn.execute(
        insert(sessions).values(
            id=sid, tenant_id=tenant, api_key=api_key, external_id=external, task_id=task_id,
            group_id=group_id, task_spec=spec, status="open", created_at=now_utc(),
        )
    )  # fmt: skip
    return {"id": external, "session_id": sid, "task_id": task_id, "group_id": group_id}


def end_session(
    conn: Connection, tenant: str, ident: str, outcome: str | None, reward: float | None
) -> dict[str, Any]:
    """Close a session and add its session-level rewards (API correctness, outcome)."""
    row = _session_row(conn, tenant, ident)
    now = now_utc()
    conn.execute(
        update(sessions)
        .where(sessions.c.id == row.id)
        .values(status="ended", outcome=outcome, ended_at=now)
    )
    out: dict[str, float] = {}
    spec = row.task_spec or {}
    if spec.get("expected_actions") is not None:
        made = conn.execute(
            select(tool_calls.c.tool, tool_calls.c.arguments)
            .where(tool_calls.c.session_id == row.id)
            .order_by(tool_calls.c.created_at)
        ).all()
        out["api_correctness"] = reward_fns.api_correctness(
            spec["expected_actions"], [(t, a) for t, a in made]
        )
    if reward is not None:
        out["outcome"] = reward
    for name, value in out.items():
        conn.execute(
            insert(rewards_t).values(
                tenant_id=tenant, session_id=row.id, scope="session", name=name, value=value,
                source="client" if name == "outcome" else "gateway", created_at=now,
            )
        )  # fmt: skip
    return {
        "id": ident,
        "session_id": row.id,
        "status": "ended",
        "outcome": outcome,
        "rewards": out,
    }


def add_feedback(
    conn: Connection,
    tenant: str,
    *,
    session: str | None,
    step: str | None,
    score: float,
    label: str | None,
    comment: str | None,
) -> dict[str, Any]:
    if step is not None:
        srow = conn.execute(
            select(steps.c.session_id).where(steps.c.id == step, steps.c.tenant_id == tenant)
        ).first()
        if srow is None:
            raise NotFound(f"no step {step!r}")
        sid = str(srow[0])
    else:
        assert session is not None
        sid = _session_row(conn, tenant, session).id
    now = now_utc()
    fid = conn.execute(
        insert(feedback).values(
            tenant_id=tenant, session_id=sid, step_id=step, score=score, label=label,
            comment=comment, created_at=now,
        )
    ).inserted_primary_key  # fmt: skip
    conn.execute(
        insert(rewards_t).values(
            tenant_id=tenant, session_id=sid, step_id=step, scope="step" if step else "session",
            name="user_feedback", value=score, source="feedback", created_at=now,
        )
    )  # fmt: skip
    return {"id": fid[0] if fid else None, "session_id": sid, "step_id": step, "score": score}


def get_step(conn: Connection, tenant: str, step_id: str) -> dict[str, Any]:
    row = conn.execute(
        select(steps).where(steps.c.id == step_id, steps.c.tenant_id == tenant)
    ).first()
    if row is None:
        raise NotFound(f"no step {step_id!r}")
    prompts = prompt_refs.prompt_ids(conn, [row._mapping])
    return step_view(row._mapping, prompts[step_id])


def get_session(conn: Connection, tenant: str, ident: str) -> dict[str, Any]:
    row = _session_row(conn, tenant, ident)
    rows = conn.execute(
        select(steps)
        .where(steps.c.session_id == row.id)
        .order_by(steps.c.seq, steps.c.choice_index)
    ).all()
    prompts = prompt_refs.prompt_ids(conn, [r._mapping for r in rows])
    rw = conn.execute(
        select(rewards_t.c.scope, rewards_t.c.name, rewards_t.c.value, rewards_t.c.step_id)
        .where(rewards_t.c.session_id == row.id)
        .order_by(rewards_t.c.id)
    ).all()
    m = row._mapping
    return {
        "session_id": m["id"],
        "id": m["external_id"],
        "task_id": m["task_id"],
        "group_id": m["group_id"],
        "status": m["status"],
        "outcome": m["outcome"],
        "steps": [step_view(r._mapping, prompts[r.id]) for r in rows],
        "rewards": [dict(r._mapping) for r in rw],
    }


def step_view(m: Any, prompt_ids: list[int] | None) -> dict[str, Any]:
    """A step as the API shows it (token arrays decoded; the whole prompt's ids, rebuilt by
    ``prompt_refs``)."""
    return {
        "id": m["id"],
        "session_id": m["session_id"],
        "seq": m["seq"],
        "choice_index": m["choice_index"],
        "request_id": m["request_id"],
        "tier": m["tier"],
        "model": m["model"],
        "status": m["status"],
        "finish_reason": m["finish_reason"],
        "route_reason": m["route_reason"],
        "policy": m["policy"],
        "propensity": m["propensity"],
        "features": m["features"],
        "rewritten": m["rewritten"],
        "escalated": m["escalated"],
        "fallback": m["fallback"],
        "response": m["response"],
        "prompt_token_ids": prompt_ids,
        "completion_token_ids": codec.unpack_ids(m["completion_token_ids"]),
        "logprobs": codec.unpack_floats(m["logprobs"]),
        "created_at": m["created_at"].isoformat() if m["created_at"] else None,
    }


def record_tool_result(
    conn: Connection,
    tenant: str,
    session: str,
    call_id: str,
    outcome: dict[str, Any],
) -> bool:
    """Attach a sandbox result to the recorded tool call it answers; False when no step of
    this session recorded a call with that id (the result is still returned to the caller)."""
    try:
        sid = _session_row(conn, tenant, session).id
    except NotFound:
        return False
    row = conn.execute(
        select(tool_calls.c.id).where(
            tool_calls.c.session_id == sid,
            tool_calls.c.call_id == call_id,
            tool_calls.c.tenant_id == tenant,
        )
    ).first()
    if row is None:
        return False
    values, earned = reward_fns.sandbox_outcome(outcome)
    conn.execute(update(tool_calls).where(tool_calls.c.id == row[0]).values(**values))
    now = now_utc()
    for name, value in earned.items():
        conn.execute(
            insert(rewards_t).values(
                tenant_id=tenant, session_id=sid, tool_call_id=row[0], scope="tool_call",
                name=name, value=value, source="sandbox", created_at=now,
            )
        )  # fmt: skip
    return True
