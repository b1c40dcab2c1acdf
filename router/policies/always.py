"""Constant policies: the 'always full' and 'always fast' baselines."""

from __future__ import annotations

from dataclasses import dataclass

from router.policy import Params, Policy, parse_params, register
from router.types import Decision, RouteRequest, Tier


@dataclass(frozen=True, slots=True)
class AlwaysParams:
    """None: a constant policy takes no parameters."""


@dataclass(frozen=True, slots=True)
class Always:
    tier: Tier
    name: str

    def decide(self, request: RouteRequest) -> Decision:
        reason = f"{self.name}: constant policy"
        return Decision(self.tier, reason, self.name, analysis=request.analysis)


@register("always_full")
def _full(params: Params) -> Policy:
    parse_params(AlwaysParams, params, "always_full")
    return Always(Tier.FULL, "always_full")


@register("always_fast")
def _fast(params: Params) -> Policy:
    parse_params(AlwaysParams, params, "always_fast")
    return Always(Tier.FAST, "always_fast")
