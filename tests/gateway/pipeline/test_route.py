"""The route stage: pinned or routed, unknown models, a failing policy, one-tier deployments."""

from __future__ import annotations

import pytest

from gateway.config import BreakerSettings, HealthSettings, RouterSettings
from gateway.errors import ModelNotFound, TierSwitchedOff
from gateway.metrics import Metrics
from gateway.pipeline.route import RouteStage, Routing
from gateway.routing.calibration import TokenCalibrator
from gateway.routing.control import ControlPlane, Version
from gateway.routing.sessions import RouteSessions
from gateway.upstream.pool import TierPool
from gateway.upstream.scrape import Scraper
from router import Decision, RouteRequest, Tier
from router.analysis import Tally
from router.policies.length_threshold import LengthThreshold
from router.tokens import counts
from router.types import SessionState
from tests.gateway.pipeline.conftest import parsed

MODELS = {Tier.FULL: "model-full", Tier.FAST: "model-fast"}


class Spy:
    """A policy that answers ``tier`` (or raises ``fails``) and keeps what it was asked."""

    name = "spy"

    def __init__(self, tier: Tier = Tier.FAST, fails: Exception | None = None) -> None:
        self.tier = tier
        self.fails = fails
        self.requests: list[RouteRequest] = []

    def decide(self, request: RouteRequest) -> Decision:
        self.requests.append(request)
        if self.fails is not None:
            raise self.fails
        return Decision(self.tier, f"spy chose {self.tier}", self.name, 0.75)


def plane(policy) -> ControlPlane:
    """A control plane whose published version is ``policy``."""
    p = ControlPlane(RouterSettings(policy="always_full"))
    p.published = Version("spy-version", {"policy": "spy"}, policy, "test")
    return p


def stage(policy, tiers=(Tier.FULL, Tier.FAST), sessions=None) -> RouteStage:
    pools = {
        t: TierPool(
            t, MODELS[t], [f"http://{t}-0", f"http://{t}-1"], BreakerSettings(), HealthSettings()
        )
        for t in tiers
    }
    metrics = Metrics()
    return RouteStage(
        plane(policy),
        sessions if sessions is not None else RouteSessions(),
        pools,
        Scraper(pools, metrics, 10.0),
        TokenCalibrator(None),
        metrics,
    )


def sample(s: RouteStage, name: str, **labels: str) -> float:
    return s.metrics.registry.get_sample_value(name, labels) or 0.0


@pytest.mark.parametrize(
    ("model", "tier"),
    [
        ("model-full", Tier.FULL),
        ("model-fast", Tier.FAST),
        ("full", Tier.FULL),
        ("fast", Tier.FAST),
    ],
)
def test_a_tiers_model_or_name_pins_it(model, tier):
    policy = Spy()
    s = stage(policy)
    routing = s(parsed({"model": model, "messages": [{"role": "user", "content": "hi"}]}))
    assert routing.tier is tier and routing.decision is None and routing.sizing is None
    assert not routing.allow_fallback and routing.reason == "pinned"
    assert policy.requests == []  # the policy is not asked
    assert sample(s, "gearshift_route_decisions_total", tier=str(tier), policy="pinned") == 1


def test_an_unknown_model_is_a_404_listing_the_available_names():
    s = stage(Spy())
    with pytest.raises(ModelNotFound) as err:
        s(parsed({"model": "gpt-4", "messages": []}))
    assert err.value.status == 404 and err.value.param == "model"
    assert err.value.message == (
        "model 'gpt-4' does not exist; available: auto, fast, full, model-fast, model-full"
    )


def test_auto_asks_the_policy_with_the_sessions_history_and_the_tiers_load():
    sessions = RouteSessions()
    state = SessionState(steps=3, last_tier=Tier.FULL)
    sessions.put("acme", "agent-7", state)
    policy = Spy(Tier.FAST)
    s = stage(policy, sessions=sessions)
    s.pools[Tier.FULL].replicas[0].in_flight = 4
    routing = s(parsed(session_id="agent-7", tenant="acme"))
    assert routing.tier is Tier.FAST and routing.allow_fallback
    assert routing.reason == "spy chose fast" and routing.decision.propensity == 0.75
    assert routing.keys.key == "agent-7" and routing.keys.named
    (request,) = policy.requests
    assert request.session == state and request.session_id == "agent-7"
    assert request.load.queue_per_replica == {Tier.FULL: 2.0, Tier.FAST: 0.0}
    assert sample(s, "gearshift_route_decisions_total", tier="fast", policy="spy") == 1
    assert sample(s, "gearshift_route_decision_seconds_count") == 1


