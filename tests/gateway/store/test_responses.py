"""Stored responses on SQLite and PostgreSQL: chains, tenant scope, deletion, pages."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine

from gateway.errors import InvalidRequest
from gateway.store import responses as stored
from gateway.store.database import make_engine, upgrade
from gateway.store.queries import NotFound


@pytest.fixture
def engine(store_url: str) -> Iterator[Engine]:
    upgrade(store_url)
    engine = make_engine(store_url)
    yield engine
    engine.dispose()


def item(ident: str, text: str = "x") -> dict[str, Any]:
    return {"id": ident, "type": "message", "role": "user", "status": "completed",
            "content": [{"type": "input_text", "text": text}]}  # fmt: skip


def save(engine: Engine, rid: str, prev: str | None, n_in: int = 1, tenant: str = "a") -> None:
    body = {"id": rid, "status": "completed", "model": "m", "created_at": int(time.time())}
    row = stored.StoredResponse(
        rid, "resp_1", prev, body, [item(f"{rid}-in{k}") for k in range(n_in)],
        [item(f"{rid}-out")],
    )  # fmt: skip
    with engine.begin() as conn:
        stored.save(conn, tenant, row)


def test_a_chain_loads_oldest_first(engine: Engine):
    save(engine, "resp_1", None)
    save(engine, "resp_2", "resp_1", n_in=2)
    save(engine, "resp_3", "resp_2")
    with engine.begin() as conn:
        chain = stored.load_chain(conn, "a", "resp_3")
        assert chain.session == "resp_1"
        assert [i["id"] for i in chain.items] == [
            "resp_1-in0", "resp_1-out", "resp_2-in0", "resp_2-in1", "resp_2-out",
            "resp_3-in0", "resp_3-out",
        ]  # fmt: skip
        assert [i["id"] for i in stored.load_chain(conn, "a", "resp_1").items] == [
            "resp_1-in0", "resp_1-out",
        ]  # fmt: skip
        with pytest.raises(NotFound):
            stored.load_chain(conn, "b", "resp_3")  # another tenant's
        assert stored.get(conn, "a", "resp_2")["id"] == "resp_2"
        with pytest.raises(NotFound):
            stored.get(conn, "b", "resp_2")


def test_deleting_a_link_breaks_the_chain_explicitly(engine: Engine):
    save(engine, "resp_1", None)
    save(engine, "resp_2", "resp_1")
    with engine.begin() as conn:
        with pytest.raises(NotFound):
            stored.remove(conn, "b", "resp_1")
        assert stored.remove(conn, "a", "resp_1")["deleted"] is True
        with pytest.raises(NotFound, match="which was deleted"):
            stored.load_chain(conn, "a", "resp_2")
        with pytest.raises(NotFound):
            stored.get(conn, "a", "resp_1")


def test_input_items_pages(engine: Engine):
    save(engine, "resp_1", None, n_in=5)
    with engine.begin() as conn:

        def page(**kw: Any) -> dict[str, Any]:
            return stored.input_items(
                conn, "a", "resp_1", **{"limit": 2, "after": None, "order": "asc", **kw}
            )

        first = page()
        assert [i["id"] for i in first["data"]] == ["resp_1-in0", "resp_1-in1"]
        assert first["has_more"] is True and first["last_id"] == "resp_1-in1"
        last = page(after="resp_1-in3")
        assert [i["id"] for i in last["data"]] == ["resp_1-in4"] and last["has_more"] is False
        assert page(order="desc", limit=10)["data"][0]["id"] == "resp_1-in4"
        with pytest.raises(InvalidRequest):
            page(after="resp_1-out")  # an output item is not an input item
        with pytest.raises(NotFound):
            stored.input_items(conn, "b", "resp_1", limit=2, after=None, order="asc")
