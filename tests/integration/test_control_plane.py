"""Routing versions and kill switches through the admin API, on two gateway replicas that
share one store: publish, canary, rollback and every switch, seen by the official client."""

from __future__ import annotations

import time
from typing import Any

import httpx
import openai
import pytest
from sqlalchemy import select

from gateway.auth import hash_key
from gateway.store.database import make_engine
from gateway.store.schema import steps
from tests.support.fake_upstream import FakeUpstream

KEYS = {"admin": "gs-ops-admin", "acme": "gs-acme-agent", "zeta": "gs-zeta-agent"}
AUTH = {
    "mode": "keys",
    "refresh_s": 0.1,
    "keys": [
        {"name": "ops", "tenant": "ops", "sha256": hash_key(KEYS["admin"]), "admin": True},
        {"name": "coder", "tenant": "acme", "sha256": hash_key(KEYS["acme"])},
        {"name": "bot", "tenant": "zeta", "sha256": hash_key(KEYS["zeta"])},
    ],
}
ALWAYS_FAST = {"policy": "always_fast", "params": {}}
ALWAYS_FULL = {"policy": "always_full", "params": {}}


class Replicas:
    def __init__(self, make_stack: Any, tmp_path: Any) -> None:
        store = {"url": f"sqlite:///{tmp_path}/shared.db"}
        self.stacks = [
            make_stack([FakeUpstream()], [FakeUpstream()], auth=AUTH, store=store) for _ in range(2)
        ]
        self.store_url = store["url"]

    def admin(self, method: str, path: str, replica: int = 0, **kw: Any) -> httpx.Response:
        return httpx.request(
            method, self.stacks[replica].url + "/admin/v1" + path,
            headers={"authorization": f"Bearer {KEYS['admin']}"}, **kw,
        )  # fmt: skip

    def chat(
        self, replica: int = 0, who: str = "acme", session: str = "s", model: str = "auto"
    ) -> Any:
        client = self.stacks[replica].client(api_key=KEYS[who])
        return client.chat.completions.with_raw_response.create(
            model=model,
            messages=[{"role": "user", "content": "hi"}],
            extra_headers={"x-session-id": session},
        )

    def tier(self, replica: int = 0, **kw: Any) -> str:
        return self.chat(replica, **kw).headers["x-gearshift-tier"]

    def version(self, config: dict[str, Any]) -> str:
        r = self.admin("POST", "/routing/versions", json=config)
        assert r.status_code == 201, r.text
        return str(r.json()["id"])

    def until(self, replica: int, tier: str, **kw: Any) -> float:
        """Seconds until ``replica`` routes to ``tier``."""
        started = time.monotonic()
        while self.tier(replica, **kw) != tier:
            assert time.monotonic() - started < 1.0, f"replica {replica} still not on {tier}"
            time.sleep(0.02)
        return time.monotonic() - started


@pytest.fixture
def replicas(make_stack, tmp_path):
    return Replicas(make_stack, tmp_path)


def test_publish_and_roll_back_on_every_replica_within_a_second(replicas):
    base = replicas.admin("GET", "/routing").json()["serving"]
    assert base["source"] == "config"
    fast, full = replicas.version(ALWAYS_FAST), replicas.version(ALWAYS_FULL)
    assert replicas.admin("POST", "/routing/publish", json={"version": fast}).status_code == 200
    assert replicas.tier(0) == "fast"  # the replica that took the change applies it at once
    replicas.until(1, "fast")
    r = replicas.admin("POST", "/routing/publish", json={"version": full, "note": "try full"})
    assert r.json()["published"] == full
    replicas.until(1, "full")
    r = replicas.admin("POST", "/routing/rollback", 1, json={"note": "full costs too much"})
    assert (r.status_code, r.json()["published"]) == (200, fast)
    replicas.until(0, "fast")
    events = replicas.admin("GET", "/routing").json()["events"]
    assert [(e["action"], e["actor"]) for e in events[:3]] == [
        ("rollback", "ops"), ("publish", "ops"), ("publish", "ops"),
    ]  # fmt: skip
    diff = replicas.admin("GET", "/routing/diff", params={"from": fast, "to": full}).json()
    assert diff["changes"] == [
        {"path": "policy", "change": "changed", "from": "always_fast", "to": "always_full"}
    ]
    # every recorded step names the version that routed it, the config file's one included
    time.sleep(0.5)
    engine = make_engine(replicas.store_url)
    with engine.connect() as conn:
        stamped = {v for (v,) in conn.execute(select(steps.c.routing_version))}
    engine.dispose()
    assert {fast, full} <= stamped and None not in stamped


