"""Two `gearshift serve` processes on one store (SQLite file and PostgreSQL), no balancer in
front: a client alternates between them. Keys made in the store work on both, a routing
version published through one is applied by the other, a named session's steps and an
unnamed session's hash chain are recorded once each and numbered 0, 1, ... in the order they
were committed, whichever replica took them, a Responses chain started on one continues on
the other, sessions sent to both in turn get the tiers one replica gives them (the session
policy's cooldown and tool-loop stickiness, rebuilt from the recorded steps), and when one
replica stops the other carries on with the same sessions."""

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
from tests.support.fake_upstream import Behaviour, FakeUpstream
from tests.support.servers import serve_in_thread

pytestmark = pytest.mark.slow


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    capsys.readouterr()
    assert main(["--log-level", "warning", *argv]) == 0
    return dict(json.loads(capsys.readouterr().out.splitlines()[0]))


@pytest.fixture
def pair(
    store_url: str, tmp_path: Path
) -> Iterator[tuple[Gateway, Gateway, FakeUpstream, FakeUpstream]]:
    full, fast = FakeUpstream("full"), FakeUpstream("fast")
    with serve_in_thread(full.app) as full_url, serve_in_thread(fast.app) as fast_url:
        config = {
            "auth": {"mode": "keys", "refresh_s": 0.2},
            "tiers": {"full": {"model": "m-full", "replicas": [full_url]},
                      "fast": {"model": "m-fast", "replicas": [fast_url]}},
            # until a routing version is published: so that fast tells it is applied
            "router": {"calibrate_tokens": False, "policy": "always_full",
                       "recall": True, "recall_wait_s": 5.0},
            "sandbox": {"enabled": False},
        }  # fmt: skip

        def store(name: str) -> dict[str, Any]:
            return {"store": {"url": store_url, "dead_letter_path": str(tmp_path / f"{name}.dl")}}

        with (
            gateway(tmp_path, "a", config | store("a")) as a,
            gateway(tmp_path, "b", config | store("b")) as b,
        ):
            yield a, b, full, fast


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


TOOLS = [{"type": "function", "function": {
    "name": "run_shell", "description": "run a command",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}},
                   "required": ["cmd"]}}}]  # fmt: skip


def call(k: int, arguments: str) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"call-{k}", "type": "function",
         "function": {"name": "run_shell", "arguments": arguments}}]}  # fmt: skip


# (what the client adds, the fast tier's answer): the first fast answer calls the tool with
# arguments that do not parse, so the step is escalated to the full tier; the session policy
# then keeps the next 2 steps on full (cooldown), the tool loop stays on full (sticky), and a
# new user turn goes back to fast (its base policy is always_fast)
STEPS = [("user", "bad"), ("tool", "ok"), ("tool", "ok"), ("tool", "ok"), ("user", "ok"),
         ("tool", "ok")]  # fmt: skip
ONE_REPLICA = ["full", "full", "full", "full", "fast", "fast"]
STICKY = {"policy": "session", "params": {"base": "always_fast", "cooldown_steps": 2}}


def run_session(
    replicas: list[Gateway], full: FakeUpstream, fast: FakeUpstream, key: str,
    session: str | None, task: str, stop_after: int | None = None,
) -> list[str]:  # fmt: skip
    """The session of ``STEPS`` sent to ``replicas`` in turn (the first one stopped after
    step ``stop_after``): the tier that served each step."""
    clients = [openai.OpenAI(base_url=g.url + "/v1", api_key=key, max_retries=0)
               for g in replicas]  # fmt: skip
    messages: list[dict[str, Any]] = [{"role": "user", "content": task}]
    tiers = []
    for k, (kind, arguments) in enumerate(STEPS):
        if kind == "tool":
            messages.append({"role": "tool", "tool_call_id": f"call-{k - 1}", "content": "done"})
        elif k:
            messages.append({"role": "user", "content": f"{task}: next {k}"})
        for upstream in (full, fast):  # each answer of the session is its own
            upstream.script.clear()
            good = call(k, f'{{"cmd": "{upstream.name} {task} {k}"}}')
            upstream.then(Behaviour(message=call(k, "{oops") if (
                upstream is fast and arguments == "bad") else good))  # fmt: skip
        headers = {"x-session-id": session} if session else {}
        raw = clients[k % len(clients)].chat.completions.with_raw_response.create(
            model="auto",
            messages=messages,  # type: ignore[arg-type]
            tools=TOOLS,  # type: ignore[arg-type]
            extra_headers=headers,
        )
        tiers.append(raw.headers["x-gearshift-tier"])
        messages.append(raw.parse().choices[0].message.model_dump(exclude_none=True))
        if stop_after == k:
            stop(replicas[0].proc)
            clients.pop(0).close()
    for client in clients:
        client.close()
    for upstream in (full, fast):
        upstream.script.clear()
    return tiers


