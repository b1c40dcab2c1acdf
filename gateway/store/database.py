"""Engines and schema upgrades for the store.

SQLite (the embedded default) runs in WAL mode with ``synchronous=FULL``: a
committed batch is on disk before the recorder counts it as recorded, so it
survives ``kill -9`` of the gateway and a power cut. PostgreSQL needs nothing
special: its commit is already durable.

The schema is only ever created by Alembic (``upgrade``), never by
``metadata.create_all``, so that the migrations are what every deployment runs.
"""

from __future__ import annotations

import logging
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import orjson
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url

log = logging.getLogger(__name__)


class StoreError(Exception):
    """The store is unreachable, or its schema is not the one this code expects."""


def normalize_url(url: str) -> str:
    """Accept plain ``postgresql://`` URLs and use the psycopg 3 driver for them."""
    u = make_url(url)
    if u.drivername in ("postgresql", "postgres"):
        u = u.set(drivername="postgresql+psycopg")
    if u.get_backend_name() == "sqlite" and u.database and u.database.startswith("~"):
        u = u.set(database=str(Path(u.database).expanduser()))
    return u.render_as_string(hide_password=False)


def _json_dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


def make_engine(url: str, **kwargs: Any) -> Engine:
    url = normalize_url(url)
    # JSON columns through orjson: about 5x faster than the json module SQLAlchemy uses.
    kwargs.setdefault("json_serializer", _json_dumps)
    kwargs.setdefault("json_deserializer", orjson.loads)
    u = make_url(url)
    if u.get_backend_name() == "sqlite":
        if u.database and u.database != ":memory:":
            Path(u.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": 30}, **kwargs)
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(url, pool_pre_ping=True, **kwargs)


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=FULL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.close()


def alembic_config(url: str) -> Any:
    from alembic.config import Config

    # today's stdout: Config's default is the one at alembic's import (a test's capture)
    cfg = Config(stdout=sys.stdout)
    cfg.set_main_option("script_location", str(resources.files("migrations")))
    cfg.set_main_option("sqlalchemy.url", normalize_url(url).replace("%", "%%"))
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    """Bring the schema at ``url`` to ``revision`` (creating it on an empty database)."""
    from alembic import command

    logging.getLogger("alembic").setLevel(logging.WARNING)  # one line per revision otherwise
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str) -> None:
    from alembic import command

    command.downgrade(alembic_config(url), revision)


def current_revision(url: str) -> str | None:
    from alembic.runtime.migration import MigrationContext

    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            rev = MigrationContext.configure(conn).get_current_revision()
            return str(rev) if rev is not None else None
    finally:
        engine.dispose()


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
    assert head is not None
    return str(head)


def prepare_schema(url: str, migrate: bool) -> None:
    """Upgrade the schema (``migrate``) or refuse to run against an out-of-date one."""
    if migrate:
        try:
            upgrade(url)
        except Exception as exc:
            raise StoreError(f"cannot migrate the store at {_safe(url)}: {exc}") from exc
        return
    have, want = current_revision(url), head_revision()
    if have != want:
        raise StoreError(
            f"the store at {_safe(url)} is at revision {have}, this gateway needs {want}; "
            "run `gearshift db upgrade` or set store.migrate: true"
        )


def _safe(url: str) -> str:
    return make_url(url).render_as_string(hide_password=True)
