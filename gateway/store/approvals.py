"""Approval requests an operator answers (``/admin/v1/approvals``), in the responses' tables.

An approval request is an output item (``mcp_approval_request``, its id minted ``mcpr_``)
of a finished response. It is pending while no response continues that response (a
continuation must answer every pending request of its chain) and no operator has decided
it. An operator's decision is stored as an item of the response that asked, with role
``approval`` (not an input or an output: the response object does not change), and the
next request of the chain applies it (``gateway.pipeline.responses.approvals``).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, func, insert, select
from sqlalchemy.exc import IntegrityError

from gateway.errors import InvalidRequest
from gateway.store.queries import NotFound
from gateway.store.schema import response_items, responses

ACTIVE = ("queued", "in_progress")
DECISION = "approval"  # the response_items role of an operator's decision
PREFIX = "mcpr\\_%"  # approval request ids, as a LIKE pattern


def _requests(conn: Connection, tenant: str | None, request_id: str | None) -> list[Any]:
    q = (
        select(
            response_items.c.response_id, response_items.c.tenant_id, response_items.c.item,
            responses.c.created_at,
        )
        .join(responses, responses.c.id == response_items.c.response_id)
        .where(
            response_items.c.role == "output", response_items.c.item_id.like(PREFIX, escape="\\"),
            responses.c.status.not_in(ACTIVE),
        )
        .order_by(responses.c.created_at, response_items.c.seq)
    )  # fmt: skip
    if tenant is not None:
        q = q.where(response_items.c.tenant_id == tenant)
    if request_id is not None:
        q = q.where(response_items.c.item_id == request_id)
    return [r for r in conn.execute(q).all() if r.item.get("type") == "mcp_approval_request"]


def _closed(conn: Connection, response_ids: set[str]) -> tuple[set[str], dict[str, Any]]:
    """Of these responses: the ones continued, and the operator's decisions by request id."""
    if not response_ids:
        return set(), {}
    continued = conn.execute(
        select(responses.c.previous_response_id).where(
            responses.c.previous_response_id.in_(response_ids)
        )
    ).scalars()
    decided = conn.execute(
        select(response_items.c.item).where(
            response_items.c.response_id.in_(response_ids), response_items.c.role == DECISION
        )
    ).scalars()
    return set(continued), {d["approval_request_id"]: d for d in decided}


def _view(row: Any) -> dict[str, Any]:
    item = row.item
    return {
        "id": item["id"], "object": "approval_request", "tenant": row.tenant_id,
        "response_id": row.response_id, "server_label": item["server_label"],
        "name": item["name"], "arguments": item["arguments"],
        "created_at": int(row.created_at.timestamp()),
    }  # fmt: skip


def pending(conn: Connection, tenant: str | None = None) -> list[dict[str, Any]]:
    """Every approval request no one has answered yet (of one tenant, or of all)."""
    rows = _requests(conn, tenant, None)
    continued, decided = _closed(conn, {r.response_id for r in rows})
    return [
        _view(r) for r in rows if r.response_id not in continued and r.item["id"] not in decided
    ]


def decide(conn: Connection, request_id: str, decision: dict[str, Any]) -> dict[str, Any]:
    """Store an operator's ``decision`` item on the response that asked; a 400 when the
    request was answered already, ``NotFound`` when there is no such pending request."""
    rows = _requests(conn, None, request_id)
    if not rows:
        raise NotFound(f"no approval request {request_id!r}")
    row = rows[0]
    continued, decided = _closed(conn, {row.response_id})
    if row.response_id in continued or request_id in decided:
        how = "by an operator" if request_id in decided else "by the client's next request"
        raise InvalidRequest(
            f"approval request {request_id!r} was already answered {how}",
            param="approval_request_id",
        )
    seq = conn.execute(
        select(func.max(response_items.c.seq)).where(
            response_items.c.response_id == row.response_id
        )
    ).scalar()
    try:
        conn.execute(
            insert(response_items).values(
                response_id=row.response_id, seq=(seq or 0) + 1, tenant_id=row.tenant_id,
                role=DECISION, item_id=decision["id"], item=decision,
            )
        )  # fmt: skip
    except IntegrityError:  # another operator's decision, at the same moment
        raise InvalidRequest(
            f"approval request {request_id!r} was already answered by an operator",
            param="approval_request_id",
        ) from None
    return {**_view(row), "decision": decision}
