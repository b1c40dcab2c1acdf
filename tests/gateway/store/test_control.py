"""Routing versions and kill switches in the store, and each replica's copy of them."""

from __future__ import annotations

import asyncio
import time

import pytest

from gateway.config import RouterSettings
from gateway.routing.control import ControlPlane, ControlSync, bucket
from gateway.store import control
from gateway.store.database import make_engine, upgrade
from gateway.store.worker import StoreWorker

A = {"policy": "length_threshold", "params": {"threshold_tokens": 100}}
B = {"policy": "length_threshold", "params": {"threshold_tokens": 900}}
C = {"policy": "always_fast", "params": {}}


@pytest.fixture
def engine(store_url):
    upgrade(store_url)
    e = make_engine(store_url)
    yield e
    e.dispose()


def test_versions_are_content_addressed(engine):
    with engine.begin() as conn:
        a, created = control.create_version(conn, A, "ops", "first")
        again, created_again = control.create_version(
            conn, {"params": {"threshold_tokens": 100}, "policy": "length_threshold"}, "ops"
        )
    assert (created, created_again) == (True, False) and a == again == control.version_id(A)
    assert control.version_id(A) != control.version_id(B)


def test_publish_canary_and_a_rollback_stack(engine):
    with engine.begin() as conn:
        a, b, c = (control.create_version(conn, x, "ops")[0] for x in (A, B, C))
        with pytest.raises(control.ControlError, match="nothing is published"):
            control.rollback(conn, "ops")
        with pytest.raises(control.ControlError, match="publish a version before"):
            control.set_canary(conn, b, 0.1, "ops")
        control.publish(conn, a, "ops")
        with pytest.raises(control.ControlError, match="no earlier"):
            control.rollback(conn, "ops")
        control.publish(conn, b, "ops")
        s = control.set_canary(conn, c, 0.25, "ops", "try C")
        assert (s.published, s.canary, s.canary_weight) == (b, c, 0.25)
        assert control.publish(conn, c, "ops").canary is None  # promoting ends its canary
        # a rollback pops: C -> B -> A, never back and forth
        assert control.rollback(conn, "ops", "C is worse").published == b
        assert control.rollback(conn, "ops").published == a
        with pytest.raises(control.ControlError):
            control.rollback(conn, "ops")
        with pytest.raises(control.ControlError, match="no routing version"):
            control.publish(conn, "f" * 16, "ops")
        with pytest.raises(control.ControlError, match="between 0 and 1"):
            control.set_canary(conn, b, 1.0, "ops")
        with pytest.raises(control.ControlError, match="already published"):
            control.set_canary(conn, a, 0.5, "ops")
        log = control.events(conn)
    assert [e["action"] for e in log][:3] == ["rollback", "rollback", "publish"]
    assert log[1]["note"] == "C is worse" and all(e["actor"] == "ops" for e in log)


def test_kill_switches_are_recorded_actions(engine):
    with engine.begin() as conn:
        control.set_switch(conn, "tool_off", "run_shell", True, "ops", "incident 42")
        control.set_switch(conn, "all_to_full", "", True, "ops")
        control.set_switch(conn, "all_to_full", "", False, "ops", "over")
        with pytest.raises(control.ControlError, match="needs a target"):
            control.set_switch(conn, "tier_off", "", True, "ops")
        with pytest.raises(control.ControlError, match="takes no target"):
            control.set_switch(conn, "sandbox_off", "x", True, "ops")
        with pytest.raises(control.ControlError, match="kind must be"):
            control.set_switch(conn, "everything_off", "", True, "ops")  # type: ignore[arg-type]
        active = control.switches(conn, active_only=True)
        every = control.switches(conn)
        log = control.switch_events(conn)
        ids = control.changes(conn)
    assert [(s["kind"], s["target"]) for s in active] == [("tool_off", "run_shell")]
    assert len(every) == 2 and len(log) == 3 and log[0]["reason"] == "over"
    assert ids == (0, 3)


def test_a_canary_is_sticky_per_session_and_takes_its_share():
    points = [bucket(f"session-{i}") for i in range(20_000)]
    assert all(0 <= p < 1 for p in points)
    assert abs(sum(p < 0.1 for p in points) / len(points) - 0.1) < 0.01
    assert bucket("same") == bucket("same")


def test_replicas_follow_the_store_within_their_refresh(engine, store_url):
    async def scenario():
        planes = [ControlPlane(RouterSettings(policy="length_threshold")) for _ in range(2)]
        workers = [StoreWorker(store_url) for _ in planes]  # two replicas: one worker each
        syncs = [ControlSync(w, p, refresh_s=0.05) for w, p in zip(workers, planes, strict=True)]
        for w, s in zip(workers, syncs, strict=True):
            await w.open()
            await s.start()
        try:
            assert all(p.published is p.base for p in planes)
            with engine.begin() as conn:
                b = control.create_version(conn, B, "ops")[0]
                c = control.create_version(conn, C, "ops")[0]
                control.publish(conn, b, "ops")
                control.set_canary(conn, c, 0.5, "ops")
                control.set_switch(conn, "tenant_off", "acme", True, "ops")
            started = time.monotonic()
            while not all(p.published.id == b for p in planes):
                assert time.monotonic() - started < 1.0, "a replica missed the publish"
                await asyncio.sleep(0.01)
            for p in planes:
                assert p.tenant_off("acme") and not p.tenant_off("other")
                chosen = {p.choose(f"s{i}").id for i in range(200)}
                assert chosen == {b, c}
                assert p.choose("s1").id == p.choose("s1").id
            # one policy object per version, built once
            assert planes[0].choose("s1").policy is planes[0].choose("s1").policy
            with engine.begin() as conn:
                control.end_canary(conn, "ops")
            await syncs[0].refresh()
            assert {planes[0].choose(f"s{i}").id for i in range(200)} == {b}
        finally:
            for w, s in zip(workers, syncs, strict=True):
                await s.close()
                await w.close()

    asyncio.run(scenario())
