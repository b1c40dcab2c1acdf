"""Two `gearshift serve` processes on one store (SQLite file and PostgreSQL), no balancer in
front: a client alternates between them. Keys made in the store work on both, a routing
version published through one is applied by the other, a named session's steps and an
unnamed session's hash chain are recorded once each and numbered 0, 1, ... in the order they
were committed, whichever replica took them, a Responses chain started on one continues on
the other, and when one replica stops the other carries on with the same sessions."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from sqlalchemy import select

from gateway.cli.main import main
from gateway.store.database import make_engine
from gateway.store.schema import sessions, steps
from tests.deploy.processes import Gateway, gateway, stop
from tests.support.fake_upstream import FakeUpstream
from tests.support.servers import serve_in_thread

pytestmark = pytest.mark.slow


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    capsys.readouterr()
    assert main(["--log-level", "warning", *argv]) == 0
    return dict(json.loads(capsys.readouterr().out.splitlines()[0]))


@pytest.fixture
def pair(store_url: str, tmp_path: Path) -> Iterator[tuple[Gateway, Gateway]]:
    with (
        serve_in_thread(FakeUpstream().app) as full,
        serve_in_thread(FakeUpstream().app) as fast,
    ):
        config = {
            "auth": {"mode": "keys", "refresh_s": 0.2},
            "tiers": {"full": {"model": "m-full", "replicas": [full]},
                      "fast": {"model": "m-fast", "replicas": [fast]}},
            "router": {"calibrate_tokens": False},
            "sandbox": {"enabled": False},
        }  # fmt: skip

        def store(name: str) -> dict[str, Any]:
            return {"store": {"url": store_url, "dead_letter_path": str(tmp_path / f"{name}.dl")}}

        with (
            gateway(tmp_path, "a", config | store("a")) as a,
            gateway(tmp_path, "b", config | store("b")) as b,
        ):
            yield a, b


def stored(store_url: str, external_id: str, count: int) -> list[Any]:
    """The steps of the session named ``external_id``, once ``count`` are written."""
    engine = make_engine(store_url)
    query = (
        select(steps.c.seq, steps.c.tier, steps.c.routing_version, steps.c.request_id)
        .join(sessions, sessions.c.id == steps.c.session_id)
        .where(sessions.c.external_id == external_id)
        .order_by(steps.c.seq)
    )
    deadline = time.monotonic() + 10
    try:
        while True:
            with engine.connect() as c:
                rows = list(c.execute(query))
            if len(rows) >= count or time.monotonic() > deadline:
                return rows
            time.sleep(0.1)
    finally:
        engine.dispose()


def test_two_replicas_share_keys_routing_sessions_and_responses(
    pair: tuple[Gateway, Gateway], store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = pair
    bot = cli(capsys, "keys", "create", "--tenant", "acme", "--name", "bot", "--store", store_url)
    root = cli(capsys, "keys", "create", "--tenant", "ops", "--name", "root", "--admin",
               "--store", store_url)  # fmt: skip
    clients = [openai.OpenAI(base_url=g.url + "/v1", api_key=bot["key"], max_retries=0)
               for g in (a, b)]  # fmt: skip

    # keys made in the store: both replicas accept them within auth.refresh_s
    for g in (a, b):
        deadline = time.monotonic() + 5
        while httpx.get(g.url + "/v1/models", headers={"authorization": f"Bearer {bot['key']}"}
                        ).status_code != 200:  # fmt: skip
            assert time.monotonic() < deadline, f"{g.url} does not accept a key in the store"
            time.sleep(0.1)

    # a routing version published through A is applied by B
    admin = {"authorization": f"Bearer {root['key']}"}
    made = httpx.post(a.url + "/admin/v1/routing/versions", headers=admin,
                      json={"policy": "always_fast", "params": {}})  # fmt: skip
    assert made.status_code == 201, made.text
    version = made.json()["id"]
    published = httpx.post(a.url + "/admin/v1/routing/publish", headers=admin,
                           json={"version": version})  # fmt: skip
    assert published.status_code == 200, published.text

    def chat(i: int, session: str | None, messages: list[dict[str, Any]]) -> Any:
        headers = {"x-session-id": session} if session else {}
        return clients[i % 2].chat.completions.with_raw_response.create(
            model="auto",
            messages=messages,
            extra_headers=headers,  # type: ignore[arg-type]
        )

    deadline = time.monotonic() + 5
    while (
        chat(1, "probe", [{"role": "user", "content": "hi"}]).headers["x-gearshift-tier"] != "fast"
    ):
        assert time.monotonic() < deadline, "replica B did not apply the routing version"
        time.sleep(0.1)

    # a named session, one step on each replica in turn: each stored once, in order
    history: list[dict[str, Any]] = [{"role": "user", "content": "step 0"}]
    for i in range(4):
        raw = chat(i, "agent-1", history)
        assert raw.headers["x-gearshift-tier"] == "fast"
        history += [{"role": "assistant", "content": raw.parse().choices[0].message.content},
                    {"role": "user", "content": f"step {i + 1}"}]  # fmt: skip
    rows = stored(store_url, "agent-1", 4)
    assert len(rows) == len({r.request_id for r in rows}) == 4  # one session, each step once
    assert {r.routing_version for r in rows} == {version}

    # a Responses chain: created on A, continued on B, read back on A
    first = clients[0].responses.create(model="auto", input="remember: blue")
    second = clients[1].responses.create(
        model="auto", input="what colour?", previous_response_id=first.id
    )
    assert second.previous_response_id == first.id and second.output_text
    assert clients[0].responses.retrieve(second.id).previous_response_id == first.id

    # one replica stops: the other carries the named session on, and the chain
    stop(a.proc)
    raw = chat(1, "agent-1", history)
    assert raw.headers["x-gearshift-tier"] == "fast"
    rows = stored(store_url, "agent-1", 5)
    assert len(rows) == len({r.request_id for r in rows}) == 5
    third = clients[1].responses.create(
        model="auto", input="and now?", previous_response_id=second.id
    )
    assert third.previous_response_id == second.id

    # numbered at the commit from the store: one order whichever replica wrote a step
    assert [r.seq for r in rows] == list(range(5))
