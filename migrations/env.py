"""Alembic environment: the URL comes from the caller (``gateway.store.database``)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import pool

from gateway.store.database import make_engine
from gateway.store.schema import metadata

config = context.config


def run_offline() -> None:
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=metadata,
        literal_binds=True,
        compare_type=True,
        render_as_batch=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    url = config.get_main_option("sqlalchemy.url")
    assert url is not None, "set sqlalchemy.url (gateway.store.database.alembic_config does)"
    engine = make_engine(url, poolclass=pool.NullPool)
    with engine.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=metadata,
            compare_type=True,
            render_as_batch=connection.dialect.name == "sqlite",  # SQLite has no ALTER ... DROP
        )
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
