"""Constant policies: the 'always full' and 'always fast' baselines."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from router.policy import Policy, PolicyError, register
from router.types import Decision, RouteRequest, Tier


@dataclass(frozen=True, slots=True)
class Always:
    tier: Tier
    name: str

    def decide(self, request: RouteRequest) -> Decision:
        return Decision(tier=self.tier, reason=f"{self.name}: constant policy", policy=self.name)


def _no_params(name: str, params: Mapping[str, Any]) -> None:
    if params:
        raise PolicyError(f"{name}: takes no parameters, got {sorted(params)}")


@register("always_full")
def _full(params: Mapping[str, Any]) -> Policy:
    _no_params("always_full", params)
    return Always(Tier.FULL, "always_full")


@register("always_fast")
def _fast(params: Mapping[str, Any]) -> Policy:
    _no_params("always_fast", params)
    return Always(Tier.FAST, "always_fast")
