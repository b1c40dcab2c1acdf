"""The outcome: a frozen account of a served request, its route reason, headers, overhead."""

from __future__ import annotations

import dataclasses

import pytest

from gateway.pipeline.outcome import Outcome, Served, StepPlan, headers, route_reason
from gateway.pipeline.route import Routing
from gateway.routing.sessions import SessionKeys
from gateway.upstream.dispatch import Attempts
from router import Decision, Tier
from tests.gateway.pipeline.conftest import parsed

PINNED = Routing(Tier.FULL, None, SessionKeys(None))
ROUTED = Routing(Tier.FAST, Decision(Tier.FAST, "short prompt", "rules"), SessionKeys("s"))


def test_served_is_a_frozen_copy_of_the_attempts():
    attempts = Attempts(Tier.FAST, fallback=True, count=2, replica="http://r", upstream_s=0.5)
    served = Served.of(attempts, "bad tool call")
    attempts.count, attempts.tier = 9, Tier.FULL
    assert served == Served(Tier.FAST, True, 2, "http://r", 0.5, "bad tool call")
    with pytest.raises(dataclasses.FrozenInstanceError):
        served.attempts = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("routing", "served", "reason"),
    [
        (PINNED, Served(Tier.FULL), "pinned"),
        (ROUTED, Served(Tier.FAST), "short prompt"),
        (ROUTED, Served(Tier.FULL, fallback=True), "short prompt; fallback to full"),
        (
            ROUTED,
            Served(Tier.FULL, escalated="truncated"),
            "short prompt; escalated to full: truncated",
        ),
        (
            ROUTED,
            Served(Tier.FULL, fallback=True, escalated="x"),
            "short prompt; escalated to full: x; fallback to full",
        ),
    ],
)
def test_route_reason_says_what_routing_and_dispatch_did(routing, served, reason):
    assert route_reason(routing, served) == reason
    assert Outcome(parsed(), routing, served, 200).route_reason == reason


def test_every_answer_carries_the_request_tier_reason_and_overhead_headers():
    served = Served(Tier.FULL, fallback=True)
    assert headers("req-9", ROUTED, served, None, 1.23456) == {
        "x-request-id": "req-9",
        "x-gearshift-tier": "full",
        "x-gearshift-route-reason": "short prompt; fallback to full",
        "x-gearshift-overhead-ms": "1.235",
    }


def test_a_recorded_answer_names_its_steps():
    step = StepPlan(("a" * 32, "b" * 32), 0.0)
    out = headers("req-9", PINNED, Served(Tier.FULL), step, 0.0)
    assert out["x-gearshift-step-id"] == "a" * 32 + "," + "b" * 32


def test_overhead_is_elapsed_minus_waiting_on_replicas():
    request = parsed(t0=100.0)
    outcome = Outcome(request, PINNED, Served(Tier.FULL, upstream_s=0.25), 200, ended_at=100.3)
    assert outcome.overhead_ms() == pytest.approx(50.0)
    waited_longer = Outcome(request, PINNED, Served(Tier.FULL, upstream_s=0.5), 200, ended_at=100.3)
    assert waited_longer.overhead_ms() == 0.0  # never negative


def test_the_outcome_reads_identity_and_tier_through():
    request = parsed()
    outcome = Outcome(request, ROUTED, Served(Tier.FULL, fallback=True), 200)
    assert outcome.identity is request.identity and outcome.tier is Tier.FULL
