"""``bench.pgserver``: a throwaway server started on a core runs there, backends included."""

from __future__ import annotations

import contextlib
import os

import pytest

from bench.pgserver import _bindir, postgres_cluster
from bench.procs import process_tree

pytestmark = pytest.mark.skipif(
    _bindir() is None or (os.cpu_count() or 1) < 2, reason="needs PostgreSQL and two cores"
)


def test_a_server_started_on_a_core_keeps_its_backends_there() -> None:
    import psycopg

    with postgres_cluster(core=1) as cluster, psycopg.connect(cluster.url) as conn:
        conn.execute("SELECT 1")
        tree = process_tree(cluster.pid)
        assert len(tree) > 2  # the postmaster, its background workers and this backend
        cores = {}
        for pid in tree:
            with contextlib.suppress(ProcessLookupError):  # an autovacuum worker ended
                cores[pid] = os.sched_getaffinity(pid)
        assert cores[cluster.pid] == {1}
        assert all(c == {1} for c in cores.values()), cores
