"""The recorder's view of an outcome: one ``StepRecord`` per recorded request."""

from __future__ import annotations

import os
import time

from gateway.pipeline.outcome import Captured, Outcome, StepPlan
from gateway.recording.records import ChainHashes, RawJson, StepRecord
from router import Decision

MAX_CHOICES = 128  # vLLM's own limit on n is lower; this only bounds the ids we mint


def plan_step(body: dict[str, object]) -> StepPlan:
    """Step ids for a request about to be served (one per choice it asks for)."""
    n = body.get("n")
    count = min(n, MAX_CHOICES) if isinstance(n, int) and n > 0 else 1
    return StepPlan(tuple(os.urandom(16).hex() for _ in range(count)), time.time())


def step_record(outcome: Outcome, step: StepPlan, chain: ChainHashes | None = None) -> StepRecord:
    who, d, served = outcome.identity, outcome.routing.decision, outcome.served
    captured = outcome.captured
    first = outcome.first_byte_at
    request: dict[str, object] | RawJson
    request = RawJson(outcome.request.raw) if outcome.request.raw else outcome.request.body
    reason = outcome.route_reason
    context = outcome.routing.context
    event = None
    if context is not None:  # record what the model saw, and say what was condensed
        request = {**outcome.request.body, "messages": context.messages}
        reason += f"; context: {context.header()}"
        event = context.event("responses" if who.context else "chat")
        # the next step links to this one through the client's history, but this step's
        # own history is not the last step's extended: prefix unknown, so it is not joined
        # to an earlier step as if it extended it (exports take it on its own)
        chain = ChainHashes(None, chain.continuations) if chain is not None else None
    return StepRecord(
        step_ids=list(step.ids),
        request_id=who.request_id,
        tenant=who.tenant,
        api_key=who.api_key,
        endpoint=who.endpoint,
        request=request,
        external_session=who.session_id,
        task_id=who.task_id,
        group_id=who.group_id,
        created_at=step.created_at,
        status=outcome.status,
        tier=str(served.tier),
        model=captured.model if captured is not None else None,
        replica=served.replica,
        policy=d.policy if d else "pinned",
        routing_version=outcome.routing.version,
        propensity=d.propensity if d else 1.0,
        route_reason=reason,
        features=kv_features(route_features(d), captured),
        fallback=served.fallback,
        escalated=served.escalated is not None,
        attempts=served.attempts,
        prompt_token_ids=captured.prompt_token_ids if captured is not None else None,
        choices=list(captured.choices) if captured is not None else [],
        prompt_tokens=outcome.prompt_tokens,
        completion_tokens=outcome.completion_tokens,
        ttft_ms=(first - who.t0) * 1000 if first is not None else None,
        duration_ms=who.elapsed_ms(outcome.ended_at),
        error=outcome.error,
        chain=chain,
        context=event,
    )


def kv_features(
    features: dict[str, float] | None, captured: Captured | None
) -> dict[str, float] | None:
    """``features`` with, when the engine compacted the request's KV cache (the answer's
    ``kv_transfer_params``, docs/kv-compaction.md), what it kept: the behaviour policy saw
    a compacted cache, and RL data must know it."""
    record = captured.kv_compaction if captured is not None else None
    if not record:
        return features
    kv = {
        f"kv_compaction_{name}": float(record[name])
        # cached_tokens: the cache's length when compacted (the prompt's, or more with the
        # watermark trigger: the tokens decoded before that saw the whole cache)
        for name in (
            "prompt_tokens",
            "kept_tokens",
            "evicted_tokens",
            "freed_blocks",
            "cached_tokens",
        )
        if isinstance(record.get(name), int | float)
    }
    if record.get("recomputed") is True:  # preempted later: recomputed with a full cache
        kv["kv_compaction_recomputed"] = 1.0
    return {**(features or {}), **kv}


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
