"""The tests' PostgreSQL server: the benchmarks' throwaway server (``bench.pgserver``)
plus a helper that makes a fresh database on it."""

from __future__ import annotations

from bench.pgserver import Cluster, postgres_cluster, postgres_server

__all__ = ["Cluster", "fresh_database", "postgres_cluster", "postgres_server"]


def fresh_database(admin_url: str, name: str) -> str:
    """Create database ``name`` on the server and return its URL."""
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    return admin_url.rsplit("/", 1)[0] + "/" + name
