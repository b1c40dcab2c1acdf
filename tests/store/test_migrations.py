"""Migrations are checked code: upgrade, downgrade and `alembic check` on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from alembic import command
from sqlalchemy import inspect

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
