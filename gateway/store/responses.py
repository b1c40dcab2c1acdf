"""The Responses API's stored state: responses, their items, and the chains they form.

A response row holds the response object as the client got it; its items (inputs first,
then outputs, numbered by ``seq``) are rows of ``response_items`` in the normalized shape
``GET /v1/responses/{id}/input_items`` lists. A ``previous_response_id`` chain is read
with one recursive query for the chain and one for its items, whatever its length.

Every function takes the caller's tenant and filters on it: another tenant's response is
indistinguishable from a missing one (``NotFound``). These run through the recorder's
``call``, so a write is ordered after the steps queued before it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, delete, insert, literal_column, select, update

from gateway.errors import InvalidRequest
from gateway.store.queries import NotFound
from gateway.store.rows import insert_ignore, now_utc
from gateway.store.schema import response_items, responses, tenants

MAX_CHAIN = 10_000  # a bound on the recursive walk; ids are minted, so chains cannot loop
ACTIVE = ("queued", "in_progress")  # a background response still running (or meant to)


@dataclass(frozen=True, slots=True)
class StoredResponse:
    id: str
    session: str
    previous_response_id: str | None
    body: dict[str, Any]  # the response object
    inputs: list[dict[str, Any]]
    outputs: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Chain:
    """What a ``previous_response_id`` continues: its session and every item, in order."""

    session: str
    items: list[dict[str, Any]]


def save(conn: Connection, tenant: str, r: StoredResponse) -> None:
    insert_ignore(conn, tenants, [{"id": tenant, "created_at": now_utc()}])
    conn.execute(
        insert(responses).values(
            id=r.id, tenant_id=tenant, session=r.session,
            previous_response_id=r.previous_response_id, status=r.body["status"],
            model=r.body.get("model"), body=r.body, created_at=now_utc(r.body["created_at"]),
        )
    )  # fmt: skip
    _items(
        conn, tenant, r, [*(("input", i) for i in r.inputs), *(("output", o) for o in r.outputs)]
    )


def _items(
    conn: Connection, tenant: str, r: StoredResponse, items: list[tuple[str, Any]], first: int = 0
) -> None:
    rows = [
        {"response_id": r.id, "seq": seq, "tenant_id": tenant, "role": role,
         "item_id": item["id"], "item": item}
        for seq, (role, item) in enumerate(items, start=first)
    ]  # fmt: skip
    if rows:
        conn.execute(insert(response_items), rows)


def set_active(conn: Connection, tenant: str, response_id: str, body: dict[str, Any]) -> bool:
    """A background response's new state while it runs (``queued`` → ``in_progress``);
    False when it is no longer active (cancelled, deleted)."""
    return _update(conn, tenant, response_id, body)


def finish(conn: Connection, tenant: str, r: StoredResponse) -> bool:
    """Store the end of a background response saved when it was created (its inputs then,
    its outputs now). Only an active one changes: False when it was cancelled or deleted
    meanwhile (through another replica, or after a restart), and then nothing is written."""
    if not _update(conn, tenant, r.id, r.body):
        return False
    _items(conn, tenant, r, [("output", o) for o in r.outputs], first=len(r.inputs))
    return True


def _update(conn: Connection, tenant: str, response_id: str, body: dict[str, Any]) -> bool:
    changed = conn.execute(
        update(responses)
        .where(
            responses.c.id == response_id,
            responses.c.tenant_id == tenant,
            responses.c.status.in_(ACTIVE),
        )
        .values(status=body["status"], model=body.get("model"), body=body)
    )
    return bool(changed.rowcount)


def cancel(conn: Connection, tenant: str, response_id: str) -> dict[str, Any]:
    """Mark a background response ``cancelled`` when no run of this gateway holds it (a
    run that does stores its own end first, with the output it had). Cancelling a
    cancelled response returns it; a response that is not a background one, or has ended
    otherwise, is a 400, as OpenAI answers."""
    current = get(conn, tenant, response_id)
    if current.get("background") is not True:
        raise InvalidRequest(
            f"response {response_id!r} was not created with background: true; only "
            "background responses can be cancelled",
            param="response_id",
        )
    if current["status"] == "cancelled":
        return current
    if current["status"] not in ACTIVE:
        raise InvalidRequest(
            f"response {response_id!r} cannot be cancelled: it is already {current['status']}",
            param="response_id",
        )
    out = current | {"status": "cancelled"}
    _update(conn, tenant, response_id, out)
    return out


def load_chain(conn: Connection, tenant: str, response_id: str) -> Chain:
    """The chain ending at ``response_id``, oldest items first."""
    start = (
        select(
            responses.c.id, responses.c.previous_response_id, responses.c.session,
            responses.c.status, literal_column("0").label("depth"),
        )
        .where(responses.c.id == response_id, responses.c.tenant_id == tenant)
        .cte("chain", recursive=True)
    )  # fmt: skip
    parent = responses.alias("parent")
    chain = start.union_all(
        select(
            parent.c.id,
            parent.c.previous_response_id,
            parent.c.session,
            parent.c.status,
            start.c.depth + 1,
        ).where(
            parent.c.id == start.c.previous_response_id,
            parent.c.tenant_id == tenant,
            start.c.depth < MAX_CHAIN,
        )
    )
    links = conn.execute(select(chain).order_by(chain.c.depth)).all()
    if not links:
        raise NotFound(f"no response {response_id!r}")
    if links[0].status in ACTIVE:
        raise InvalidRequest(
            f"response {response_id!r} is still {links[0].status} (a background response): "
            "wait until it has finished to continue it",
            param="previous_response_id",
        )
    oldest = links[-1]
    if oldest.previous_response_id is not None:
        raise NotFound(
            f"response {oldest.id!r} in the chain of {response_id!r} continues "
            f"{oldest.previous_response_id!r}, which was deleted"
        )
    items = conn.execute(
        select(response_items.c.item)
        .join(chain, response_items.c.response_id == chain.c.id)
        .order_by(chain.c.depth.desc(), response_items.c.seq)
    ).all()
    return Chain(links[0].session, [row.item for row in items])


def get(conn: Connection, tenant: str, response_id: str) -> dict[str, Any]:
    body = conn.execute(
        select(responses.c.body).where(
            responses.c.id == response_id, responses.c.tenant_id == tenant
        )
    ).scalar()
    if body is None:
        raise NotFound(f"no response {response_id!r}")
    return dict(body)


def remove(conn: Connection, tenant: str, response_id: str) -> dict[str, Any]:
    get(conn, tenant, response_id)
    conn.execute(delete(response_items).where(response_items.c.response_id == response_id))
    conn.execute(delete(responses).where(responses.c.id == response_id))
    return {"id": response_id, "object": "response", "deleted": True}


def input_items(
    conn: Connection, tenant: str, response_id: str, *, limit: int, after: str | None, order: str
) -> dict[str, Any]:
    """One page of a response's input items (the SDK's cursor page: ``after`` an item id)."""
    get(conn, tenant, response_id)
    rows = list(
        conn.execute(
            select(response_items.c.seq, response_items.c.item_id, response_items.c.item).where(
                response_items.c.response_id == response_id, response_items.c.role == "input"
            )
        ).all()
    )
    rows.sort(key=lambda r: r.seq, reverse=order == "desc")
    if after is not None:
        at = next((k for k, r in enumerate(rows) if r.item_id == after), None)
        if at is None:
            raise InvalidRequest(
                f"no input item {after!r} in response {response_id!r}", param="after"
            )
        rows = rows[at + 1 :]
    page = [r.item for r in rows[:limit]]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": len(rows) > limit,
    }
