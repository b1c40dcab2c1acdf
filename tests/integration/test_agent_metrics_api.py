"""The agent metrics through the gateway: an agent's session run with the official client,
its tool result, its end and feedback, read back over the admin API and from /metrics."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx
import pytest

from gateway.auth import hash_key
from gateway.http.routes import agents
from tests.support.fake_upstream import Behaviour, FakeUpstream

KEYS = {"admin": "gs-admin-key", "agent": "gs-agent-key"}
AUTH = {
    "mode": "keys",
    "keys": [
        {"name": "ops", "tenant": "ops", "sha256": hash_key(KEYS["admin"]), "admin": True},
        {"name": "coder", "tenant": "acme", "sha256": hash_key(KEYS["agent"])},
    ],
}
CALL = {"id": "c1", "type": "function", "function": {"name": "search", "arguments": "{}"}}


def h(who: str, **extra: str) -> dict[str, str]:
    return {"authorization": f"Bearer {KEYS[who]}", **extra}


@pytest.fixture
def stack(make_stack, monkeypatch):
    monkeypatch.setattr(agents, "METRICS_EVERY_S", 0.2)
    up = FakeUpstream().then(
        Behaviour(message={"role": "assistant", "content": None, "tool_calls": [CALL]})
    )
    stack = make_stack([up], auth=AUTH)
    client = stack.client(api_key=KEYS["agent"])
    session = {"x-session-id": "task-1"}
    client.chat.completions.create(
        model="full", messages=[{"role": "user", "content": "find it"}], extra_headers=session
    )
    client.chat.completions.create(
        model="full",
        messages=[
            {"role": "user", "content": "find it"},
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "c1", "content": "Error: index missing"},
        ],
        extra_headers=session,
    )
    end = httpx.post(
        stack.url + "/v1/sessions/task-1/end", json={"outcome": "resolved"}, headers=h("agent")
    )
    assert end.status_code == 200, end.text
    fb = httpx.post(
        stack.url + "/v1/feedback", json={"session_id": "task-1", "score": 0.8}, headers=h("agent")
    )
    assert fb.status_code == 201, fb.text
    return stack


def test_an_admin_reads_the_five_metrics(stack):
    r = httpx.get(
        stack.url + "/admin/v1/agent-metrics",
        params={"group_by": "agent", "window": "1h"},
        headers=h("admin"),
    )
    assert r.status_code == 200, r.text
    (row,) = r.json()["data"]
    assert row["group"] == {"tenant": "acme", "agent": "coder"}
    assert (row["sessions"], row["task_success_rate"], row["steps"]) == (1, 1.0, 2)
    # the tool's result, carried by the next request, read as a failure
    assert (row["tool_calls"], row["tool_failure_rate"], row["timeout_rate"]) == (1, 1.0, 0.0)
    assert (row["feedback_count"], row["satisfaction"]) == (1, 0.8)


def test_prometheus_serves_the_latest_figures(stack):
    labels = {"tenant": "acme", "agent": "coder", "window": "1h"}
    stack.wait_metric("gearshift_agent_task_success_rate", labels, 1.0)
    stack.wait_metric("gearshift_agent_steps_per_session", labels, 2.0)
    stack.wait_metric("gearshift_agent_satisfaction", labels, 0.8)
    # the day's window is refreshed every REFRESH_TICKS["24h"] ticks (2 s here)
    stack.wait_metric("gearshift_agent_satisfaction", {**labels, "window": "24h"}, 0.8)


@pytest.mark.parametrize(
    ("params", "who", "status", "param"),
    [
        ({}, "agent", 403, None),
        ({"window": "forever"}, "admin", 400, "window"),
        ({"window": "0h"}, "admin", 400, "window"),
        ({"window": "9999d"}, "admin", 400, "window"),
        ({"group_by": "model"}, "admin", 400, "group_by"),
        ({"since": "yesterday"}, "admin", 400, "since"),
        ({"since": "2026-01-02", "window": "1h"}, "admin", 400, "since"),
        ({"since": "2026-01-02", "until": "2026-01-01"}, "admin", 400, "until"),
        ({"limit": "5"}, "admin", 400, "limit"),
    ],
)
def test_bad_queries_get_a_clear_error(make_stack, params, who, status, param):
    stack = make_stack([FakeUpstream()], auth=AUTH)
    r = httpx.get(stack.url + "/admin/v1/agent-metrics", params=params, headers=h(who))
    assert r.status_code == status, r.text
    assert r.json()["error"]["param"] == param


async def test_the_exporter_refreshes_the_day_less_often_than_the_hour():
    """A day of sessions costs ~24 times an hour's to aggregate and its figures move
    slowly: the exporter recomputes it every REFRESH_TICKS["24h"] ticks, the hour every
    tick, and keeps the last figures of a window it did not recompute."""
    from types import SimpleNamespace

    from gateway.metrics import Metrics

    exporter = agents.AgentMetricsExporter(SimpleNamespace(metrics=Metrics(), recorder=None))
    asked: list[tuple[int, timedelta]] = []
    tick = 0

    async def read(group_by, tenant, since, until, low=False):
        assert (group_by, tenant, until, low) == ("agent", None, None, True)
        asked.append((tick, datetime.now(UTC) - since))
        return [tick]

    exporter.read = read  # type: ignore[method-assign]
    every = agents.REFRESH_TICKS["24h"]
    for tick in range(2 * every + 1):
        await exporter.refresh(tick)
    day = [t for t, span in asked if span > timedelta(hours=2)]
    hour = [t for t, span in asked if span <= timedelta(hours=2)]
    assert hour == list(range(2 * every + 1))
    assert day == [0, every, 2 * every]
    assert exporter._snapshot == {"1h": [2 * every], "24h": [2 * every]}
