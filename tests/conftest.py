"""Suite-wide ordering: end-to-end tests run last.

Their session-scoped stack (two vLLM servers) lives until the end of the run; starting it
after the fast tests keeps it from competing with them for the two cores.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest


def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    items.sort(key=lambda item: item.get_closest_marker("e2e") is not None)


@pytest.fixture(scope="session")
def postgres_admin_url() -> Iterator[str]:
    """A real PostgreSQL server for the whole run (started once, about 2 s)."""
    from tests.support.postgres import postgres_server

    with postgres_server() as url:
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty store database of each supported kind."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/store.db"
    from tests.support.postgres import fresh_database

    admin = request.getfixturevalue("postgres_admin_url")
    return fresh_database(admin, "t_" + uuid.uuid4().hex[:12])


@pytest.fixture
def sandbox_root() -> Iterator[Path]:
    """A sandbox workspace root under /tmp with o+x parents: the sandbox uid must reach it."""
    import os
    import shutil
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="gearshift-sbx-"))
    os.chmod(root, 0o711)
    yield root
    shutil.rmtree(root, ignore_errors=True)
