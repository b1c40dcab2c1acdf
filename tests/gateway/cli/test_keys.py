"""``gearshift keys``: create, list, rotate, expire, revoke, limits and usage in a real store
(SQLite and PostgreSQL), as an operator types them."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from gateway.auth import hash_key
from gateway.cli.main import main
from gateway.store.database import make_engine
from gateway.store.keys import live_keys, version


def keys(capsys: pytest.CaptureFixture[str], store: str, *argv: str) -> list[dict[str, Any]]:
    assert main(["keys", *argv, "--store", store]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines() if line]


def stored_digests(store: str) -> set[str]:
    engine = make_engine(store)
    try:
        with engine.begin() as conn:
            return {row.sha256 for row in live_keys(conn)}
    finally:
        engine.dispose()


def test_key_lifecycle(store_url: str, capsys: pytest.CaptureFixture[str]):
    made = keys(capsys, store_url, "create", "--tenant", "acme", "--name", "bot",
                "--models", "auto, fast", "--tools", "run_shell")[0]  # fmt: skip
    assert made["key"].startswith("gs-") and made["prefix"] == made["key"][:10]
    assert made["models"] == ["auto", "fast"] and made["tools"] == ["run_shell"]
    assert not made["admin"] and made["expires_at"] is None
    assert stored_digests(store_url) == {hash_key(made["key"])}  # only the digest is kept

    listed = keys(capsys, store_url, "list", "--tenant", "acme")
    assert [k["id"] for k in listed] == [made["id"]] and "key" not in listed[0]

    with pytest.raises(SystemExit, match="already has a live key named 'bot'"):
        main(["keys", "create", "--tenant", "acme", "--name", "bot", "--store", store_url])
    with pytest.raises(SystemExit, match=r"tenant '\.\./x' must be"):
        main(["keys", "create", "--tenant", "../x", "--name", "bot", "--store", store_url])

    rotated = keys(capsys, store_url, "rotate", made["id"], "--grace", "1h")[0]
    assert rotated["name"] == "bot" and rotated["models"] == ["auto", "fast"]
    old = next(k for k in keys(capsys, store_url, "list") if k["id"] == made["id"])
    assert old["rotated_to"] == rotated["id"] and old["expires_at"] > time.time() + 3500

    soon = keys(capsys, store_url, "expire", rotated["id"], "--in", "2d")[0]
    assert abs(soon["expires_at"] - (time.time() + 2 * 86400)) < 60
    assert keys(capsys, store_url, "expire", rotated["id"], "--never")[0]["expires_at"] is None

    keys(capsys, store_url, "revoke", made["id"])
    assert [k["id"] for k in keys(capsys, store_url, "list")] == [rotated["id"]]
    assert len(keys(capsys, store_url, "list", "--all")) == 2
    with pytest.raises(SystemExit, match="revoked or expired"):
        main(["keys", "rotate", made["id"], "--store", store_url])
    with pytest.raises(SystemExit, match="no API key"):
        main(["keys", "revoke", "key_missing", "--store", store_url])


def test_limits_and_the_change_counter(store_url: str, capsys: pytest.CaptureFixture[str]):
    keys(capsys, store_url, "list")  # creates the schema
    engine = make_engine(store_url)
    with engine.begin() as conn:
        before = version(conn)
    row = keys(capsys, store_url, "limits", "set", "acme", "--rpm", "60", "--per-month", "10")[0]
    assert row["requests_per_minute"] == 60 and row["tokens_per_month"] == 10
    assert row["tokens_per_day"] is None and row["soft_percent"] == 80 and row["key_name"] is None
    keys(capsys, store_url, "limits", "set", "acme", "bot", "--tpm", "1000", "--soft", "90")
    shown = keys(capsys, store_url, "limits", "show", "acme")
    assert [(r["key_name"], r["tokens_per_minute"]) for r in shown] == [(None, None), ("bot", 1000)]
    keys(capsys, store_url, "limits", "clear", "acme", "bot")
    assert len(keys(capsys, store_url, "limits", "show")) == 1
    with engine.begin() as conn:
        assert version(conn) == before + 3  # every write is seen by the replicas' poll
    engine.dispose()
    with pytest.raises(SystemExit):
        main(["keys", "limits", "set", "acme", "--rpm", "-1", "--store", store_url])
    assert keys(capsys, store_url, "usage", "acme") == []
