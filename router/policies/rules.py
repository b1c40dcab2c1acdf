"""Rules that force the full tier, in front of another policy.

The full tier is forced for a step that must call a mutating or destructive tool (a named
or ``"required"`` ``tool_choice``; ``router.risk``: a pruned model's wrong arguments to
``delete_branch`` cost data, not a retry) — or, with the opt-in ``risky_offered``, for any
step that is merely offered such a tool —, for a step that must call any tool (``tool_call``:
the pruned fast tier made the full tier's call on 8 of 18 forced steps of stored agent
sessions, docs/decisions/forced-tool-calls-go-full.md), that is about code or math (pruned
models lose these first; REFERENCES.md), that asks for a high reasoning effort, or that
follows a failed tool call in the same tool loop (a fast tier that just failed should not
try again); every other step goes to the ``base`` policy. Each rule can be turned off:

    router: {policy: rules, params: {base: classifier, base_params: {},
                                     risky_tools: true, risky_offered: false,
                                     risk: {archive_ticket: mutating},
                                     tool_call: true, code: true, math: true, effort: true,
                                     tool_error: true}}
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Annotated, Literal, TypeAlias

from router import risk as tool_risk
from router.policy import Check, Params, Policy, PolicyError, build_policy, parse_params, register
from router.types import Decision, RouteRequest, Tier

Rule: TypeAlias = Literal["tool_call", "code", "math", "effort", "tool_error"]
RULES: dict[Rule, tuple[str, str]] = {  # the step feature each reads, and why it forces full
    # measured on the stored agent sessions (docs/benchmarks.md, "Pruned fast tier on the
    # agentic steps"): the same name is forced, the arguments differ
    "tool_call": (
        "forced_tool",
        "a forced tool call (the fast tier's calls agree 0.44 of the time)",
    ),
    "code": ("code", "code in the request"),
    "math": ("math", "math in the request"),
    "effort": ("reasoning_effort", "high reasoning effort asked"),
    "tool_error": ("last_tool_error", "the last tool call failed"),
}
FORCING_RISKS = ("mutating", "destructive")
RiskMap: TypeAlias = Annotated[
    Mapping[str, tool_risk.Risk],
    Check(f"a map of tool names to one of {', '.join(tool_risk.RISKS)}"),
]


@dataclass(frozen=True, slots=True)
class RulesParams:
    base: str = "length_threshold"  # the policy that decides when no rule applies
    base_params: Mapping[str, object] | None = None
    risky_tools: bool = True
    # also when the risky tool is only offered (no forced call): off since 2026-12-02, it
    # fired on every step of an agent whose tool list holds one (docs/decisions/)
    risky_offered: bool = False
    risk: RiskMap | None = None  # tool name -> risk class, over ``router.risk``'s own
    tool_call: bool = True  # any forced tool call (named or "required"), whatever its risk
    code: bool = True
    math: bool = True
    effort: bool = True
    tool_error: bool = True

    def __post_init__(self) -> None:
        if self.base == "rules":
            raise PolicyError("base cannot be 'rules'")

    @property
    def enabled(self) -> tuple[Rule, ...]:
        on = {"tool_call": self.tool_call, "code": self.code, "math": self.math,
              "effort": self.effort, "tool_error": self.tool_error}  # fmt: skip
        return tuple(rule for rule in RULES if on[rule])


@dataclass(frozen=True, slots=True)
class Rules:
    base: Policy
    enabled: tuple[Rule, ...]
    risky_tools: bool = True
    risk: Mapping[str, tool_risk.Risk] = field(default_factory=dict)
    risky_offered: bool = False
    name: str = "rules"

    def parts(self) -> tuple[object, ...]:
        return (self.base,)

    def decide(self, request: RouteRequest) -> Decision:
        features = request.analysis.step.features
        if self.risky_tools:
            found = tool_risk.pending(request.body, self.risk, self.risky_offered)
            if found is not None and found[0] in FORCING_RISKS:
                why = f"rule risky_tools: a {found[0]} tool call may follow ({found[1]})"
                return Decision(Tier.FULL, why, self.name, 1.0, features, analysis=request.analysis)
        for rule in self.enabled:
            key, why = RULES[rule]
            threshold = 2.0 if rule == "effort" else 1.0
            if features[key] >= threshold:
                why = f"rule {rule}: {why}"
                return Decision(Tier.FULL, why, self.name, 1.0, features, analysis=request.analysis)
        inner = self.base.decide(request)
        return replace(
            inner,
            reason=f"{inner.reason} (no rule applied)",
            policy=f"{self.name}/{inner.policy}",
            features={**features, **inner.features},
            analysis=request.analysis,
        )


@register("rules")
def _build(params: Params) -> Policy:
    p = parse_params(RulesParams, params, "rules")
    base = build_policy(p.base, p.base_params or {})
    return Rules(base, p.enabled, p.risky_tools, dict(p.risk or {}), p.risky_offered)
