"""The request path's side of recording: one ``PendingStep`` per recorded request."""

from __future__ import annotations

import os
import time
from typing import Any

import orjson

from gateway.context import RequestContext
from gateway.recording import capture
from gateway.recording.records import ChoiceCapture, StepRecord
from router.types import Decision

MAX_CHOICES = 128  # vLLM's own limit on n is lower; this only bounds the ids we mint


class PendingStep:
    """Holds what the client sent and asked for while its request is served."""

    __slots__ = ("client_body", "step_ids", "stream", "wall", "wants")

    def __init__(self, ctx: RequestContext, body: dict[str, Any]) -> None:
        self.client_body = dict(body)  # before the capture fields are added
        self.wall = time.time()
        n = body.get("n")
        count = min(n, MAX_CHOICES) if isinstance(n, int) and n > 0 else 1
        self.step_ids = [os.urandom(16).hex() for _ in range(count)]  # 4x cheaper than uuid4
        self.wants = capture.prepare(ctx.endpoint, body)
        self.stream: capture.StreamCapture | None = (
            capture.StreamCapture(ctx.endpoint, self.wants) if body.get("stream") else None
        )

    def header(self) -> str:
        return ",".join(self.step_ids)

    def answer(
        self, ctx: RequestContext, data: dict[str, Any], raw: bytes
    ) -> tuple[bytes, StepRecord]:
        """Capture a whole 200 answer (``data`` is ``raw`` parsed); returns the body the
        client gets and the record."""
        rec = self.record(ctx, 200)
        rec.prompt_token_ids = data.get("prompt_token_ids")
        rec.choices = capture.choices_of(data, ctx.endpoint)
        rec.model = data.get("model") if isinstance(data.get("model"), str) else None
        if not (self.wants.logprobs and self.wants.token_ids):
            capture.strip(data, self.wants)
            raw = orjson.dumps(data)
        return raw, rec

    def streamed(self, ctx: RequestContext, status: int) -> StepRecord:
        rec = self.record(ctx, status)
        if self.stream is not None:
            rec.prompt_token_ids = self.stream.prompt_token_ids
            rec.choices = self.stream.choices()
            rec.model = self.stream.model
        return rec

    def record(
        self, ctx: RequestContext, status: int, choices: list[ChoiceCapture] | None = None
    ) -> StepRecord:
        now = time.perf_counter()
        d = ctx.decision
        return StepRecord(
            step_ids=self.step_ids,
            request_id=ctx.request_id,
            tenant=ctx.tenant or "default",
            api_key=ctx.api_key or "anonymous",
            endpoint=ctx.endpoint,
            request=self.client_body,
            external_session=ctx.session_id,
            task_id=ctx.task_id,
            group_id=ctx.group_id,
            created_at=self.wall,
            status=status,
            tier=str(ctx.tier) if ctx.tier is not None else None,
            replica=ctx.replica,
            policy=d.policy if d else "pinned",
            propensity=d.propensity if d else 1.0,
            route_reason=ctx.route_reason,
            features=route_features(d),
            fallback=ctx.fallback,
            escalated=ctx.escalated is not None,
            attempts=ctx.attempts,
            choices=choices or [],
            prompt_tokens=ctx.prompt_tokens,
            completion_tokens=ctx.completion_tokens,
            ttft_ms=(ctx.first_byte_at - ctx.t0) * 1000 if ctx.first_byte_at else None,
            duration_ms=(now - ctx.t0) * 1000,
            error=ctx.error,
        )


def route_features(d: Decision | None) -> dict[str, float] | None:
    """The decision's features, with the policy's score and threshold when it had them."""
    if d is None:
        return None
    out = dict(d.features)
    if d.score is not None:
        out["route_score"] = d.score
    if d.threshold is not None:
        out["route_threshold"] = d.threshold
    return out