def test_a_routed_request_keeps_how_its_prompt_was_sized():
    s = stage(LengthThreshold(threshold_tokens=10_000))
    routing = s(parsed())
    assert routing.tier is Tier.FAST and routing.sizing is not None
    assert routing.sizing.estimate > 0 and not routing.sizing.anchored
    assert routing.sizing.counts.chars > 0
    assert routing.sizing.position is not None and routing.sizing.position[0] == 1  # one message


def test_a_policy_that_raises_sends_the_request_to_the_full_tier(caplog):
    s = stage(Spy(fails=KeyError("boom")))
    routing = s(parsed())
    assert routing.tier is Tier.FULL and routing.allow_fallback
    assert routing.reason == "policy error (KeyError): full tier"
    assert routing.decision.policy == "error" and routing.sizing is None
    assert sample(s, "gearshift_route_decisions_total", tier="full", policy="error") == 1
    assert "routing policy failed on request req-1" in caplog.text


@pytest.mark.parametrize("fails", [None, RuntimeError("x")], ids=["chooses_full", "raises"])
def test_a_one_tier_deployment_serves_every_routed_request_from_its_tier(fails):
    s = stage(Spy(Tier.FULL, fails=fails), tiers=(Tier.FAST,))
    routing = s(parsed())
    assert routing.tier is Tier.FAST and routing.reason.endswith("; only tier")
    assert (
        sample(s, "gearshift_route_decisions_total", tier="fast", policy=routing.decision.policy)
        == 1
    )


def test_a_one_tier_deployment_does_not_know_the_missing_tiers_name():
    s = stage(Spy(), tiers=(Tier.FAST,))
    with pytest.raises(ModelNotFound) as err:
        s(parsed({"model": "full", "messages": []}))
    assert err.value.message.endswith("available: auto, fast, model-fast")


def switched(s: RouteStage, *pairs: tuple[str, str]) -> None:
    s.control._switches = frozenset(pairs)


def test_every_routing_names_the_version_in_force():
    s = stage(Spy(Tier.FAST))
    assert s(parsed()).version == "spy-version"
    assert s(parsed({"model": "full", "messages": []})).version == "spy-version"


def test_kill_switches_override_the_policy_and_say_so():
    s = stage(Spy(Tier.FAST))
    switched(s, ("all_to_full", ""))
    routing = s(parsed())
    assert routing.tier is Tier.FULL and routing.reason.endswith("; kill switch all_to_full")
    switched(s, ("tier_off", "fast"))
    routing = s(parsed())
    assert routing.tier is Tier.FULL and routing.reason.endswith("; kill switch tier_off fast")
    with pytest.raises(TierSwitchedOff) as err:  # a pinned tier is never replaced
        s(parsed({"model": "fast", "messages": []}))
    assert err.value.status == 503 and err.value.param == "model"
    switched(s, ("tier_off", "fast"), ("tier_off", "full"))
    with pytest.raises(TierSwitchedOff, match="every tier"):
        s(parsed())


def test_a_sessions_step_extends_the_tally_its_last_step_left():
    sessions = RouteSessions()
    policy = Spy(Tier.FAST)
    s = stage(policy, sessions=sessions)
    first = [{"role": "system", "content": "agent"}, {"role": "user", "content": "fix it"}]
    call = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]}  # fmt: skip
    second = [*first, call, {"role": "tool", "tool_call_id": "c1", "content": "a.py b.py"}]

    def step(messages: list, tenant: str = "acme") -> Routing:
        routing = s(parsed({"model": "auto", "messages": messages}, session_id="s", tenant=tenant))
        assert routing.sizing is not None and routing.sizing.tally is not None
        sessions.finish(tenant, routing.keys, routing.tier, escalated=False, failed=False,
                        tally=routing.sizing.tally)  # fmt: skip
        return routing

    one = step(first)
    assert policy.requests[-1].prior is None
    two = step(second)
    assert policy.requests[-1].prior is one.sizing.tally
    assert two.sizing.counts == counts({"messages": second})
    assert two.sizing.tally.sums == Tally.of(second).sums
    assert step(second, tenant="globex") and policy.requests[-1].prior is None
    edited = [first[0], {"role": "user", "content": "fix it now"}, *second[2:]]
    three = step(edited)
    assert policy.requests[-1].prior is two.sizing.tally
    assert three.sizing.counts == counts({"messages": edited})
    assert three.sizing.tally.messages == edited
