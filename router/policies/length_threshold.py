"""Baseline policy: long prompts go to the full tier, short ones to the fast tier.

This is the comparison baseline every smarter policy must beat (see
docs/router.md). It looks only at the estimated prompt length (sized from the session's
last exact count when it has one: ``router.tokens.anchored``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from router.policy import Policy, PolicyError, register
from router.step_features import request_prompt_tokens
from router.types import Decision, RouteRequest, Tier

DEFAULT_THRESHOLD_TOKENS = 512


@dataclass(frozen=True, slots=True)
class LengthThreshold:
    threshold_tokens: int = DEFAULT_THRESHOLD_TOKENS
    name: str = "length_threshold"

    def decide(self, request: RouteRequest) -> Decision:
        tokens, anchored = request_prompt_tokens(request)
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
        )


@register("length_threshold")
def _build(params: Mapping[str, Any]) -> Policy:
    unknown = set(params) - {"threshold_tokens"}
    if unknown:
        raise PolicyError(f"length_threshold: unknown parameters {sorted(unknown)}")
    threshold = params.get("threshold_tokens", DEFAULT_THRESHOLD_TOKENS)
    if not isinstance(threshold, int) or isinstance(threshold, bool) or threshold < 0:
        raise PolicyError("length_threshold: threshold_tokens must be a non-negative integer")
    return LengthThreshold(threshold_tokens=threshold)