def test_two_replicas_share_keys_routing_sessions_and_responses(
    pair: tuple[Gateway, Gateway, FakeUpstream, FakeUpstream],
    store_url: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    a, b, full, fast = pair
    bot = cli(capsys, "keys", "create", "--tenant", "acme", "--name", "bot", "--store", store_url)
    root = cli(capsys, "keys", "create", "--tenant", "ops", "--name", "root", "--admin",
               "--store", store_url)  # fmt: skip
    clients = [openai.OpenAI(base_url=g.url + "/v1", api_key=bot["key"], max_retries=0)
               for g in (a, b)]  # fmt: skip

    # keys made in the store: both replicas accept them within auth.refresh_s (the admin
    # key too, before it publishes: it was made after the refresh that brought the bot's)
    for g in (a, b):
        for made_key in (bot["key"], root["key"]):
            deadline = time.monotonic() + 5
            while httpx.get(g.url + "/v1/models", headers={"authorization": f"Bearer {made_key}"}
                            ).status_code != 200:  # fmt: skip
                assert time.monotonic() < deadline, f"{g.url} does not accept a key in the store"
                time.sleep(0.1)

    # a routing version published through A is applied by B
    admin = {"authorization": f"Bearer {root['key']}"}
    made = httpx.post(a.url + "/admin/v1/routing/versions", headers=admin,
                      json=STICKY)  # fmt: skip
    assert made.status_code == 201, made.text
    version = made.json()["id"]
    published = httpx.post(a.url + "/admin/v1/routing/publish", headers=admin,
                           json={"version": version})  # fmt: skip
    assert published.status_code == 200, published.text

    def chat(i: int, session: str | None, messages: list[dict[str, Any]]) -> Any:
        headers = {"x-session-id": session} if session else {}
        return clients[i % 2].chat.completions.with_raw_response.create(
            model="auto",
            messages=messages,  # type: ignore[arg-type]
            extra_headers=headers,
        )

    for i in (0, 1):  # the config's always_full until the published version is applied
        deadline = time.monotonic() + 5
        while chat(i, "probe", [{"role": "user", "content": "hi"}]).headers[
            "x-gearshift-tier"
        ] != "fast":  # fmt: skip
            assert time.monotonic() < deadline, f"replica {i} did not apply the routing version"
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

    # tier stickiness (the published session policy): what one replica chooses, named and
    # unnamed; then the same sessions sent to A and B in turn, and A stopped half-way
    key = bot["key"]
    assert run_session([b], full, fast, key, "alone", "task-1") == ONE_REPLICA
    assert run_session([b], full, fast, key, None, "task-2") == ONE_REPLICA
    assert run_session([a, b], full, fast, key, "moving", "task-3") == ONE_REPLICA
    moving = stored(store_url, "moving", len(STEPS))
    assert [r.seq for r in moving] == list(range(len(STEPS)))
    assert [r.tier for r in moving] == ONE_REPLICA
    assert run_session([a, b], full, fast, key, None, "task-4", stop_after=2) == ONE_REPLICA

    # A is stopped: B carries the named session on, and the chain
    assert a.proc.poll() is not None
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
