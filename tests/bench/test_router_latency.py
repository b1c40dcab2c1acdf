"""bench.router_latency's decision digest: the agent sessions routed step by step as the
gateway routes them, each step extending the last one's tally."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

import bench.router_latency as latency
from gateway.config import Settings
from router import RouteRequest, build_policy


def default_policy() -> Any:
    router = Settings().router
    return build_policy(router.policy, router.params)


def test_the_digest_is_the_same_with_the_tallies_or_reading_every_step_afresh(
    monkeypatch: pytest.MonkeyPatch,
):
    policy = default_policy()
    shapes = [latency.session(10, 2_000), latency.session(30, 8_000)]
    incremental = latency.decision_digest(policy, shapes)
    assert incremental == latency.decision_digest(default_policy(), shapes)

    def afresh(*args: Any, prior: Any = None, **kwargs: Any) -> RouteRequest:
        return RouteRequest(*args, **kwargs)

    monkeypatch.setattr(latency, "RouteRequest", afresh)
    assert latency.decision_digest(policy, shapes) == incremental


def test_route_sessions_counts_the_cpu_and_extends_the_tallies():
    sessions = latency.agent_steps(2)
    assert [len(s) for s in sessions] == [15, 15]
    assert latency.route_sessions(default_policy(), sessions) > 0


def test_the_sessions_mode_prints_its_figures_and_digest():
    out = subprocess.run(
        [sys.executable, "-m", "bench.router_latency", "--sessions", "1"],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    last = json.loads(out.stdout.strip().splitlines()[-1])
    assert last["steps"] == 240 and len(last["us_per_step_passes"]) == 1
    assert last["decision_digest"] == latency.decision_digest(default_policy(), [])
