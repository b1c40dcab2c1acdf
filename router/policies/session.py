"""Session handling in front of another policy: escalation after a failure, and stickiness.

    router: {policy: session, params: {base: classifier, base_params: {...},
                                       cooldown_steps: 8, sticky: true}}

* After a fast-tier failure in the session (a step escalated to full, or a fast-tier
  answer that failed upstream; the gateway keeps the count), the next ``cooldown_steps``
  steps of that session go to the full tier.
* Inside a tool loop (the request ends with tool results after the assistant's tool calls)
  a session that was on the full tier stays there: the loop finishes on the tier that
  started it. Moving up from fast to full is always allowed: the tiers share tokenizer,
  chat template and tool-call parser (the family contract checked at start-up), so the
  full tier continues the fast tier's loop from the same token ids. At a new user turn the
  base policy decides afresh.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from router.policy import Policy, PolicyError, build_policy, register
from router.types import Decision, RouteRequest, Tier


def in_tool_loop(body: Mapping[str, Any]) -> bool:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return False
    last = messages[-1]
    return isinstance(last, Mapping) and last.get("role") == "tool"


@dataclass(frozen=True, slots=True)
class Session:
    base: Policy
    cooldown_steps: int = 8
    sticky: bool = True
    name: str = "session"

    def parts(self) -> tuple[object, ...]:
        return (self.base,)

    def decide(self, request: RouteRequest) -> Decision:
        state = request.session
        inner = self.base.decide(request)
        name = f"{self.name}/{inner.policy}"
        if state is not None and state.last_failure_step is not None:
            since = state.steps - state.last_failure_step  # 1: the previous step
            if since <= self.cooldown_steps:
                why = (f"session: a fast-tier step failed {since} step(s) ago "
                       f"(full for {self.cooldown_steps})")  # fmt: skip
                return self._force(inner, name, why)
        if (
            self.sticky
            and state is not None
            and state.last_tier is Tier.FULL
            and inner.tier is Tier.FAST
            and in_tool_loop(request.body)
        ):
            return self._force(inner, name, "session: the tool loop stays on the full tier")
        return Decision(
            inner.tier, inner.reason, name, inner.propensity, inner.features,
            inner.score, inner.threshold,
        )  # fmt: skip

    @staticmethod
    def _force(inner: Decision, name: str, why: str) -> Decision:
        reason = f"{why}; {inner.policy} said {inner.tier}"
        return Decision(Tier.FULL, reason, name, 1.0, inner.features, inner.score, inner.threshold)


@register("session")
def _build(params: Mapping[str, Any]) -> Policy:
    p = dict(params)
    base_name = str(p.pop("base", "classifier"))
    if base_name == "session":
        raise PolicyError("session: base cannot be 'session'")
    base = build_policy(base_name, p.pop("base_params", None) or {})
    cooldown = p.pop("cooldown_steps", 8)
    if isinstance(cooldown, bool) or not isinstance(cooldown, int) or cooldown < 0:
        raise PolicyError(
            f"session: cooldown_steps must be a non-negative integer, got {cooldown!r}"
        )
    sticky = p.pop("sticky", True)
    if not isinstance(sticky, bool):
        raise PolicyError(f"session: sticky must be true or false, got {sticky!r}")
    if p:
        raise PolicyError(
            f"session: unknown parameters {sorted(p)}; known: base, base_params, cooldown_steps, sticky"
        )
    return Session(base, cooldown, sticky)
