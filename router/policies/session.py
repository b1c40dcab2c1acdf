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
from dataclasses import dataclass, replace
from typing import Any

from router.policy import (
    NonNegativeInt,
    Params,
    Policy,
    PolicyError,
    build_policy,
    parse_params,
    register,
)
from router.types import Decision, RouteRequest, SessionState, Tier


def in_tool_loop(body: Mapping[str, Any]) -> bool:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return False
    last = messages[-1]
    return isinstance(last, Mapping) and last.get("role") == "tool"


@dataclass(frozen=True, slots=True)
class SessionParams:
    base: str = "classifier"  # the policy that decides when the session does not
    base_params: Mapping[str, object] | None = None
    cooldown_steps: NonNegativeInt = 8
    sticky: bool = True

    def __post_init__(self) -> None:
        if self.base == "session":
            raise PolicyError("base cannot be 'session'")


@dataclass(frozen=True, slots=True)
class Session:
    base: Policy
    cooldown_steps: int = 8
    sticky: bool = True
    name: str = "session"

    def parts(self) -> tuple[object, ...]:
        return (self.base,)

    def decide(self, request: RouteRequest) -> Decision:
        inner = self.base.decide(request)
        policy, analysis = f"{self.name}/{inner.policy}", request.analysis
        why = self._why_full(request.session, inner, request.body)
        if why is None:
            return replace(inner, policy=policy, analysis=analysis)
        reason = f"{why}; {inner.policy} said {inner.tier}"
        return replace(
            inner, policy=policy, analysis=analysis, tier=Tier.FULL, reason=reason, propensity=1.0
        )

    def _why_full(
        self, state: SessionState | None, inner: Decision, body: Mapping[str, Any]
    ) -> str | None:
        """Why the session overrules ``inner`` with the full tier, or None when it does not."""
        if state is None:
            return None
        if state.last_failure_step is not None:
            since = state.steps - state.last_failure_step  # 1: the previous step
            if since <= self.cooldown_steps:
                return (f"session: a fast-tier step failed {since} step(s) ago "
                        f"(full for {self.cooldown_steps})")  # fmt: skip
        if (
            self.sticky
            and state.last_tier is Tier.FULL
            and inner.tier is Tier.FAST
            and in_tool_loop(body)
        ):
            return "session: the tool loop stays on the full tier"
        return None


@register("session")
def _build(params: Params) -> Policy:
    p = parse_params(SessionParams, params, "session")
    base = build_policy(p.base, p.base_params or {})
    return Session(base, p.cooldown_steps, p.sticky)
