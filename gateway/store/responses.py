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

from sqlalchemy import Connection, delete, insert, literal_column, select

from gateway.errors import InvalidRequest
from gateway.store.queries import NotFound
from gateway.store.rows import insert_ignore, now_utc
from gateway.store.schema import response_items, responses, tenants

MAX_CHAIN = 10_000  # a bound on the recursive walk; ids are minted, so chains cannot loop


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
    rows = [
        {"response_id": r.id, "seq": seq, "tenant_id": tenant, "role": role,
         "item_id": item["id"], "item": item}
        for seq, (role, item) in enumerate(
            [*(("input", i) for i in r.inputs), *(("output", o) for o in r.outputs)]
        )
    ]  # fmt: skip
    if rows:
        conn.execute(insert(response_items), rows)


def load_chain(conn: Connection, tenant: str, response_id: str) -> Chain:
    """The chain ending at ``response_id``, oldest items first."""
    start = (
        select(
            responses.c.id, responses.c.previous_response_id, responses.c.session,
            literal_column("0").label("depth"),
        )
        .where(responses.c.id == response_id, responses.c.tenant_id == tenant)
        .cte("chain", recursive=True)
    )  # fmt: skip
    parent = responses.alias("parent")
    chain = start.union_all(
        select(
            parent.c.id, parent.c.previous_response_id, parent.c.session, start.c.depth + 1
        ).where(
            parent.c.id == start.c.previous_response_id,
            parent.c.tenant_id == tenant,
            start.c.depth < MAX_CHAIN,
        )
    )
    links = conn.execute(select(chain).order_by(chain.c.depth)).all()
    if not links:
        raise NotFound(f"no response {response_id!r}")
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
