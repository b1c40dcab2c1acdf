"""Suite-wide ordering: end-to-end tests run last.

Their session-scoped stack (two vLLM servers) lives until the end of the run; starting it
after the fast tests keeps it from competing with them for the two cores.
"""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    items.sort(key=lambda item: item.get_closest_marker("e2e") is not None)
