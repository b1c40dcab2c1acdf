"""The route stage: which tier serves the request, why, and whether it may fall back.

``model: "auto"`` goes through the configured policy with the session's history and the
tiers' load; a tier's model name (or ``full`` / ``fast``) pins that tier, which is then
never replaced. A policy that raises is a bug: logged, and the request goes to the full
tier rather than failing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from gateway.errors import ModelNotFound, TierSwitchedOff
from gateway.metrics import Metrics
from gateway.pipeline.request import ParsedRequest
from gateway.routing.calibration import TokenCalibrator
from gateway.routing.control import ControlPlane
from gateway.routing.sessions import RouteSessions, SessionKeys, load_signals
from gateway.upstream.pool import TierPool
from gateway.upstream.scrape import Scraper
from router import Decision, RouteRequest, Tier
from router.analysis import Tally
from router.tokens import Counts

if TYPE_CHECKING:
    from gateway.pipeline.context.stage import Applied

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Sizing:
    """How the router sized the prompt, kept to learn from the tier's exact count."""

    counts: Counts  # what the estimate is made of (router.tokens)
    estimate: int  # the prompt tokens it routed with
    anchored: bool  # sized from the session's last exact count
    position: tuple[int, int] | None  # where a chat conversation ends (tokens.position)
    tally: Tally | None = None  # what it read of the messages, for the session's next step


@dataclass(frozen=True, slots=True)
class Routing:
    tier: Tier
    decision: Decision | None  # None: the client pinned the tier
    keys: SessionKeys  # the session as routing knows it
    sizing: Sizing | None = None  # routed requests only
    context: Applied | None = None  # set by the context stage, when it condensed the messages
    version: str | None = None  # the routing version in force for the session

    @property
    def allow_fallback(self) -> bool:
        """Only routed requests move to the other tier; a pinned tier is never replaced."""
        return self.decision is not None

    @property
    def reason(self) -> str:
        return self.decision.reason if self.decision is not None else "pinned"


class RouteStage:
    def __init__(
        self,
        control: ControlPlane,
        sessions: RouteSessions,
        pools: Mapping[Tier, TierPool],
        scraper: Scraper,
        calibrator: TokenCalibrator,
        metrics: Metrics,
    ) -> None:
        self.control = control
        self.sessions = sessions
        self.pools = pools
        self.scraper = scraper
        self.calibrator = calibrator
        self.metrics = metrics
        self.models: dict[str, Tier] = {}
        for tier, pool in pools.items():
            self.models[pool.model] = tier
            self.models.setdefault(tier.value, tier)  # "full"/"fast" pin a tier too

    def __call__(self, parsed: ParsedRequest, keys: SessionKeys | None = None) -> Routing:
        """Route ``parsed``, whose session is known by ``keys`` (``RouteSessions.known``,
        which may read the store; without them, as this replica knows it)."""
        who = parsed.identity
        if keys is None:
            keys = self.sessions.keys(who.tenant, who.session_id, parsed.body)
        if who.requested_model == "auto":
            return self._routed(parsed, keys)
        tier = self.models.get(who.requested_model)
        if tier is None:
            known = ", ".join(["auto", *sorted(self.models)])
            raise ModelNotFound(
                f"model {who.requested_model!r} does not exist; available: {known}", param="model"
            )
        if self.control.tier_off(tier):
            raise TierSwitchedOff(
                f"the {tier} tier is switched off by an operator; use model 'auto'",
                param="model",
            )
        self.metrics.routes.labels(tier, "pinned").inc()
        return Routing(tier, None, keys, version=self.control.choose(keys.key).id)

    def _routed(self, parsed: ParsedRequest, keys: SessionKeys) -> Routing:
        who, body = parsed.identity, parsed.body
        request = RouteRequest(
            who.endpoint, body, keys.key, self.sessions.get(who.tenant, keys.key),
            load_signals(self.pools, self.scraper), tokens=self.calibrator.model,
            prior=self.sessions.tallies.get(who.tenant, keys.key),
        )  # fmt: skip
        started = time.perf_counter()
        sizing = None
        version = self.control.choose(keys.key)
        try:
            decision = version.policy.decide(request)
            analysis = decision.analysis or request.analysis  # what the policy sized it by
            estimate, anchored = analysis.prompt_tokens
            sizing = Sizing(analysis.counts, estimate, anchored, analysis.position, analysis.tally)
        except Exception as exc:  # a routing bug must not fail the request
            log.exception("routing policy failed on request %s", who.request_id)
            why = f"policy error ({type(exc).__name__}): full tier"
            decision = Decision(Tier.FULL, why, "error")
        self.metrics.route_decision.observe(time.perf_counter() - started)
        decision = self._switched(decision)
        if decision.tier not in self.pools:  # one-tier deployments
            only = next(iter(self.pools))
            decision = replace(decision, tier=only, reason=decision.reason + "; only tier")
        self.metrics.routes.labels(decision.tier, decision.policy).inc()
        return Routing(decision.tier, decision, keys, sizing, version=version.id)

    def _switched(self, decision: Decision) -> Decision:
        """The operators' kill switches over the policy's choice: everything to the full
        tier, or away from a tier that is switched off."""
        tier = decision.tier
        why = ""
        if self.control.all_to_full and tier != Tier.FULL:
            tier, why = Tier.FULL, "; kill switch all_to_full"
        if self.control.tier_off(tier):
            others = [t for t in self.pools if t != tier and not self.control.tier_off(t)]
            if not others:
                raise TierSwitchedOff("every tier is switched off by an operator")
            tier, why = others[0], why + f"; kill switch tier_off {decision.tier}"
        return replace(decision, tier=tier, reason=decision.reason + why) if why else decision
