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

from gateway.errors import ModelNotFound
from gateway.metrics import Metrics
from gateway.pipeline.request import ParsedRequest
from gateway.routing.calibration import TokenCalibrator
from gateway.routing.sessions import RouteSessions, SessionKeys, load_signals
from gateway.upstream.pool import TierPool
from gateway.upstream.scrape import Scraper
from router import Decision, Policy, RouteRequest, Tier
from router.tokens import Counts

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Sizing:
    """How the router sized the prompt, kept to learn from the tier's exact count."""

    counts: Counts  # what the estimate is made of (router.tokens)
    estimate: int  # the prompt tokens it routed with
    anchored: bool  # sized from the session's last exact count
    position: tuple[int, int] | None  # where a chat conversation ends (tokens.position)


@dataclass(frozen=True, slots=True)
class Routing:
    tier: Tier
    decision: Decision | None  # None: the client pinned the tier
    keys: SessionKeys  # the session as routing knows it
    sizing: Sizing | None = None  # routed requests only

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
        policy: Policy,
        sessions: RouteSessions,
        pools: Mapping[Tier, TierPool],
        scraper: Scraper,
        calibrator: TokenCalibrator,
        metrics: Metrics,
    ) -> None:
        self.policy = policy
        self.sessions = sessions
        self.pools = pools
        self.scraper = scraper
        self.calibrator = calibrator
        self.metrics = metrics
        self.models: dict[str, Tier] = {}
        for tier, pool in pools.items():
            self.models[pool.model] = tier
            self.models.setdefault(tier.value, tier)  # "full"/"fast" pin a tier too

    def __call__(self, parsed: ParsedRequest) -> Routing:
        who = parsed.identity
        keys = self.sessions.keys(who.tenant, who.session_id, parsed.body)
        if who.requested_model == "auto":
            return self._routed(parsed, keys)
        tier = self.models.get(who.requested_model)
        if tier is None:
            known = ", ".join(["auto", *sorted(self.models)])
            raise ModelNotFound(
                f"model {who.requested_model!r} does not exist; available: {known}", param="model"
            )
        self.metrics.routes.labels(tier, "pinned").inc()
        return Routing(tier, None, keys)

    def _routed(self, parsed: ParsedRequest, keys: SessionKeys) -> Routing:
        who, body = parsed.identity, parsed.body
        request = RouteRequest(
            who.endpoint, body, keys.key, self.sessions.get(who.tenant, keys.key),
            load_signals(self.pools, self.scraper), tokens=self.calibrator.model,
        )  # fmt: skip
        started = time.perf_counter()
        sizing = None
        try:
            decision = self.policy.decide(request)
            analysis = decision.analysis or request.analysis  # what the policy sized it by
            estimate, anchored = analysis.prompt_tokens
            sizing = Sizing(analysis.counts, estimate, anchored, analysis.position)
        except Exception as exc:  # a routing bug must not fail the request
            log.exception("routing policy failed on request %s", who.request_id)
            why = f"policy error ({type(exc).__name__}): full tier"
            decision = Decision(Tier.FULL, why, "error")
        self.metrics.route_decision.observe(time.perf_counter() - started)
        if decision.tier not in self.pools:  # one-tier deployments
            only = next(iter(self.pools))
            decision = replace(decision, tier=only, reason=decision.reason + "; only tier")
        self.metrics.routes.labels(decision.tier, decision.policy).inc()
        return Routing(decision.tier, decision, keys, sizing)
