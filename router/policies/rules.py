"""Rules that force the full tier, in front of another policy.

The full tier is forced for a step that is about code or math (pruned models lose these
first; REFERENCES.md), that asks for a high reasoning effort, or that follows a failed tool
call in the same tool loop (a fast tier that just failed should not try again); every other
step goes to the ``base`` policy. Each rule can be turned off:

    router: {policy: rules, params: {base: length_threshold, base_params: {threshold_tokens: 512},
                                     code: true, math: true, effort: true, tool_error: true}}
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from router.policy import Policy, PolicyError, build_policy, register
from router.step_features import step_features
from router.types import Decision, RouteRequest, Tier

RULES = {
    "code": ("code", "code in the request"),
    "math": ("math", "math in the request"),
    "effort": ("reasoning_effort", "high reasoning effort asked"),
    "tool_error": ("last_tool_error", "the last tool call failed"),
}


@dataclass(frozen=True, slots=True)
class Rules:
    base: Policy
    enabled: tuple[str, ...]
    name: str = "rules"

    def decide(self, request: RouteRequest) -> Decision:
        features = step_features(request.body)
        for rule in self.enabled:
            key, why = RULES[rule]
            threshold = 2.0 if rule == "effort" else 1.0
            if features[key] >= threshold:
                return Decision(Tier.FULL, f"rule {rule}: {why}", self.name, 1.0, features)
        inner = self.base.decide(request)
        return Decision(
            inner.tier, f"{inner.reason} (no rule applied)", f"{self.name}/{inner.policy}",
            inner.propensity, {**features, **inner.features},
        )  # fmt: skip


@register("rules")
def _build(params: Mapping[str, Any]) -> Policy:
    p = dict(params)
    base_name = p.pop("base", "length_threshold")
    if base_name == "rules":
        raise PolicyError("rules: base cannot be 'rules'")
    base = build_policy(str(base_name), p.pop("base_params", None) or {})
    enabled = []
    for rule in RULES:
        value = p.pop(rule, True)
        if not isinstance(value, bool):
            raise PolicyError(f"rules: {rule} must be true or false, got {value!r}")
        if value:
            enabled.append(rule)
    if p:
        raise PolicyError(
            f"rules: unknown parameters {sorted(p)}; known: base, base_params, {', '.join(RULES)}"
        )
    return Rules(base, tuple(enabled))
