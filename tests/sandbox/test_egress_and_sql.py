"""http_fetch through the egress allowlist and sql_query through the read-only broker.

Names are resolved by a stub resolver (a local "hosts file"), and the only server is one
this test starts on 127.0.0.1: nothing leaves loopback.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from sandbox.config import DatabaseConfig, EgressConfig, GrantConfig, Resources, SandboxConfig
from sandbox.core import Sandbox
from sandbox.protocol import Principal, SessionCreate, ToolCall, ToolResult
from tests.support.servers import serve_in_thread

WHO = Principal(tenant="acme", key="k1")


def hosts(table: dict[str, list[str]]):
    async def resolve(host: str, port: int) -> list[str]:
        return table.get(host, [])

    return resolve


@pytest.fixture
def local_server():
    async def hello(request):
        return PlainTextResponse("hello from loopback")

    with serve_in_thread(Starlette(routes=[Route("/", hello)])) as url:
        yield int(url.rsplit(":", 1)[1])


def sandbox_with(
    config: SandboxConfig, egress: EgressConfig, db: Path | None = None, table=None
) -> Sandbox:
    grant = GrantConfig(
        tools=["http_fetch", "sql_query"], egress=egress, databases=["shop"],
        resources=Resources(wall_s=5, output_bytes=4096),
    )  # fmt: skip
    cfg = config.model_copy(
        update={
            "grants_by_tenant": {"acme": grant},
            "databases": {"shop": DatabaseConfig(path=db)} if db else {},
        }
    )
    return Sandbox(cfg, resolve=hosts(table or {}))


async def run(sandbox: Sandbox, tool: str, **args: object) -> ToolResult:
    sid = sandbox.create(SessionCreate(principal=WHO)).id
    try:
        return await sandbox.call(tool, ToolCall(principal=WHO, session_id=sid, arguments=args))
    finally:
        await sandbox.remove(sid)


async def test_a_name_that_resolves_to_loopback_is_refused(config, local_server):
    s = sandbox_with(config, EgressConfig(domains=["api.example.com"], ports=[local_server]),
                     table={"api.example.com": ["127.0.0.1"]})  # fmt: skip
    r = await run(s, "http_fetch", url=f"http://api.example.com:{local_server}/")
    assert not r.allowed and r.rule == "egress" and "non-public" in r.reason


@pytest.mark.parametrize(
    "ip",
    ["10.0.0.5", "169.254.169.254", "192.168.1.1", "100.64.0.1", "::ffff:127.0.0.1", "fd00::1"],
)
async def test_private_and_metadata_addresses_are_refused(config, ip):
    s = sandbox_with(
        config, EgressConfig(domains=["api.example.com"]), table={"api.example.com": [ip]}
    )
    r = await run(s, "http_fetch", url="http://api.example.com/")
    assert not r.allowed and "non-public" in r.reason


async def test_hosts_ports_and_schemes_outside_the_allowlist(config):
    s = sandbox_with(config, EgressConfig(domains=["api.example.com"]))
    for url, says in [
        ("http://evil.example.com/", "allowlist"),
        ("http://api.example.com:8080/", "port 8080"),
        ("file:///etc/passwd", "no host"),
        ("http://127.0.0.1/", "allowlist"),
    ]:
        r = await run(s, "http_fetch", url=url)
        assert not r.allowed and says in r.reason, (url, r.reason)


async def test_an_explicitly_allowed_private_target_is_fetched(config, local_server):
    egress = EgressConfig(domains=["svc.internal"], cidrs=["127.0.0.0/8"], ports=[local_server])
    s = sandbox_with(config, egress, table={"svc.internal": ["127.0.0.1"]})
    r = await run(s, "http_fetch", url=f"http://svc.internal:{local_server}/")
    assert r.allowed and r.output["status"] == 200 and r.output["body"] == "hello from loopback"
    assert r.output["address"] == "127.0.0.1"


@pytest.fixture
def shop_db(tmp_path: Path) -> Path:
    db = tmp_path / "shop.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, total REAL)")
        conn.executemany("INSERT INTO orders (total) VALUES (?)", [(9.5,), (20.0,)])
    return db


async def test_sql_reads_work(config, shop_db):
    s = sandbox_with(config, EgressConfig(), shop_db)
    r = await run(s, "sql_query", database="shop", query="SELECT count(*), sum(total) FROM orders")
    assert r.allowed and r.output["rows"] == [[2, 29.5]]


@pytest.mark.parametrize(
    "sql",
    [
        "DELETE FROM orders",
        "INSERT INTO orders (total) VALUES (1)",
        "/* sneaky */ UPDATE orders SET total = 0",
        "WITH x AS (SELECT 1) INSERT INTO orders (total) SELECT 1 FROM x",
        "ATTACH DATABASE '/tmp/evil.db' AS evil",
        "PRAGMA writable_schema = 1",
        "SELECT load_extension('evil')",
    ],
)
async def test_sql_writes_are_refused_by_the_broker(config, shop_db, sql):
    s = sandbox_with(config, EgressConfig(), shop_db)
    r = await run(s, "sql_query", database="shop", query=sql)
    assert not r.allowed or r.exit_status == 1, r
    with sqlite3.connect(shop_db) as conn:
        assert conn.execute("SELECT count(*), sum(total) FROM orders").fetchone() == (2, 29.5)


async def test_sql_on_an_ungranted_database(config, shop_db):
    s = sandbox_with(config, EgressConfig(), shop_db)
    r = await run(s, "sql_query", database="payroll", query="SELECT 1")
    assert not r.allowed and "not granted" in r.reason
