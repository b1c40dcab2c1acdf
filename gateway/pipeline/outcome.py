"""The one immutable account of a served request, handed once to ``gateway.pipeline.finish``.

Everything metrics, routing's session state, token calibration, the recorder and the span
need is here; nothing reads the request's state anywhere else after it is built.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from gateway.pipeline.request import ParsedRequest, RequestIdentity
from gateway.pipeline.route import Routing
from gateway.recording.records import ChoiceCapture, RawJson
from gateway.upstream.dispatch import Attempts
from router import Tier

CLIENT_CLOSED = 499  # nginx's convention: the client went away before the answer


@dataclass(frozen=True, slots=True)
class Captured:
    """The answer as the engine produced it (token ids and log-probabilities included)."""

    prompt_token_ids: list[int] | RawJson | None
    choices: list[ChoiceCapture]
    model: str | None
    # the engine compacted this request's KV cache (kvplugin's record)
    kv_compaction: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class StepPlan:
    """A recorded request's step ids (one per choice; sent in ``x-gearshift-step-id``
    before the answer) and the wall-clock time it arrived."""

    ids: tuple[str, ...]
    created_at: float

    def header(self) -> str:
        return ",".join(self.ids)


@dataclass(frozen=True, slots=True)
class Served:
    """How dispatch served it: a frozen copy of ``Attempts``."""

    tier: Tier
    fallback: bool = False
    attempts: int = 0
    replica: str | None = None
    upstream_s: float = 0.0
    escalated: str | None = None  # why a fast-tier answer was re-run on the full tier

    @classmethod
    def of(cls, attempts: Attempts, escalated: str | None = None) -> Served:
        a = attempts
        return cls(a.tier, a.fallback, a.count, a.replica, a.upstream_s, escalated)


@dataclass(frozen=True, slots=True)
class Outcome:
    request: ParsedRequest
    routing: Routing
    served: Served
    status: int
    ended_at: float = field(default_factory=time.perf_counter)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reasons: tuple[str, ...] = ()
    response_model: str | None = None
    first_byte_at: float | None = None
    error: str | None = None
    stream_error: str | None = None  # the kind, when a stream failed after its first byte
    client_gone: bool = False
    captured: Captured | None = None  # recorded requests' answers
    answers: tuple[Any, ...] | None = None  # an unnamed chat session's answers: its chain links
    step: StepPlan | None = None

    @property
    def identity(self) -> RequestIdentity:
        return self.request.identity

    @property
    def tier(self) -> Tier:
        return self.served.tier

    @property
    def failed(self) -> bool:
        """The tier failed the request: a 5xx, or a stream it cut after the first byte."""
        return self.status >= 500 or (self.stream_error is not None and not self.client_gone)

    @property
    def route_reason(self) -> str:
        return route_reason(self.routing, self.served)

    def overhead_ms(self) -> float:
        """Time spent in the gateway itself: elapsed minus time waiting on replicas."""
        return max(0.0, self.identity.elapsed_ms(self.ended_at) - self.served.upstream_s * 1000)


def route_reason(routing: Routing, served: Served) -> str:
    reason = routing.reason
    if served.escalated:
        reason += f"; escalated to full: {served.escalated}"
    return f"{reason}; fallback to {served.tier}" if served.fallback else reason


def headers(
    request_id: str, routing: Routing, served: Served, step: StepPlan | None, overhead_ms: float
) -> dict[str, str]:
    """The headers every answer carries (the README's table)."""
    out = {
        "x-request-id": request_id,
        "x-gearshift-tier": str(served.tier),
        "x-gearshift-route-reason": route_reason(routing, served),
        "x-gearshift-overhead-ms": f"{overhead_ms:.3f}",
    }
    if step is not None:
        out["x-gearshift-step-id"] = step.header()
    if routing.context is not None:
        out["x-gearshift-context"] = routing.context.header()
    return out