def test_a_canary_takes_a_sticky_share_of_sessions(replicas):
    fast, full = replicas.version(ALWAYS_FAST), replicas.version(ALWAYS_FULL)
    replicas.admin("POST", "/routing/publish", json={"version": fast})
    r = replicas.admin("POST", "/routing/canary", json={"version": full, "weight": 0.5})
    assert r.status_code == 200, r.text
    time.sleep(0.3)
    seen = {}
    for i in range(16):
        tiers = {replicas.tier(i % 2, session=f"agent-{i}") for _ in range(2)}
        assert len(tiers) == 1, "a session changed version between its steps"
        seen[i] = tiers.pop()
    assert set(seen.values()) == {"fast", "full"}
    assert replicas.admin("DELETE", "/routing/canary").json()["canary"] is None
    replicas.until(1, "fast", session=next(f"agent-{i}" for i, t in seen.items() if t == "full"))


def test_kill_switches(replicas):
    def switch(kind: str, target: str = "", active: bool = True) -> None:
        body = {"kind": kind, "target": target, "active": active, "reason": "incident 7"}
        r = replicas.admin("POST", "/kill-switches", json=body)
        assert r.status_code == 200, r.text

    replicas.admin("POST", "/routing/publish", json={"version": replicas.version(ALWAYS_FAST)})
    switch("all_to_full")
    r = replicas.chat(0)
    assert r.headers["x-gearshift-tier"] == "full"
    replicas.until(1, "full")
    switch("all_to_full", active=False)
    switch("tier_off", "full")
    with pytest.raises(openai.InternalServerError) as err:  # 503 after the client's retries
        replicas.stacks[0].client(api_key=KEYS["acme"]).chat.completions.create(
            model="full", messages=[{"role": "user", "content": "x"}]
        )
    assert "switched off" in str(err.value)
    switch("tier_off", "full", active=False)
    switch("tool_off", "run_shell")
    r = httpx.post(
        replicas.stacks[0].url + "/v1/tools/run_shell",
        json={"arguments": {"command": "ls"}, "session_id": "s"},
        headers={"authorization": f"Bearer {KEYS['acme']}"},
    )
    assert r.status_code == 403 and "kill switch tool_off" in r.json()["error"]["message"]
    switch("tenant_off", "acme")
    time.sleep(0.3)
    for replica in (0, 1):
        with pytest.raises(openai.PermissionDeniedError, match="suspended"):
            replicas.chat(replica)
        assert replicas.tier(replica, who="zeta") == "fast"  # other tenants carry on
    log = replicas.admin("GET", "/kill-switches").json()
    assert len(log["events"]) == 6 and all(e["actor"] == "ops" for e in log["events"])
    assert {(s["kind"], s["target"]) for s in log["data"] if s["active"]} == {
        ("tool_off", "run_shell"), ("tenant_off", "acme"),
    }  # fmt: skip


BAD = [
    ("POST", "/routing/versions", {"policy": "nope"}, 400, "params"),
    ("POST", "/routing/versions", {"policy": "length_threshold", "params": {"x": 1}}, 400,
     "params"),
    ("POST", "/routing/versions", {"policy": "always_fast", "extra": 1}, 400, "extra"),
    ("POST", "/routing/publish", {"version": "0123456789abcdef"}, 404, "version"),
    ("POST", "/routing/publish", {"version": "../etc"}, 400, "version"),
    ("POST", "/routing/rollback", {}, 409, None),
    ("DELETE", "/routing/canary", None, 409, None),
    ("POST", "/routing/canary", {"version": "0123456789abcdef", "weight": 1.5}, 400,
     "weight"),
    ("POST", "/kill-switches", {"kind": "tier_off", "active": True}, 400, "target"),
    ("POST", "/kill-switches", {"kind": "tier_off", "target": "huge", "active": True}, 400,
     "target"),
    ("POST", "/kill-switches", {"kind": "sandbox_off", "target": "x", "active": True}, 400,
     "target"),
    ("POST", "/kill-switches", {"kind": "world_off", "active": True}, 400, "kind"),
    ("GET", "/routing/diff", None, 400, "from"),
]  # fmt: skip


def test_bad_admin_input(replicas):
    for method, path, body, status, param in BAD:
        r = (
            replicas.admin(method, path, json=body)
            if body is not None
            else replicas.admin(method, path)
        )
        assert (r.status_code, r.json()["error"]["param"]) == (status, param), (path, body, r.text)


def test_only_admins_change_routing(replicas):
    r = httpx.post(
        replicas.stacks[0].url + "/admin/v1/routing/rollback",
        json={},
        headers={"authorization": f"Bearer {KEYS['acme']}"},
    )
    assert r.status_code == 403
