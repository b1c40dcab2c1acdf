"""Rules that force the full tier, in front of another policy.

The full tier is forced for a step whose pending tool call is mutating or destructive
(``router.risk``: a pruned model's wrong arguments to ``delete_branch`` cost data, not a
retry), that is about code or math (pruned models lose these first; REFERENCES.md), that
asks for a high reasoning effort, or that follows a failed tool call in the same tool loop
(a fast tier that just failed should not try again); every other step goes to the ``base``
policy. Each rule can be turned off:

    router: {policy: rules, params: {base: classifier, base_params: {},
                                     risky_tools: true, risk: {archive_ticket: mutating},
                                     code: true, math: true, effort: true, tool_error: true}}
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from router import risk as tool_risk
from router.policy import Policy, PolicyError, build_policy, register
from router.step_features import analyse_request
from router.types import Decision, RouteRequest, Tier

RULES = {
    "code": ("code", "code in the request"),
    "math": ("math", "math in the request"),
    "effort": ("reasoning_effort", "high reasoning effort asked"),
    "tool_error": ("last_tool_error", "the last tool call failed"),
}
FORCING_RISKS = ("mutating", "destructive")


@dataclass(frozen=True, slots=True)
class Rules:
    base: Policy
    enabled: tuple[str, ...]
    risky_tools: bool = True
    risk: Mapping[str, str] = field(default_factory=dict)
    name: str = "rules"

    def parts(self) -> tuple[object, ...]:
        return (self.base,)

    def decide(self, request: RouteRequest) -> Decision:
        features = analyse_request(request).features
        if self.risky_tools:
            found = tool_risk.pending(request.body, self.risk)
            if found is not None and found[0] in FORCING_RISKS:
                why = f"rule risky_tools: a {found[0]} tool call may follow ({found[1]})"
                return Decision(Tier.FULL, why, self.name, 1.0, features)
        for rule in self.enabled:
            key, why = RULES[rule]
            threshold = 2.0 if rule == "effort" else 1.0
            if features[key] >= threshold:
                return Decision(Tier.FULL, f"rule {rule}: {why}", self.name, 1.0, features)
        inner = self.base.decide(request)
        return Decision(
            inner.tier, f"{inner.reason} (no rule applied)", f"{self.name}/{inner.policy}",
            inner.propensity, {**features, **inner.features}, inner.score, inner.threshold,
        )  # fmt: skip


def _flag(p: dict[str, Any], key: str) -> bool:
    value = p.pop(key, True)
    if not isinstance(value, bool):
        raise PolicyError(f"rules: {key} must be true or false, got {value!r}")
    return value


@register("rules")
def _build(params: Mapping[str, Any]) -> Policy:
    p = dict(params)
    base_name = p.pop("base", "length_threshold")
    if base_name == "rules":
        raise PolicyError("rules: base cannot be 'rules'")
    base = build_policy(str(base_name), p.pop("base_params", None) or {})
    enabled = tuple(rule for rule in RULES if _flag(p, rule))
    risky = _flag(p, "risky_tools")
    overrides = p.pop("risk", None) or {}
    if not isinstance(overrides, Mapping) or any(
        v not in tool_risk.RISKS for v in overrides.values()
    ):
        raise PolicyError(f"rules: risk must map tool names to one of {', '.join(tool_risk.RISKS)}")
    if p:
        raise PolicyError(
            f"rules: unknown parameters {sorted(p)}; known: base, base_params, risky_tools, "
            f"risk, {', '.join(RULES)}"
        )
    return Rules(base, enabled, risky, dict(overrides))
