"""Baseline policy: long prompts go to the full tier, short ones to the fast tier.

This is the comparison baseline every smarter policy must beat (see
docs/router.md). It looks only at the estimated prompt length (sized from the session's
last exact count when it has one: ``router.tokens.anchored``).
"""

from __future__ import annotations

from dataclasses import dataclass

from router.policy import NonNegativeInt, Params, Policy, parse_params, register
from router.types import Decision, RouteRequest, Tier

DEFAULT_THRESHOLD_TOKENS = 512


@dataclass(frozen=True, slots=True)
class LengthThresholdParams:
    threshold_tokens: NonNegativeInt = DEFAULT_THRESHOLD_TOKENS  # at and above: the full tier


@dataclass(frozen=True, slots=True)
class LengthThreshold:
    threshold_tokens: int = DEFAULT_THRESHOLD_TOKENS
    name: str = "length_threshold"

    def decide(self, request: RouteRequest) -> Decision:
        tokens, anchored = request.analysis.prompt_tokens
        if tokens >= self.threshold_tokens:
            tier, cmp = Tier.FULL, ">="
        else:
            tier, cmp = Tier.FAST, "<"
        sized = " (session-anchored)" if anchored else ""
        return Decision(
            tier=tier,
            reason=f"length_threshold: ~{tokens} prompt tokens{sized} {cmp} {self.threshold_tokens}",
            policy=self.name,
            features={"prompt_tokens_est": float(tokens)},
            analysis=request.analysis,
        )


@register("length_threshold")
def _build(params: Params) -> Policy:
    p = parse_params(LengthThresholdParams, params, "length_threshold")
    return LengthThreshold(threshold_tokens=p.threshold_tokens)
