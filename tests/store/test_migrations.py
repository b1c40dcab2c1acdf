"""Migrations are checked code: upgrade, downgrade and `alembic check` on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from alembic import command
from sqlalchemy import insert, inspect, select
from sqlalchemy.exc import IntegrityError

from gateway.store import schema
from gateway.store.database import (
    StoreError,
    alembic_config,
    current_revision,
    downgrade,
    head_revision,
    make_engine,
    prepare_schema,
    upgrade,
)
from gateway.store.schema import metadata


def tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def test_upgrade_check_downgrade_upgrade(store_url):
    upgrade(store_url)
    assert current_revision(store_url) == head_revision()
    assert tables(store_url) == set(metadata.tables)
    command.check(alembic_config(store_url))  # the models and the migrations agree
    downgrade(store_url, "base")
    assert tables(store_url) == set()
    upgrade(store_url)
    assert tables(store_url) == set(metadata.tables)


def test_a_gateway_that_may_not_migrate_refuses_an_old_schema(store_url):
    with pytest.raises(StoreError, match="revision None, this gateway needs"):
        prepare_schema(store_url, migrate=False)
    prepare_schema(store_url, migrate=True)
    prepare_schema(store_url, migrate=False)


def test_constraint_names_follow_the_convention(store_url):
    upgrade(store_url)
    engine = make_engine(store_url)
    try:
        fks = inspect(engine).get_foreign_keys("steps")
        names = {fk["name"] for fk in fks}
    finally:
        engine.dispose()
    if engine.dialect.name == "postgresql":  # SQLite does not keep FK names
        assert "fk_steps_session_id_sessions" in names


def test_upgrade_renumbers_repeated_step_numbers_then_makes_them_unique(store_url):
    """Before 0008 a session that moved between replicas could get a number twice."""
    upgrade(store_url, "0007")
    engine = make_engine(store_url)
    at = datetime(2026, 12, 1, tzinfo=UTC)

    def row(step: str, seq: int, request: str, choice: int = 0, session: str = "s1") -> dict:
        return {"id": step, "tenant_id": "t", "session_id": session, "seq": seq,
                "choice_index": choice, "request_id": request, "endpoint": "chat",
                "request_sha256": "b", "fallback": False, "escalated": False, "attempts": 1,
                "status": 200, "duration_ms": 1.0, "rewritten": False,
                "created_at": at + timedelta(seconds=int(step[1:]))}  # fmt: skip

    try:
        with engine.begin() as conn:
            conn.execute(insert(schema.tenants), [{"id": "t", "created_at": at}])
            conn.execute(insert(schema.blobs), [{"sha256": "b", "body": b"{}"}])
            conn.execute(insert(schema.sessions), [
                {"id": s, "tenant_id": "t", "api_key": "k", "status": "open", "created_at": at}
                for s in ("s1", "s2")])  # fmt: skip
            conn.execute(insert(schema.steps), [
                row("x0", 0, "r0"), row("x1", 1, "r1"), row("x2", 1, "r2"),  # two writers' 1
                row("x3", 1, "r2", choice=1), row("x4", 2, "r3"), row("x5", 2, "r4"),
                row("x6", 0, "q0", session="s2"), row("x7", 5, "q1", session="s2"),
            ])  # fmt: skip
        upgrade(store_url)
        with engine.connect() as conn:
            got = conn.execute(
                select(schema.steps.c.id, schema.steps.c.seq).order_by(schema.steps.c.id)
            ).all()  # fmt: skip
        # s1: one number per request, in the order (number, time); s2 had no repeat: kept
        assert [tuple(r) for r in got] == [("x0", 0), ("x1", 1), ("x2", 2), ("x3", 2),
                                           ("x4", 3), ("x5", 4), ("x6", 0), ("x7", 5)]  # fmt: skip
        with pytest.raises(IntegrityError), engine.begin() as conn:
            conn.execute(insert(schema.steps), [row("x8", 4, "r5")])
        downgrade(store_url, "0007")
        with engine.begin() as conn:  # plain again: the old writers' repeats are accepted
            conn.execute(insert(schema.steps), [row("x8", 4, "r5")])
    finally:
        engine.dispose()
