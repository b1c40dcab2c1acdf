"""Per-request bookkeeping that travels through serving, dispatch and relay."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from gateway.route_state import SessionKeys
from router.tokens import Counts
from router.types import Decision, Tier


@dataclass(slots=True)
class RequestContext:
    request_id: str
    t0: float  # perf_counter() when the request entered the process
    endpoint: str  # "chat" | "completions"
    requested_model: str
    tenant: str | None = None
    api_key: str | None = None
    session_id: str | None = None
    route_keys: SessionKeys | None = None  # the session as routing knows it (route_state)
    answers: list[Any] | None = None  # an unnamed session's answers: the chain's next links
    task_id: str | None = None
    group_id: str | None = None
    decision: Decision | None = None
    tier: Tier | None = None  # the tier that finally served it
    replica: str | None = None
    attempts: int = 0
    fallback: bool = False
    upstream_s: float = 0.0  # time spent waiting on replicas
    first_byte_at: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reasons: list[str] = field(default_factory=list)
    error: str | None = None
    escalated: str | None = None  # why a fast-tier answer was re-run on the full tier
    route_counts: Counts | None = None  # what the router sized the prompt by (router.tokens)
    route_tokens: tuple[int, bool] | None = None  # its prompt tokens, and whether anchored
    route_position: tuple[int, int] | None = None  # where the conversation ends (tokens.position)

    def overhead_ms(self, now: float | None = None) -> float:
        """Time spent in the gateway itself so far: elapsed minus time waiting on replicas."""
        end = time.perf_counter() if now is None else now
        return max(0.0, (end - self.t0 - self.upstream_s) * 1000.0)

    @property
    def route_reason(self) -> str:
        reason = self.decision.reason if self.decision else "pinned"
        if self.escalated:
            reason += f"; escalated to full: {self.escalated}"
        return f"{reason}; fallback to {self.tier}" if self.fallback else reason
